"""How long each prefill piece is: the `ChunkPolicy` Protocol and what it reads (`TickState`),
the fixed alone/contended policy, the ITL-budget policy with its cost model, calibration and
probe, and the arithmetic that cuts a prompt into pieces. Plain Python and numpy: no MLX.

`budget_policy` is the one place a budget policy is built (the fixed one is the resolver's record,
config_chunk.py), so the engine works with `ChunkPolicy` alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .calibration import Calibration
    from .policy import ChunkPolicy


def budget_policy(itl_budget_ms: int, calibration: "Calibration", ceiling: int, fuses_up_to: int) -> "ChunkPolicy":
    """The `--itl-budget-ms` policy, its cost model seeded by a calibration's ticks."""
    from .budget import BudgetChunkPolicy

    return BudgetChunkPolicy(itl_budget_ms, calibration.model(fuses_up_to=fuses_up_to), ceiling=ceiling)
