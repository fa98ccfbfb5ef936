"""The early warning (docs/report.md, the size ladder): the onset read from the off arm's max
attention logit at the warmup's end, before any run finishes. At each grid LR, the median over
seeds 0 and 1 (a user's few short runs) of the off arm's max attention logit at the first probe
at or after the warmup's end; the predicted onset is where that logit reaches the level L,
straight in log10 LR against log10 logit between the grid LRs either side."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

OFF = "none"
SEEDS = (0, 1)  # the short runs a user would train
LEVEL = 2.195  # log10 of L = 157, fixed from the archived points (docs/report.md)
PROBE = "max_attention_logit"


def probe_step(steps: int, warmup: int) -> int:
    """The first scheduled probe at or after the warmup's end (the ladder probes every sixth)."""
    every = steps // 6
    return -(-warmup // every) * every


def warmup_logits(per_run: pl.DataFrame, probe_steps: pl.DataFrame, step: int,
                  seeds: tuple[int, ...] = SEEDS) -> dict[float, float]:
    """Per grid LR: the seed median of the off arm's max attention logit (log10) at probe
    `step`. A run without that probe (it diverged before) counts as +inf."""
    runs = per_run.filter((pl.col("arm") == OFF) & pl.col("seed").is_in(seeds)
                          & pl.col("in_grid")).select("run", "lr")
    probes = probe_steps.filter((pl.col("name") == PROBE) & (pl.col("step") == step))
    at = dict(zip(probes["run"], probes["value"]))
    out: dict[float, list[float]] = {}
    for run, lr in zip(runs["run"], runs["lr"]):
        value = at.get(run)
        finite = value is not None and math.isfinite(value) and value > 0
        out.setdefault(float(lr), []).append(math.log10(value) if finite else math.inf)
    return {lr: float(np.median(v)) for lr, v in sorted(out.items())}


def crossing(logits: dict[float, float], level: float) -> tuple[float, str]:
    """(log10 LR where the logit first reaches `level` going up the grid, side): side "" for a
    crossing between two grid LRs, "below" when the smallest LR already reaches it, "above"
    when no LR does (the value then is that end of the grid)."""
    lrs = sorted(logits)
    if not lrs:
        return math.nan, ""
    if logits[lrs[0]] >= level:
        return math.log10(lrs[0]), "below"
    for lo, hi in zip(lrs, lrs[1:]):
        if logits[hi] >= level:
            y0, y1 = logits[lo], logits[hi]
            x0, x1 = math.log10(lo), math.log10(hi)
            if not math.isfinite(y1):
                return x1, ""  # diverged by then: the crossing is read at that LR
            return x0 + (level - y0) / (y1 - y0) * (x1 - x0), ""
    return math.log10(lrs[-1]), "above"


def logit_at(logits: dict[float, float], log10_lr: float) -> float | None:
    """The log10 logit straight between the grid LRs either side of log10_lr (None outside the
    grid or where a side diverged before the probe)."""
    lrs = sorted(logits)
    for lo, hi in zip(lrs, lrs[1:]):
        x0, x1 = math.log10(lo), math.log10(hi)
        if x0 <= log10_lr <= x1:
            y0, y1 = logits[lo], logits[hi]
            if not (math.isfinite(y0) and math.isfinite(y1)):
                return None
            return y0 + (log10_lr - x0) / (x1 - x0) * (y1 - y0)
    return None


def fitted_level(readings: list[tuple[dict[float, float], float]]) -> float:
    """L (log10 logit): the median over points of the logit at each point's measured onset
    (log10 LR); points whose onset lies outside their grid or by a diverged LR are skipped."""
    at = [v for logits, onset in readings if math.isfinite(onset)
          and (v := logit_at(logits, onset)) is not None]
    if not at:
        raise ValueError("no point has a measured onset inside its grid")
    return float(np.median(at))
