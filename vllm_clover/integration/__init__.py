"""The thin vLLM layer: everything in vllm_clover that imports vLLM's internals.

- `patches.py`   every change to vLLM internals, small and named, version-checked
- `model.py`     `CloverDraftModel`: the Clover network re-expressed with vLLM layers
- `proposer.py`  `CloverProposer`: drafts with it inside vLLM's V1 model runner
- `checks.py`    start-up validation of a Clover `speculative_config`
"""
