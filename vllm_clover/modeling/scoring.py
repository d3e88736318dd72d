"""The formats drafting scores head features against the draft rows in (fp32, bf16, fp16).

At decoding's batch sizes scoring z against the N x D draft rows reads far more bytes than it
computes, so drafting may score a smaller copy (``DraftRows``), possibly prepacked by a
serving layer's GEMM (``RowPacker``); training scores in the heads' dtype. Drafts only propose,
so the format changes acceptance, never the output. More: docs/design/network.md, "scoring.py".
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

    On x86 CPUs a bf16 F.linear with few rows of x takes a slow kernel, while w @ x^T with at
    least two columns takes the GEMM (AMX/AVX512-BF16). Elsewhere (fp32, GPU, 3-d x) it is
    F.linear itself."""
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 2:
        return F.linear(x, w)
    if x.shape[0] == 1:
        return (w @ torch.cat([x, x]).t())[:, :1].t()  # (1, N)
    return (w @ x.t()).t()  # (M, N), a transposed view


class DraftRows(NamedTuple):
    """W_lm's draft-vocabulary rows (N, D), in the format drafting scores them in; build with
    ``DraftRows.of``."""

    weight: torch.Tensor
    kernel: RowKernel | None = None  # float32 / bfloat16 rows prepacked by a RowPacker

    @classmethod
    def of(
        cls, rows: torch.Tensor, dtype: torch.dtype, packer: RowPacker | None = None
    ) -> DraftRows:
        """Rows (N, D) cast to `dtype`; float32 and bfloat16 rows are packed by `packer` when
        one is given (on CPU only, core/target_tables.py) and takes them."""
        weight = rows.to(dtype)
        if packer is None or dtype not in PACKED_DTYPES:
            return cls(weight)
        return cls(weight, kernel=packer(weight.contiguous()))

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def scores(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> scores z . W[j] (M, N) in the rows' dtype (``row_scores``,
        or the packed kernel); the row-wise argmax is the draft."""
        if self.kernel is not None:
            return self.kernel(z.to(self.weight.dtype).contiguous()).float()
        return row_scores(z.to(self.weight.dtype), self.weight)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (M, D) -> float32 logits z . W[j] (M, N), row-major: the row-wise
        max and logsumexp that follow run several times slower on a transposed view."""
        return self.scores(z).float().contiguous()
