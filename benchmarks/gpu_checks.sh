#!/usr/bin/env bash
# The GPU checks of the speed-and-scale work in one device call, sized to fit a 15-minute
# device budget with a machine start (about 9 minutes of checks). Run benchmarks/gpu_wheels.sh
# here first, then call the device tool with
#   command="bash benchmarks/gpu_checks.sh", carry=[".whl"], timeout_s=590
# Each check has its own time limit and its log in $OUT (here: gpu_out/); one that fails or
# runs out of time does not stop the next. DEVICE=cpu runs the same commands here (a dry run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
step() {  # NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log, say how it went
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name (limit ${limit} s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "   rc $?, $((SECONDS - start)) s"
  tail -n 6 "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda',
torch.cuda.is_available(), 'transformers', transformers.__version__)"; } | tee "$OUT/machine.log"
# the engine, trainer, algorithm and loop tests (staleness 0 == sync, resume == uninterrupted)
step tests "${TESTS_S:-240}" $PY -m pytest -q -p no:cacheprovider --maxfail=10 \
  --device "$DEVICE" -m "not ray" tests/engine tests/trainer tests/algo tests/test_loop.py
# peak memory of per-token log-probs at a 151,936 vocabulary, 8 x 1,024: chunked vs full
step logprob_memory "${MEMORY_S:-60}" $PY benchmarks/logprob_memory.py --device "$DEVICE" --batch 8
step engine_throughput "${ENGINE_S:-90}" $PY benchmarks/engine_throughput.py --device "$DEVICE" \
  --quick
step vs_trl "${VS_TRL_S:-150}" $PY benchmarks/vs_trl.py --device "$DEVICE" --seeds 1 \
  --steps 150 --eval-every 50 --only reroll,reroll_async,hand,trl
