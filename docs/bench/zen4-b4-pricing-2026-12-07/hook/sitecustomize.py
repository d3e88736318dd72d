"""BUDLOG=DIR: every GoodputController.observe_step's inputs to DIR/obs-<pid>.jsonl
(s seconds, n tokens, k, b batch, v verified [(drafted, accepted)]), for offline replay."""

import json
import os

DIR = os.environ.get("BUDLOG")
if DIR:
    from vllm_clover.budget.goodput import GoodputController

    _observe = GoodputController.observe_step

    def observe_step(self, seconds, tokens, k, batch, verified):
        out = getattr(GoodputController, "_budlog", None)
        if out is None:
            out = open(os.path.join(DIR, f"obs-{os.getpid()}.jsonl"), "a", buffering=1)
            GoodputController._budlog = out
            out.write(
                json.dumps(dict(max_k=self.config.max_k, max_tokens=self.config.max_tokens)) + "\n"
            )
        out.write(
            json.dumps(dict(s=round(seconds * 1e3, 3), n=tokens, k=k, b=batch, v=verified)) + "\n"
        )
        return _observe(self, seconds, tokens, k, batch, verified)

    GoodputController.observe_step = observe_step
