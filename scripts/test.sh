#!/usr/bin/env bash
# The test command: installs what is missing, then runs the whole test suite, on the CPU
# unless given --device cuda (with a CUDA build of torch 2.13.0 installed in .venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
