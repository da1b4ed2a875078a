#!/usr/bin/env bash
# The main job, from a fresh clone: install, build a tiny model, SFT warm start, evaluate,
# GRPO, evaluate again, and print held-out greedy accuracy before and after RL.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
CONFIG=${CONFIG:-configs/arithmetic.toml}
RUN=${RUN:-runs/quickstart-$(date +%Y%m%d-%H%M%S)}
R=.venv/bin/reroll
$R sft "$CONFIG" out_dir="$RUN/sft" "$@"
$R eval "$CONFIG" --checkpoint "$RUN/sft" --output "$RUN/eval_before.json" "$@"
$R train "$CONFIG" out_dir="$RUN/rl" init="$RUN/sft" "$@"
$R eval "$CONFIG" --checkpoint "$RUN/rl/checkpoints/$(cat "$RUN/rl/checkpoints/latest")" \
  --output "$RUN/eval_after.json" "$@"
$R report "$RUN/rl" > /dev/null
.venv/bin/python - "$RUN" "$start" <<'PY'
import json, sys, time
run, start = sys.argv[1], int(sys.argv[2])
b = json.load(open(f"{run}/eval_before.json")); a = json.load(open(f"{run}/eval_after.json"))
keys = ["eval/greedy_accuracy", "eval/pass@8", "eval/pass@1_sampled"]
keys += sorted(k for k in a if k.startswith("eval/env/"))  # episode diagnostics (tool use)
for k in keys:
    if k in b and k in a:
        print(f"{k:24s} before RL {b[k]:.3f}   after RL {a[k]:.3f}   ({100*(a[k]-b[k]):+.1f} points)")
print(f"run directory: {run}  (report: {run}/rl/report.html, {run}/rl/report.png)   total wall time {time.time()-start:.0f}s")
PY
