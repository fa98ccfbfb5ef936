"""What the ladder's archives say the calibrations' truth scatters by (docs/report.md): single
seeds' onsets about their point's, and the points' onsets about the warmup law (its lack of
fit)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .law import fit_law
from .study import ReportOptions
from .threshold import seed_onsets

LADDER = Path("results/ladder")


def onset_scatter(results: list) -> tuple[float, list[str]]:
    """Single seeds' onsets about their point's, pooled into one SD (a degree of freedom per
    point spent on its onset; a seed's onset beyond the LRs read counts at its bound), and a
    line per point. A seed's gaps carry its gap noise too, so the SD is an upper bound."""
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


def fitted(onset_sd: float | None, tau: float | None) -> tuple[float, float]:
    """The values given; each one not given (None) fitted from results/ladder (printed): the
    onset SD of single seeds and the straight law's lack of fit; 0 without the archives."""
    if onset_sd is not None and tau is not None:
        return onset_sd, tau
    if not LADDER.is_dir():
        return onset_sd or 0.0, tau or 0.0
    from .ladder import read_points

    options = ReportOptions()
    results, _ = read_points([LADDER], options, probes=False)
    sd, lines = onset_scatter(results)
    lack = fit_law(results, options, "straight")[1].get("lack_of_fit", math.nan)
    print(f"single seeds' onsets about their point's, from {LADDER}: SD {sd:.3f} decades ("
          + "; ".join(lines) + f"); the straight law's lack of fit: tau {lack:.3f} decades")
    return sd if onset_sd is None else onset_sd, lack if tau is None else tau
