"""Boundary refinement: bisect in log space between the largest stable and smallest diverged LR."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..config import TrainConfig
from ..run_folder import Outcome, RunFolder
from .config import Group, SweepConfig, run_config, three_significant


def next_midpoint(results: Mapping[float, bool | None], grid_lrs: Sequence[float], steps: int,
                  factor: float) -> float | None:
    """The bracket's geometric mean, or None once `steps` were tried or it is within `factor`."""
    if sum(1 for lr in results if lr not in set(grid_lrs)) >= steps:
        return None
    lo, hi = boundary(results)
    if lo is None or hi is None or hi / lo <= factor:
        return None
    mid = math.sqrt(lo * hi)
    rounded = three_significant(mid)
    mid = rounded if lo < rounded < hi else mid
    return None if mid in results else mid


def run_outcome(cfg: TrainConfig) -> Outcome:
    """The outcome cfg's run folder records (RunFolder.outcome)."""
    return RunFolder.of(cfg).outcome()


def group_state(sweep: SweepConfig, group: Group
                ) -> tuple[dict[float, bool | None], TrainConfig | None]:
    """One curve's (results so far, next run: None when done or waiting on a run)."""
    depth, arm, seed = group
    grid_lrs = sweep.grid_lrs()
    results: dict[float, bool | None] = {}
    for lr in grid_lrs:
        v = run_outcome(run_config(sweep, depth, lr, arm, seed))
        if v is Outcome.PENDING:
            return results, None
        results[lr] = v.stable
    while sweep.refine and (lr := next_midpoint(results, grid_lrs, sweep.refine_steps,
                                                sweep.refine_factor)) is not None:
        cfg = run_config(sweep, depth, lr, arm, seed)
        v = run_outcome(cfg)
        if v is not Outcome.PENDING:
            results[lr] = v.stable
        if v in (Outcome.PENDING, Outcome.FAILED):
            return results, cfg
    return results, None


def boundary(results: Mapping[float, bool | None]) -> tuple[float | None, float | None]:
    """(largest stable LR below the smallest diverged one, smallest diverged LR)."""
    diverged = [lr for lr, stable in results.items() if stable is False]
    hi = min(diverged) if diverged else None
    stable = [lr for lr, s in results.items() if s and (hi is None or lr < hi)]
    return (max(stable) if stable else None), hi
