#!/usr/bin/env bash
# Serve the reference target with Clover speculative decoding and chat with it over HTTP.
#
#   bash examples/serve_and_chat.sh            # PORT=8001 bash examples/serve_and_chat.sh
#
# Starts `vllm-clover serve` in the background (its own process group), waits for /health,
# runs examples/openai_chat_client.py against it, and stops the server (the whole group:
# API server, engine core and workers) on exit, also after an error or Ctrl-C.
# Needs the project's environment (`source .venv/bin/activate`). On a CUDA install,
# `vllm serve` works in place of `vllm-clover serve`; drop --dtype/--enforce-eager there.
set -euo pipefail

cd "$(dirname "$0")/.."
PORT=${PORT:-8000}
BASE_URL="http://127.0.0.1:${PORT}"
HEADS=checkpoints/smollm2-135m-instruct-clover
LOG=$(mktemp -t clover-serve.XXXXXX.log)
STARTUP_TIMEOUT_S=300

vllm-clover fetch smollm2-135m-instruct  # once; cached afterwards
if curl -s -o /dev/null "${BASE_URL}"; then
    echo "port ${PORT} is already in use; choose another: PORT=8001 bash $0" >&2
    exit 1
fi

echo "starting the server on ${BASE_URL} (log: ${LOG})"
setsid vllm-clover serve smollm2-135m-instruct \
    --host 127.0.0.1 --port "${PORT}" --dtype float32 --enforce-eager --max-model-len 2048 \
    --speculative-config "{\"method\": \"clover\", \"model\": \"${HEADS}\", \"num_speculative_tokens\": 4}" \
    >"${LOG}" 2>&1 &
SERVER_PID=$!  # setsid made it a process-group leader: its group id is its pid

stop_server() {
    if kill -0 "${SERVER_PID}" 2>/dev/null; then
        echo "stopping the server"
        kill -TERM -- "-${SERVER_PID}" 2>/dev/null || true
        for _ in $(seq 30); do
            kill -0 "${SERVER_PID}" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-${SERVER_PID}" 2>/dev/null || true
    fi
}
trap stop_server EXIT

started=$SECONDS
until curl -sf "${BASE_URL}/health" >/dev/null; do
    if ! kill -0 "${SERVER_PID}" 2>/dev/null || (( SECONDS - started > STARTUP_TIMEOUT_S )); then
        echo "the server did not come up; last lines of ${LOG}:" >&2
        tail -n 30 "${LOG}" >&2
        exit 1
    fi
    sleep 2
done
echo "server ready after $(( SECONDS - started )) s"

python examples/openai_chat_client.py --base-url "${BASE_URL}"
