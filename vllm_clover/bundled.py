"""The heads bundled with the repository (its checkpoints/ folder) for the reference target.

They live in the source checkout, not in the installed package: a checkout (the two README
commands use one) has them; elsewhere pass your own checkpoint folder.
"""

from __future__ import annotations

from pathlib import Path

from vllm_clover.assets.target import REFERENCE_TARGET

CHECKPOINTS_DIR = Path(__file__).resolve().parents[1] / "checkpoints"
# The reference Clover heads (Clover-1 without the Augmenting Block): small and quick, what
# most tests draft with.
REFERENCE_HEADS = CHECKPOINTS_DIR / f"{REFERENCE_TARGET}-clover"
# The paper's full configuration, Augmenting Block included (its own paged KV cache in vLLM).
FULL_CLOVER_HEADS = CHECKPOINTS_DIR / f"{REFERENCE_TARGET}-clover-full"
# Clover-2 with a gated block (docs/heads.md): the best heads, the demo's and bench's default.
CLOVER2_HEADS = CHECKPOINTS_DIR / f"{REFERENCE_TARGET}-clover2"
# Medusa-1 heads trained on the same data as the Clover-2 heads (the cards in checkpoints/
# give both), in vLLM's native Medusa format.
REFERENCE_MEDUSA = CHECKPOINTS_DIR / f"{REFERENCE_TARGET}-medusa"
