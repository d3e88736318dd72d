"""The formats drafting scores head features against the draft rows in (float, int8 per row).

A head step ends with ``argmax_j z . W_lm[j]`` over the N draft-vocabulary rows (N x D, e.g.
8192 x 576). At the batch sizes of decoding that product reads far more bytes (the rows)
than it computes, so drafting can score a copy of the rows in a smaller format:
``DraftRows`` holds them as float (fp32 / bf16 / fp16) or as int8 with one scale per row.
Only drafting uses it; training scores the rows in the heads' own dtype (``logits``).
Drafts only propose: vLLM's rejection sampler verifies them against the target, so the
scoring format changes how often drafts are accepted, never the output.

float32 and bfloat16 rows may also be handed to a ``RowPacker``: a serving layer's GEMM that
prepacks the rows once and then multiplies few rows of z fast (vLLM-CPU's oneDNN kernel,
cpu/gemm.py). The scores are the same products; only the kernel differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

INT8_MAX = 127.0

# z (M, D) -> z @ rows^T (M, N), both in the rows' dtype, with the rows packed in beforehand
RowKernel = Callable[[torch.Tensor], torch.Tensor]
# rows (N, D) float32 or bfloat16 -> its RowKernel, or None where the GEMM cannot take them
RowPacker = Callable[[torch.Tensor], RowKernel | None]
# The row dtypes a RowPacker is handed (``DraftRows.of``)
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def row_scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T: x (..., D), w (N, D) -> (..., N), as F.linear, with a faster bf16 CPU path.

    On x86 CPUs PyTorch sends a bf16 F.linear(x, w) with few rows of x to a kernel far slower
    than its bf16 GEMM; w @ x^T with at least two columns takes the GEMM (AMX/AVX512-BF16).
    The timings that chose this path are in docs/drafting-cost.md. Elsewhere (fp32, GPU,
    3-d x) it is F.linear itself.
    """
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 2:
        return F.linear(x, w)
    if x.shape[0] == 1:
        return (w @ torch.cat([x, x]).t())[:, :1].t()  # (1, N)
    return (w @ x.t()).t()  # (M, N), a transposed view


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: x (M, D) float -> (q (M, D) int8, scale (M,) float32).

    x[m] ~= q[m] * scale[m], the row's largest |value| mapped to 127. Example: the row
    [0.5, -1.0, 0.25] has scale 1/127 and q = [64, -127, 32] (0.5 * 127 = 63.5 rounds to 64).
    """
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp_min(1e-12) / INT8_MAX  # (M,)
    return torch.round(x / scale[:, None]).to(torch.int8), scale


class DraftRows(NamedTuple):
    """W_lm's draft-vocabulary rows in the format drafting scores them in.

    weight: (N, D), a float dtype, or int8 with ``scale`` (N,) float32 such that
    ``weight[j] * scale[j] ~= W_lm[j]`` (``quantize_int8``). Build with ``DraftRows.of``.
    """

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    kernel: RowKernel | None = None  # float32 / bfloat16 rows prepacked by a RowPacker

    @classmethod
    def of(
        cls, rows: torch.Tensor, dtype: torch.dtype, packer: RowPacker | None = None
    ) -> DraftRows:
        """Rows (N, D) in `dtype`: a cast, or int8 quantization for torch.int8; float32 and
        bfloat16 rows are packed by `packer` when one is given and takes them (the serving
        layer hands one over on CPU only, core/proposer.py)."""
        if dtype == torch.int8:
            return cls(*quantize_int8(rows))
        weight = rows.to(dtype)
        if packer is None or dtype not in PACKED_DTYPES:
            return cls(weight)
        return cls(weight, kernel=packer(weight.contiguous()))

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def scores(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> float scores (M, N) whose row-wise argmax is the draft.

        Float rows: z @ weight^T in the rows' dtype (``row_scores``, or the packed kernel
        where there is one). int8 rows: z is
        quantized per row as well and the product runs on int8 units (``torch._int_mm``,
        int32 sums, exact); each column is then multiplied by its row's scale. z's own scale
        is left out: it multiplies a whole row of scores by one positive number, which moves
        no argmax, so the result is z . W[j] up to that factor per row of z.
        """
        return self._products(z)[0]

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> float logits z . W[j] (M, N), z's int8 scale put back."""
        products, z_scale = self._products(z)
        products = products.float().contiguous()  # row-wise reductions follow: N contiguous
        return products if z_scale is None else products.mul_(z_scale[:, None])

    def _products(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scores (M, N), z's int8 scale (M,) or None for float rows); see ``scores``."""
        if self.kernel is not None:
            return self.kernel(z.to(self.weight.dtype).contiguous()).float(), None
        if self.scale is None:
            return row_scores(z.to(self.weight.dtype), self.weight), None
        q, z_scale = quantize_int8(z)  # (M, D), (M,)
        # (N, M) int32 sums -> (M, N) float, made contiguous before the row-wise reductions
        # that follow (max, logsumexp over N run 2-7x slower on the transposed view)
        products = torch._int_mm(self.weight, q.t()).t().contiguous().float()
        return products.mul_(self.scale), z_scale  # (M, N)
