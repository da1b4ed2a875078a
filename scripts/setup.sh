#!/usr/bin/env bash
# Creates .venv and installs reroll with its dev extras. torch is pinned to 2.13.0 first (the
# CPU build here; a CUDA build of 2.13.0 already in .venv is kept) and held there by a
# constraint, so no dependency can upgrade it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
echo "torch==2.13.0" > constraints.txt
.venv/bin/pip install -q -c constraints.txt -e ".[dev]" 2>&1 | grep -v "is ignored: it is neither" || true
.venv/bin/python -c "import torch, reroll; assert torch.__version__.startswith('2.13.0'), torch.__version__"
