"""What the ladder's archives say the calibrations' truth scatters by (docs/report.md): single
seeds' onsets about their point's, and the points' onsets about the warmup law (its lack of
fit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .law import fit_law
from .study import ReportOptions
from .threshold import seed_onsets

LADDER = Path("results/ladder")


@dataclass(frozen=True)
class Scatter:
    onset_sd: float  # decades: one seed's onset about its point's (pooled)
    tau: float  # decades: the points' onsets about the straight law beyond their seed noise
    lines: list[str]  # per point: how its seeds' onsets scatter


def onset_scatter(results: list) -> tuple[float, list[str]]:
    """Single seeds' onsets about their point's: per point with a finite onset, each seed's own
    onset (the point's reading on that seed's gaps alone; one that does not cross in the LRs
    read is kept at the bound it lies beyond, so its deviation is a lower bound) minus the
    point's; pooled into one SD, sqrt(sum of squared deviations / sum of (seeds - 1)), a degree
    of freedom per point spent on its onset. A seed's gaps carry its gap noise as well as its
    own onset, so the SD is an upper bound of the onsets' own scatter: simulated seeds that get
    it on top of the gap noise scatter more than real ones (conservative)."""
    squares, dof, lines = 0.0, 0, []
    for r in results:
        d = r.onset
        if d.gaps is None or not math.isfinite(d.point):
            continue
        own = seed_onsets(d, r.point.margin)
        censored = int((~np.isfinite(own)).sum())
        dev = np.clip(own, *d.bounds) - d.point
        squares += float(dev @ dev)
        dof += len(dev) - 1
        lines.append(f"{r.name}: {len(dev)} seeds, median |deviation| "
                     f"{np.median(np.abs(dev)):.3f}, SD {math.sqrt(dev @ dev / (len(dev) - 1)):.3f}"
                     f" decades" + (f" ({censored} at a bound)" if censored else ""))
    return (math.sqrt(squares / dof) if dof else math.nan), lines


def ladder_scatter(source: Path = LADDER) -> Scatter:
    """The onset SD of single seeds over every point `source` holds, and the straight law's
    lack of fit over its width-64 points."""
    from .ladder import read_points

    options = ReportOptions()
    results, _ = read_points([source], options, probes=False)
    sd, lines = onset_scatter(results)
    _, fit = fit_law(results, options, "straight")
    return Scatter(onset_sd=sd, tau=fit.get("lack_of_fit", math.nan), lines=lines)


def scatter_text(s: Scatter) -> str:
    return (f"single seeds' onsets about their point's, from {LADDER}: SD {s.onset_sd:.3f} "
            f"decades (" + "; ".join(s.lines) + f"); the straight law's lack of fit: tau "
            f"{s.tau:.3f} decades")


def fitted(onset_sd: float | None, tau: float | None) -> tuple[float, float]:
    """The values given; each one not given (None) fitted from results/ladder (printed), 0
    without it."""
    if onset_sd is not None and tau is not None:
        return onset_sd, tau
    if not LADDER.is_dir():
        return onset_sd or 0.0, tau or 0.0
    s = ladder_scatter()
    print(scatter_text(s))
    return s.onset_sd if onset_sd is None else onset_sd, s.tau if tau is None else tau
