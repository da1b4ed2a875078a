#!/usr/bin/env bash
# Run here, before a GPU session's device call: downloads into .whl/ (git-ignored) the wheels
# of what reroll needs that the lent GPU machines' image lacks (no network there; its python3
# is 3.12 with CUDA torch, transformers, pytest, pyarrow, numpy ... already in it). Ray is not
# carried (too large for the 64 MiB a call may carry): `benchmarks/gpu_checks.sh` leaves the
# Ray tests out. Versions are the ones this project's CPU environment runs. About 15 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
  plotly==7.1.0 tomli-w==1.2.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
du -sh .whl
