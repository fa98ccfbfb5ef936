"""The runs a sweep's results call for after its grid, replayed from summary.json: boundary
refinement (refine.py); per (depth, compared arm), bisection of the seed-mean crossing (the LR
bracket where the raw seed-mean gap, off minus on, first reaches min_gap from the top; not the
analysis's onset, an isotonic reading of the finer grid this leaves); adaptive seeds, up to max_seeds, for the (depth, LR) cells still open:
no one-sided t-test at DESIGN_ALPHA finds off worse, on worse, or the mean within +-min_gap
(this last, as the analysis's "no difference", only where no LR measured within NEAR_DECADES
has its seed-mean gap beyond the margin: near_beyond_margin)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..config import TrainConfig
from ..run_folder import RunFolder
from ..summaries import scored_loss
from .config import SweepConfig, run_config, three_significant
from .refine import group_state, run_outcome

OFF = "none"
DESIGN_ALPHA = 0.005  # the analysis adjusts 50-100 tests a family (BH at 0.05): 0.05 is too lax
# Seeds' own onsets scatter about their depth's by about 0.1 decades (docs/report.md), so within
# two such SDs of an LR whose seed-mean gap is beyond the margin a seed's gap is either ~0 or the
# whole effect: five seeds all short of their own onsets look flat while the seeds' mean is not.
NEAR_DECADES = 0.2


def near_beyond_margin(lr: float, means: dict[float, float], min_gap: float) -> bool:
    """Whether another LR measured within NEAR_DECADES of `lr` (either side) has its seed-mean
    gap (`means`: LR -> mean gap, off minus on) at or beyond +-min_gap: a cell there is never
    decided "no difference" (the analysis's H1 cells and the sweep's open cells alike)."""
    return any(other != lr and abs(math.log10(other / lr)) <= NEAR_DECADES + 1e-9
               and abs(mean) >= min_gap for other, mean in means.items())


def cell(sweep: SweepConfig, depth: int, lr: float, arm: str, seeds: Iterable[int]
         ) -> tuple[list[float], bool, list[TrainConfig]]:
    """(seed gaps off minus on, every pair failed to learn, runs not finished)."""
    gaps, failed, pending = [], True, []
    for seed in seeds:
        pair = [run_config(sweep, depth, lr, a, seed) for a in (OFF, arm)]
        out = []
        for cfg in pair:
            s = RunFolder.of(cfg).summary_record() if run_outcome(cfg).finished else {}
            init, final = s.get("init_loss"), s.get("final_val_loss")
            if not isinstance(init, (int, float)):
                break  # not finished (or no initial loss): no gap for this seed yet
            diverged = s.get("status") != "completed" or not isinstance(final, (int, float)) \
                or not math.isfinite(final)
            entropy = s.get("unigram_entropy")
            loss, degraded = scored_loss(math.nan if diverged else final, init, diverged,
                                         entropy if isinstance(entropy, (int, float)) else math.nan)
            out.append((float(loss), diverged or bool(degraded)))
        if len(out) < 2:
            pending += [c for c in pair if not run_outcome(c).finished]
            continue
        gaps.append(out[0][0] - out[1][0])
        failed = failed and out[0][1] and out[1][1]
    return gaps, failed and bool(gaps), pending


def is_open(gaps: list[float], min_gap: float, near: bool = False) -> bool:
    """Whether a cell's decision is still open (see the module docstring); `near`: the cell
    lies near an LR whose seed-mean gap is beyond the margin, so "no difference" cannot close
    it (near_beyond_margin)."""
    n = len(gaps)
    if n < 2:
        return True
    from scipy import stats  # here: importing it costs every sweep process ~1 s

    mean = sum(gaps) / n
    half = stats.t.ppf(1 - DESIGN_ALPHA, n - 1) * math.sqrt(
        sum((g - mean) ** 2 for g in gaps) / (n - 1) / n)
    lo, hi = mean - half, mean + half
    return not (lo > min_gap or hi < -min_gap or not near and -min_gap < lo and hi < min_gap)


def compared_arms(sweep: SweepConfig) -> list[str]:
    return [a for a in sweep.arms if a != OFF] if OFF in sweep.arms else []


def crossing_state(sweep: SweepConfig, depth: int, arm: str
                   ) -> tuple[dict[float, float], list[TrainConfig]]:
    """One (depth, arm)'s bisection of the seed-mean crossing: (seed-mean gap per LR, the runs
    to train next)."""
    means: dict[float, float] = {}
    for lr in sweep.grid_lrs():
        gaps, failed, pending = cell(sweep, depth, lr, arm, sweep.seeds)
        if pending:
            return means, []  # the grid first (the sweep trains it before any extra)
        if not failed and gaps:
            means[lr] = sum(gaps) / len(gaps)
    for _ in range(sweep.threshold_steps):
        mid = next_crossing_lr(means, sweep.min_gap, sweep.refine_factor)
        if mid is None:
            return means, []
        gaps, failed, pending = cell(sweep, depth, mid, arm, sweep.seeds)
        if pending:
            return means, pending
        if failed or not gaps:
            return means, []
        means[mid] = sum(gaps) / len(gaps)
    return means, []


def next_crossing_lr(means: dict[float, float], min_gap: float, factor: float) -> float | None:
    """The crossing bracket's geometric mean to three digits, or None once it is within
    `factor` (the simulated sweeps of analysis/simulate.py bisect by it too)."""
    bracket = crossing_bracket(means, min_gap)
    if bracket is None or bracket[1] / bracket[0] <= factor:
        return None
    mid = three_significant(math.sqrt(bracket[0] * bracket[1]))
    return mid if bracket[0] < mid < bracket[1] else None


def crossing_bracket(means: dict[float, float], min_gap: float) -> tuple[float, float] | None:
    """Where the seed-mean gap crosses min_gap, read from the top LR down: (the largest LR under
    min_gap, the LR above it), or None unless the top LR is at or over min_gap."""
    lrs = sorted(means)
    if not lrs or means[lrs[-1]] < min_gap:
        return None
    for lo, hi in zip(reversed(lrs[:-1]), reversed(lrs[1:])):
        if means[lo] < min_gap:
            return lo, hi
    return None


def extra_seeds(sweep: SweepConfig) -> list[int]:
    """The seeds adaptive sampling may add: after the largest base seed, up to max_seeds."""
    top = max(sweep.seeds)
    return list(range(top + 1, top + 1 + max(0, sweep.max_seeds - len(sweep.seeds))))


def finished_means(sweep: SweepConfig, depth: int, arm: str, lrs: list[float]
                   ) -> dict[float, float]:
    """Per LR measured (`lrs` and each boundary bisection's) where some pair learned, the
    seed-mean gap over every seed finished there, fixed or adaptive, as the analysis reads it."""
    measured = set(lrs)
    if sweep.refine:
        measured |= {lr for seed in sweep.seeds for a in (OFF, arm)
                     for lr in group_state(sweep, (depth, a, seed))[0]}
    out = {}
    for lr in sorted(measured):
        gaps, failed, _ = cell(sweep, depth, lr, arm, [*sweep.seeds, *extra_seeds(sweep)])
        if gaps and not failed:
            out[lr] = sum(gaps) / len(gaps)
    return out


def extra_runs(sweep: SweepConfig, groups: Iterable[tuple[int, str, int]]) -> list[TrainConfig]:
    if sweep.refine:
        boundary = [cfg for g in groups if (cfg := group_state(sweep, g)[1]) is not None]
        if boundary:
            return boundary
    out: list[TrainConfig] = []
    for depth in sweep.depth:
        for arm in compared_arms(sweep):
            means, pending = crossing_state(sweep, depth, arm) if sweep.refine else ({}, [])
            if pending:
                out += pending
                continue
            if sweep.max_seeds <= len(sweep.seeds):
                continue
            lrs = sorted(set(sweep.grid_lrs()) | set(means))
            seed_means = finished_means(sweep, depth, arm, lrs)
            for lr in lrs:  # adaptive seeds, cell by cell
                near = near_beyond_margin(lr, seed_means, sweep.min_gap)
                seeds = list(sweep.seeds)
                for extra in [*extra_seeds(sweep), None]:  # the next seed while the cell is open
                    gaps, failed, pending = cell(sweep, depth, lr, arm, seeds)
                    if pending:
                        out += pending
                        break
                    if failed or extra is None or not is_open(gaps, sweep.min_gap, near):
                        break
                    seeds.append(extra)
    unique = {c.run_id: c for c in out if not run_outcome(c).finished}
    return list(unique.values())
