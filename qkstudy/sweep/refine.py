"""Boundary refinement: bisect in log space between the largest stable and the smallest
diverged LR of each (depth, arm, seed) curve, from the results on disk."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from enum import Enum

from ..run_folder import RunFolder
from ..config import TrainConfig
from .config import Group, SweepConfig, run_config, three_significant

# --- boundary refinement ----------------------------------------------------------------------


def next_midpoint(results: Mapping[float, bool | None], grid_lrs: Sequence[float], steps: int,
                  factor: float) -> float | None:
    """The next LR to try, or None when the boundary is known well enough.

    `results` maps every LR tried so far to True (stable), False (diverged) or None (failed,
    no outcome). The bracket is [lo, hi]: hi = the smallest diverged LR, lo = the largest stable
    LR below it. The next point is their geometric mean (bisection in log LR), until `steps`
    points off the grid have been tried or hi / lo <= factor.
    """
    on_grid = set(grid_lrs)
    if sum(1 for lr in results if lr not in on_grid) >= steps:
        return None
    diverged = [lr for lr, stable in results.items() if stable is False]
    if not diverged:
        return None
    hi = min(diverged)
    stable_below = [lr for lr, stable in results.items() if stable and lr < hi]
    if not stable_below:
        return None
    lo = max(stable_below)
    if hi / lo <= factor:
        return None
    mid = math.sqrt(lo * hi)
    rounded = three_significant(mid)
    mid = rounded if lo < rounded < hi else mid
    return None if mid in results else mid


def bisect_boundary(grid_lrs: Sequence[float], is_stable: Callable[[float], bool | None],
                    steps: int, factor: float) -> dict[float, bool | None]:
    """Run the whole refinement against a stability oracle; returns every LR asked, in order."""
    results = {lr: is_stable(lr) for lr in grid_lrs}
    while (lr := next_midpoint(results, grid_lrs, steps, factor)) is not None:
        results[lr] = is_stable(lr)
    return results


class Outcome(Enum):
    """What the runs tree holds for one run."""

    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"  # trained and raised: no outcome on stability; the next sweep retries it
    PENDING = "pending"  # no result yet

    @property
    def stable(self) -> bool | None:
        """True (completed) or False (diverged) for a refinement; None without an outcome."""
        return {Outcome.COMPLETED: True, Outcome.DIVERGED: False}.get(self)

    @property
    def finished(self) -> bool:
        return self in (Outcome.COMPLETED, Outcome.DIVERGED)


def run_outcome(cfg: TrainConfig) -> Outcome:
    """The run's outcome from its summary.json (PENDING when there is none or it is unreadable)."""
    summary = RunFolder.of(cfg).summary_record()
    status = summary.get("status") if isinstance(summary, dict) else None
    try:
        return Outcome(status)
    except ValueError:
        return Outcome.PENDING


def group_state(sweep: SweepConfig, group: Group) -> tuple[dict[float, bool | None], TrainConfig | None]:
    """Replay a group's refinement from the results on disk.

    Returns (results so far, the next run to train or None). The next run is None when the
    group is done or waits on a run without a result (for example one held by another process).
    A refinement run that failed is the next run again (its LR in the results, as None): the
    sweep retries it as it retries a failed grid run, once an invocation (run.execute's
    `attempted`), and not at all when it killed its process (run.run_one).
    """
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
        if v is Outcome.PENDING:
            return results, cfg
        results[lr] = v.stable
        if v is Outcome.FAILED:
            return results, cfg
    return results, None


def boundary(results: Mapping[float, bool | None]) -> tuple[float | None, float | None]:
    """(largest stable LR below the smallest diverged one, smallest diverged LR)."""
    diverged = [lr for lr, stable in results.items() if stable is False]
    hi = min(diverged) if diverged else None
    stable = [lr for lr, s in results.items() if s and (hi is None or lr < hi)]
    return (max(stable) if stable else None), hi
