#!/bin/sh
# One GPU check in at most 9 minutes on one H100/H200: installs what the GPU image lacks from wheels carried
# beside the checkout (wheels/), runs every test with a CUDA path, benchmarks/trl_vs_capo.py at the reasoning testbed's
# shape with TRL on the GPU too, and `capo demo --task word_problems`; writes OUT/summary.json (default
# runs/gpu-check). `--dry-run` does the CPU parts in seconds (make test runs it). Details: scripts/gpu_check.py and
# docs/engines.md ("On a GPU").
#
#   sh scripts/gpu-check.sh [--dry-run] [--out DIR] [--wheels DIR] [--budget-s SECONDS]
#
# The wheels, fetched once on a machine with PyPI, in the checkout's root (about 6 MB):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --dest wheels trl==1.16.0 datasets==5.2.0 \
#       dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
#       antlr4-python3-runtime==4.13.2 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
