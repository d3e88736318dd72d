"""The target's LM head, attached to the heads' tables when vLLM loads it.

The heads score their drafts with that LM head and embed the previous token with its rows, so
`attach_target_tables` (called from `CloverProposer._maybe_share_lm_head`) checks it is the
one they were trained for (shape and fingerprint, ``modeling/checkpoint.py``), attaches it
without a copy, and picks the format drafting scores its rows in."""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import tensor_model_parallel_all_gather
from vllm.logger import init_logger

from vllm_clover.core.checks import target_lm_head
from vllm_clover.cpu.gemm import bf16_products, onednn_row_packer, packed_dtypes
from vllm_clover.cpu.isa import cpu_flags, cpu_model, isa_family
from vllm_clover.modeling.checkpoint import CloverCheckpointError, check_target_fits
from vllm_clover.modeling.tables import DRAFT_DTYPE_ENV, draft_dtype_setting
from vllm_clover.modeling.vocab_parallel import VocabParallelTables

logger = init_logger("vllm.clover.proposer")


def attach_target_tables(model, target_language_model: nn.Module, heads_path: str, vllm_config):
    """Attach the target's LM head to `model`'s tables (a CloverDraftModel's), after checking
    that it is the one the heads at `heads_path` were trained for, and pick the format
    drafting scores its rows in. Under tensor parallelism each rank attaches its own rows (no
    copy); the full LM head is gathered once, here, for the fingerprint check only."""
    config, tables = model.config, model.tables
    lm_head = target_lm_head(target_language_model)
    vocab = config.vocab_size
    target = vllm_config.model_config.model
    if isinstance(tables, VocabParallelTables):
        full_lm_head = tensor_model_parallel_all_gather(lm_head.weight, dim=0)[:vocab]
        _check_fits(config, heads_path, target, full_lm_head)
        del full_lm_head
        shard = lm_head.shard_indices  # this rank's real ids, vLLM's padding dropped
        rows = slice(0, shard.num_org_elements)
        tables.attach_shard(lm_head.weight[rows], shard.org_vocab_start_index)
    else:
        head_rows = lm_head.weight[:vocab]
        _check_fits(config, heads_path, target, head_rows)
        tables.attach(head_rows)
    setting = draft_dtype_setting()
    on_cpu = lm_head.weight.device.type == "cpu"
    packer = onednn_row_packer() if on_cpu else None
    scoring = tables.choose_scoring(setting, packer, packed_dtypes() if on_cpu else ())
    logger.info("%s", drafting_line(scoring, packer is not None, lm_head.weight, setting))


def drafting_line(scoring: torch.dtype, packed: bool, lm_head: torch.Tensor, setting: str) -> str:
    """The one start-up line that says how this engine drafts: the draft rows' format and,
    on a CPU, the CPU, its family and what multiplies the bf16 products (example:
    docs/design/drafting.md, "The target's tables").
    """
    dtype = str(lm_head.dtype).removeprefix("torch.")
    rows = str(scoring).removeprefix("torch.")
    where, products = "", ""
    if lm_head.device.type == "cpu":
        where = f" on {cpu_model()} ({isa_family(cpu_flags())})"
        if packed and scoring == torch.float32:
            rows += " (oneDNN, packed)"
        elif packed and scoring == torch.bfloat16:
            rows += f" ({bf16_products()})"
        if lm_head.dtype == torch.bfloat16:
            products = f", multiplied by {bf16_products()}"
    return (
        f"Clover drafts{where}: draft rows in {rows}; head network and target in "
        f"{dtype}{products} ({DRAFT_DTYPE_ENV}={setting})"
    )


def _check_fits(config, heads_path: str, target: str, lm_head: torch.Tensor) -> None:
    try:
        # A served path never equals the recorded target name: the fingerprint decides.
        check_target_fits(config, heads_path, lm_head)
    except CloverCheckpointError:
        logger.error("Clover checkpoint %s does not fit target %s", heads_path, target)
        raise
