#!/bin/sh
# Create the separate virtualenv for capo's verl adapter: .venv-verl next to the main .venv.
#
# Why a second environment: verl 0.9.1 pins transformers < 5.11, while TRL 1.16 (the main .venv) works with the
# newest transformers 5.x. The two cannot share one environment.
#
# Usage:  sh scripts/verl-env.sh            (idempotent: does nothing if the stamp file is newer than this script)
#         VERL_VENV=/path/to/venv PYTHON=python3.11 sh scripts/verl-env.sh
#
# What it installs (measured on a CPU machine: ~70-100 s, ~1.9 GB, mostly ray and its dependencies):
#   1. torch==2.13.0 first, pinned: a bare `torch` requirement (verl declares one) would pull a multi-GB CUDA build
#      on CPU machines. On a GPU cluster, replace this line with the CUDA build your cluster uses.
#   2. verl==0.9.1 with its declared dependencies (ray, tensordict, transformers<5.11, hydra-core, ...).
#   3. capo itself, editable and WITHOUT dependencies (so pip never upgrades verl's transformers), then capo's
#      light runtime dependencies that verl does not already bring.
#   4. pytest (+ pytest-timeout) to run tests/adapters/test_verl*.py, and the modules verl's trainers import
#      without declaring them (cachetools, uvicorn, fastapi; transferqueue for the v1 trainer).
# The inference engines verl needs for real training (vLLM or SGLang, flash-attn) are not installed: they have
# no CPU wheels. Install them on the GPU cluster, matching its CUDA version.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VERL_VENV:-$ROOT/.venv-verl}
PYTHON=${PYTHON:-python3}
STAMP=$VENV/.capo-verl-installed

if [ -f "$STAMP" ] && [ "$STAMP" -nt "$0" ]; then
    echo "verl environment already set up: $VENV"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
"$PIP" install --quiet torch==2.13.0
"$PIP" install --quiet 'verl==0.9.1'
"$PIP" install --quiet --no-deps -e "$ROOT"
# capo's own light dependencies (those of pyproject.toml minus torch/transformers/accelerate/datasets, which
# verl's resolution already fixed; installing them again could only change versions verl chose).
"$PIP" install --quiet 'math-verify>=0.8' 'pyyaml>=6.0' 'rich>=13.0' 'numpy>=1.26' 'pytest>=8' 'pytest-timeout>=2.3'
# Imported by verl.trainer.ppo.ray_trainer but not declared by verl 0.9.1 (they usually arrive with vLLM/SGLang).
# torch is repeated so pip cannot move it off the pinned CPU build. (Do not add torchvision from PyPI: its wheel
# does not match the CPU torch build and breaks transformers' imports.)
"$PIP" install --quiet cachetools uvicorn fastapi torch==2.13.0
# verl's default v1 trainer (verl.trainer.ppo.v1) imports TransferQueue, which verl 0.9.1 does not declare; capo's
# tests run its advantage step (PPOTrainer._compute_advantage) on CPU. Brings msgspec and pyzmq, nothing else.
"$PIP" install --quiet 'transferqueue==0.1.11' torch==2.13.0
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
for name in ("torch", "transformers", "verl", "ray", "capo"):
    print(f"{name:13s} {md.version(name)}")
EOF
touch "$STAMP"
echo "verl environment ready: $VENV  (run: $VENV/bin/python -m pytest tests/adapters/test_verl*.py)"
