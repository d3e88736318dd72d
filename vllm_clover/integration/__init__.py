"""The thin vLLM layer: the only part of vllm_clover that reaches into vLLM's internals.

- `patches/`     the ledger of every vLLM internal we patch, override or rely on, and the patches
- `model.py`     `CloverDraftModel`: vLLM layers for the Augmenting Block + the shared head loop
- `proposer.py`  `CloverProposer`: drafts with it inside vLLM's V1 model runner
- `checks.py`    start-up validation of a Clover `speculative_config`
"""
