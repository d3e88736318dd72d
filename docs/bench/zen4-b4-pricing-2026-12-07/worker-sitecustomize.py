"""The step log of ../zen4-bf16-2026-12-06/steplog/sitecustomize.py (run first), and the
runner's calls timed in whichever process runs the model: STEPLOG=DIR writes
DIR/worker-<pid>.jsonl, one line per call (f name, t start, ms wall, cpu thread CPU ms).
Put this folder on PYTHONPATH as sitecustomize (copy or link the file under that name)."""

import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(HERE, "..", "zen4-bf16-2026-12-06", "steplog", "sitecustomize.py"))
DIR = os.environ.get("STEPLOG")


def _patch_runner(module):
    Runner = module.GPUModelRunner
    out = open(os.path.join(DIR, f"worker-{os.getpid()}.jsonl"), "a", buffering=1)
    for name in (
        "execute_model",
        "sample_tokens",
        "propose_draft_token_ids",
        "take_draft_token_ids",
    ):
        original = getattr(Runner, name, None)
        if original is None:
            continue

        def timed(self, *a, __original=original, __name=name, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            result = __original(self, *a, **k)
            out.write(
                json.dumps(
                    dict(
                        f=__name,
                        t=round(t0, 4),
                        ms=round((time.perf_counter() - t0) * 1e3, 3),
                        cpu=round((time.thread_time() - c0) * 1e3, 3),
                    )
                )
                + "\n"
            )
            return result

        setattr(Runner, name, timed)


class _RunnerFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.v1.worker.gpu_model_runner":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch_runner(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if DIR:
    sys.meta_path.insert(0, _RunnerFinder())
