"""The `clover` plugin is loaded in the processes that run the model, and only when allowed."""

import json
import re

import pytest

from helpers import run_python

pytestmark = pytest.mark.engine

# Starts a real engine (multiprocessing on, as `vllm serve` runs it) and asks every worker
# whether vllm-clover's plugin module was loaded in its process.
PROBE = """
import json, os, sys
from vllm_clover.engine import start_llm

def probe(worker):
    return {"pid": os.getpid(), "plugin_loaded": "vllm_clover.plugin" in sys.modules}

if __name__ == "__main__":
    llm = start_llm(sys.argv[1] if len(sys.argv) > 1 else %r, max_model_len=512)
    print("PROBE " + json.dumps({"main_pid": os.getpid(), "workers": llm.collective_rpc(probe)}))
"""

ACTIVE_LINE = re.compile(
    r"\((\w+?)(?:_DP\d+)?(?:-\d+)? pid=(\d+)\).*vllm-clover [\d.]+ active \(vLLM 0\.32\.0"
)


def _run_probe(reference_target, plugins: str | None) -> tuple[dict, str]:
    env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # collective_rpc with a function
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    output = run_python(PROBE % str(reference_target), env=env)
    (line,) = [text for text in output.splitlines() if text.startswith("PROBE ")]
    return json.loads(line[len("PROBE ") :]), output


def test_plugin_is_active_in_engine_core_and_worker_processes(reference_target):
    probe, output = _run_probe(reference_target, plugins=None)
    (worker,) = probe["workers"]
    assert worker["plugin_loaded"], "plugin module not imported in the worker process"
    assert worker["pid"] != probe["main_pid"], "expected the model to run in a child process"
    active = {(name, int(pid)) for name, pid in ACTIVE_LINE.findall(output)}
    assert {"EngineCore", "VllmWorker"} <= {name for name, _ in active}, output[-3000:]
    assert any(pid == worker["pid"] for _, pid in active), (active, worker)


def test_empty_vllm_plugins_disables_it(reference_target):
    probe, output = _run_probe(reference_target, plugins="")
    (worker,) = probe["workers"]
    assert not worker["plugin_loaded"]
    assert not ACTIVE_LINE.search(output) and "vllm-clover 0.1" not in output
