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

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from vllm.logger import init_logger

from vllm_clover.modeling.head_loop import AttentionDecoder, LinearHead
from vllm_clover.modeling.layer_fusion import LayerFusion
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
    """Run the linear products of these (pure-PyTorch) modules on the packed GEMM: each
    ``nn.Linear``'s forward, each ``LinearHead``'s ``project``, and the products that sum or
    stack several layers' outputs as one (``LayerFusion.project``, the decoder's
    ``key_value``: one kernel over their concatenated weights, whose own layers are then
    not packed apart), with the weights as they are now (call it after loading them; serving
    never changes them after). Returns how many were packed: 0 where the build has no oneDNN
    or the weights are not on the CPU.

    Example: the shipped Clover-2 heads pack 10 products: the layer fusion's one (target
    layers 2, 15, 27), the next-token fusion's and the decoder's q and [k | v], and the four
    heads' projections.
    """
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False):
        return 0
    count = 0
    for module, slot in linear_slots(*modules):
        weight, bias = _PRODUCTS[type(module)].weights(module)
        if weight.device.type != "cpu":
            continue
        kernel = _packed(weight, bias)
        if kernel is not None:
            setattr(module, slot, kernel)  # an instance attribute, ahead of the class's method
            count += 1
    return count


class _Product(NamedTuple):
    """How a module type computes x @ W^T + b: the method that does (replaced when packed),
    its (W, b), and the child layers it runs inside that one product (then not packed on
    their own)."""

    slot: str
    weights: Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor | None]]
    fused_children: tuple[str, ...] = ()


def _own(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _concatenated(module: nn.Module) -> tuple[torch.Tensor, None]:
    return module.projection_weight(), None


_PRODUCTS: dict[type, _Product] = {
    nn.Linear: _Product("forward", _own),
    LinearHead: _Product("project", _own),
    LayerFusion: _Product("project", _concatenated, ("projs",)),
    AttentionDecoder: _Product("key_value", _concatenated, ("k_proj", "v_proj")),
}


def linear_slots(*modules: nn.Module | None) -> list[tuple[nn.Module, str]]:
    """Every linear product inside these modules, with the method ``pack_linears`` replaces
    in it ("forward" of an ``nn.Linear``, "project" of a ``LinearHead`` or a
    ``LayerFusion``, "key_value" of an ``AttentionDecoder``); a product is packed when that
    method is an attribute of the instance (``slot in vars(module)``). Layers inside a
    fused product are not listed on their own.

    Example: an ``AttentionDecoder`` lists as itself ("key_value") and its q_proj
    ("forward"), not its k_proj and v_proj.
    """
    found = [m for root in modules if root is not None for m in root.modules()]
    products = [m for m in found if type(m) in _PRODUCTS]
    inside = {
        id(layer)
        for m in products
        for name in _PRODUCTS[type(m)].fused_children
        for layer in getattr(m, name).modules()
    }
    return [(m, _PRODUCTS[type(m)].slot) for m in products if id(m) not in inside]
