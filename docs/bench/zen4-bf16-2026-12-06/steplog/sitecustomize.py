"""Per-step log of any vLLM engine core (vanilla or not), in whichever process runs it:
STEPLOG=DIR writes DIR/steps-<pid>.jsonl, one line per EngineCore.step and post_step:
t (start, s), step (ms), post (ms), n (tokens scheduled), b (requests), spec (draft tokens
scheduled), new (requests new this step), w (requests waiting when it was scheduled)."""

import importlib.abc
import importlib.util
import json
import os
import sys
import time

DIR = os.environ.get("STEPLOG")


def _patch_core(module):
    EngineCore = module.EngineCore
    step, post = EngineCore.step, EngineCore.post_step
    out = open(os.path.join(DIR, f"steps-{os.getpid()}.jsonl"), "a", buffering=1)
    last = {}

    def timed_step(self):
        t0 = time.perf_counter()
        result = step(self)
        t1 = time.perf_counter()
        so = last.pop("so", None)
        if so is not None and so.total_num_scheduled_tokens > 0:
            last["row"] = dict(
                t=round(t0, 4),
                step=round((t1 - t0) * 1e3, 2),
                n=so.total_num_scheduled_tokens,
                b=len(so.num_scheduled_tokens),
                spec=sum(len(v) for v in so.scheduled_spec_decode_tokens.values()),
                new=len(so.scheduled_new_reqs),
                w=last.get("w", 0),
            )
        return result

    def timed_post(self, model_executed):
        t0 = time.perf_counter()
        post(self, model_executed)
        row = last.pop("row", None)
        if row is not None:
            row["post"] = round((time.perf_counter() - t0) * 1e3, 2)
            out.write(json.dumps(row) + "\n")

    EngineCore.step, EngineCore.post_step = timed_step, timed_post
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule = Scheduler.schedule

    def logged_schedule(self, *a, **k):
        so = schedule(self, *a, **k)
        last["so"] = so
        last["w"] = len(self.waiting)
        return so

    Scheduler.schedule = logged_schedule


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.v1.engine.core":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch_core(module)

        loader.exec_module = exec_and_patch
        return spec


if DIR:
    sys.meta_path.insert(0, _Finder())
