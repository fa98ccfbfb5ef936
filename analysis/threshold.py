"""Where QK-norm becomes necessary: per depth and compared arm, the instability onset (the LR
where the isotonic fit of the seed-mean gap reaches min_gap, read upward from its valley up to
the largest LR at which every QK-norm run trained), its widened whole-seed interval, and the
tested rule beside it (docs/report.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from . import stats as S
from .metrics import Options, paired_gaps

BELOW, ABOVE = "below the LRs tested", "above the LRs where QK-norm trained"


def threshold_from_fit(log_lrs: np.ndarray, fit: np.ndarray, margin: float) -> np.ndarray:
    """log10 LR where each fit row first reaches `margin` (-inf: at once, +inf: never)."""
    fit = np.atleast_2d(fit)
    valid = ~np.isnan(fit)
    reached = valid & (np.where(valid, fit, -np.inf) >= margin)
    cols = np.arange(fit.shape[1])
    last = np.maximum.accumulate(np.where(valid, cols, -1), axis=1)  # last LR with data
    first = np.argmax(reached, axis=1)
    rows = np.arange(fit.shape[0])
    k = np.where(first > 0, last[rows, np.maximum(first - 1, 0)], -1)
    out = np.where(reached.any(axis=1), -np.inf, np.inf)
    inside = reached.any(axis=1) & (k >= 0)
    r, i, kk = rows[inside], first[inside], k[inside]
    lo, hi = fit[r, kk], fit[r, i]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(hi > lo, (margin - lo) / (hi - lo), 1.0)
    out[inside] = log_lrs[kk] + np.clip(t, 0.0, 1.0) * (log_lrs[i] - log_lrs[kk])
    return out


@dataclass
class DepthDraws:
    """One (compared arm, depth): the LRs the onset is read over, the onset (log10 LR; -inf or
    +inf when the fit crosses at once or never there), its draws (a draw that does not cross is
    kept, censored at the bound it lies beyond), the seeds and their (seeds, LRs) gaps."""

    lrs: list[float]
    point: float
    draws: np.ndarray
    seeds: int
    gaps: np.ndarray | None = None

    @property
    def bounds(self) -> tuple[float, float]:
        """The range (log10 LR) an onset can be read in: the smallest LR measured to the largest
        at which every QK-norm run trained."""
        return math.log10(self.lrs[0]), math.log10(self.lrs[-1])


def above_valley(means: np.ndarray) -> np.ndarray:
    """Each row of gaps (rows x LRs) with NaN below its minimum."""
    means = np.atleast_2d(means)
    window = np.where(np.isnan(means), np.inf, means)
    has = np.isfinite(window).any(axis=1)
    valley = np.where(has, np.argmin(window, axis=1), 0)
    below = np.arange(means.shape[1])[None, :] < valley[:, None]
    return np.where(below, np.nan, means)


def _fit(means: np.ndarray, counts: np.ndarray) -> np.ndarray:
    kept = above_valley(means)
    return np.where(np.isnan(kept), np.nan, S.isotonic(kept, counts))


def depth_draws(values: np.ndarray, lrs: list[float], draws: np.ndarray, margin: float,
                trained_up_to: float | None = None) -> DepthDraws:
    """The onset of one depth's (seeds, LRs) gaps and under each whole-seed draw, read only over
    the LRs up to `trained_up_to` (the largest up to which every QK-norm run trained)."""
    read = len(lrs) if trained_up_to is None else max(sum(lr <= trained_up_to for lr in lrs), 1)
    lrs, values = lrs[:read], values[:, :read]
    log_lrs = np.log10(lrs)
    n = (~np.isnan(values)).sum(axis=0)
    means = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
    fit = _fit(means[None], n.astype(float))
    boot_means, counts = S.seed_bootstrap(values, draws)
    crossings = threshold_from_fit(log_lrs, _fit(boot_means, counts.astype(float)), margin)
    return DepthDraws(lrs=lrs, point=float(threshold_from_fit(log_lrs, fit, margin)[0]),
                      draws=np.clip(crossings, log_lrs[0], log_lrs[-1]), seeds=int(n.max()),
                      gaps=values)


def read_onset(cells: pl.DataFrame, gaps: pl.DataFrame, seeds: list[int], draws: np.ndarray,
               margin: float) -> DepthDraws:
    """The onset of one (compared arm, depth) from its H1 cells and paired gaps: read over its
    informative LRs up to the largest up to which every QK-norm run trained."""
    lrs = sorted(cells.filter("informative")["lr"].to_list())
    values = gap_matrix(gaps.filter(pl.col("lr").is_in(lrs)), seeds, lrs)
    return depth_draws(values, lrs, draws, margin, tested_rule(cells)["trained_up_to"])


def seed_onsets(d: DepthDraws, margin: float) -> np.ndarray:
    """Each seed's own onset (log10 LR; -inf or +inf where its fit crosses at once or never):
    the reading of `d` on one row of its gaps alone."""
    v = d.gaps
    return threshold_from_fit(np.log10(d.lrs), _fit(v, (~np.isnan(v)).astype(float)), margin)


def widened(d: DepthDraws, k: float) -> np.ndarray:
    """The draws moved away from a finite estimate by the factor k, kept inside the bounds."""
    if k == 1 or not math.isfinite(d.point):
        return d.draws
    return np.clip(d.point + k * (d.draws - d.point), *d.bounds)


def threshold_interval(d: DepthDraws, k: float) -> tuple[float, float]:
    """The onset's 95% interval (log10) from the widened draws, never inside the LRs beside it;
    an end the draws put at a bound of the LRs read is open (-inf or +inf: beyond it)."""
    lo, hi = S.percentile_interval(widened(d, k))
    low, high = d.bounds
    ends = [-math.inf if v <= low else math.inf if v >= high else None for v in (lo, hi)]
    if math.isfinite(d.point):
        logs = np.log10(d.lrs)
        below, above = logs[logs <= d.point], logs[logs >= d.point]
        if below.size:
            lo = min(lo, float(below.max()))
        if above.size:
            hi = max(hi, float(above.min()))
    return ends[0] if ends[0] is not None else lo, ends[1] if ends[1] is not None else hi


def gap_matrix(gaps: pl.DataFrame, seeds: list[int], lrs: list[float]) -> np.ndarray:
    """(seeds, LRs) gaps, NaN where a seed has no pair at an LR."""
    out = np.full((len(seeds), len(lrs)), np.nan)
    row = {s: i for i, s in enumerate(seeds)}
    col = {lr: j for j, lr in enumerate(lrs)}
    for s, lr, g in gaps.select("seed", "lr", "gap").iter_rows():
        out[row[s], col[lr]] = g
    return out


def threshold_draws(points: pl.DataFrame, cells: pl.DataFrame, options: Options
                    ) -> dict[tuple[str, int], DepthDraws]:
    """Per (compared_arm, depth) with >= 2 paired seeds: the onset and its draws."""
    gaps = paired_gaps(points, options)
    out: dict[tuple[str, int], DepthDraws] = {}
    informative = cells.filter(pl.col("informative"))
    for on in sorted(set(informative["compared_arm"].to_list())):
        mine = gaps.filter(pl.col("compared_arm") == on)
        seeds = sorted(set(mine["seed"].to_list()))
        draws = S.seed_draws(len(seeds), options.bootstrap, f"whole-seed/{on}{options.draw_key}")
        for depth in sorted(set(informative.filter(pl.col("compared_arm") == on)["depth"])):
            c = cells.filter((pl.col("compared_arm") == on) & (pl.col("depth") == depth))
            if int(c.filter("informative")["pairs"].max()) >= 2:
                out[(on, depth)] = read_onset(c, mine.filter(pl.col("depth") == depth), seeds,
                                              draws, options.min_gap)
    return out


def tested_rule(cells: pl.DataFrame, margin: float = 0.1) -> dict:
    """The rule made of tested claims, from one (depth, compared_arm)'s H1 cells:
    no_difference_up_to (every informative cell up to it "no difference"), trained_up_to (the
    largest informative LR up to which every compared-arm run trained), off_worse_from (every cell
    from it up to trained_up_to "off worse"), None where no such LR, and the rule in words."""
    informative = cells.filter(pl.col("informative")).sort("lr")
    lrs, decisions = informative["lr"].to_list(), informative["decision"].to_list()
    failed = zip(*(informative[c].fill_null(0).to_list() for c in ("on_diverged", "on_degraded")
                   if c in informative.columns))
    # the LRs read, lrs[:k], end below the first at which some QK-norm run failed
    k = next((i for i, f in enumerate(failed) if any(f)), len(lrs))
    calm = next((i for i, d in enumerate(decisions) if d != "no difference"), len(lrs))
    worse = next((i for i in range(k - 1, -1, -1) if decisions[i] != "off worse"), -1) + 1
    top = lrs[k - 1] if k else None
    a = lrs[calm - 1] if calm else None  # every cell up to it "no difference"
    b = lrs[worse] if worse < k else None  # every cell from it up to top "off worse"
    low = (f"no difference (within {margin:g} nats) decided up to LR {a:.3g}" if a is not None
           else "\"no difference\" decided at no LR from the smallest up")
    span = "" if b is None else f"at LR {b:.3g}" if b == top else f"from LR {b:.3g} to {top:.3g}"
    high = (f"off worse decided {span}, the largest LR up to which every QK-norm run trained"
            if b is not None else "no LR at which every QK-norm run trained" if top is None
            else f"no LR from which every LR up to {top:.3g} (the largest up to which every "
            "QK-norm run trained) is decided \"off worse\"")
    return {"no_difference_up_to": a, "off_worse_from": b, "trained_up_to": top,
            "text": f"{low}; {high}"}


ONSET_SCHEMA = {"depth": pl.Int64, "compared_arm": pl.String, "seeds": pl.Int64,
                "lrs": pl.Int64, "lr_min": pl.Float64, "lr_max": pl.Float64,
                "min_gap": pl.Float64, "onset_lr": pl.Float64, "outside": pl.String,
                "ci_lo": pl.Float64, "ci_hi": pl.Float64, "onset": pl.String,
                "no_difference_up_to": pl.Float64, "off_worse_from": pl.Float64,
                "trained_up_to": pl.Float64, "tested_rule": pl.String, "note": pl.String}


def bound_text(v: float, lrs: list[float]) -> str:
    """An LR given as log10; one at -inf or +inf as beyond the LRs read."""
    if v == -np.inf:
        return f"< {lrs[0]:.3g}"
    if v == np.inf:
        return f"> {lrs[-1]:.3g}"
    return f"{10 ** v:.3g}"


def estimate_text(point: float, lo: float, hi: float, lrs: list[float]) -> str:
    """An estimate with its interval (log10 LRs): "0.0066 [0.0055, 0.022]", "> 0.3 [...]"."""
    return f"{bound_text(point, lrs)} [{bound_text(lo, lrs)}, {bound_text(hi, lrs)}]"


def onset_columns(d: DepthDraws, k: float) -> dict:
    """The onset: estimate, interval widened by k, its text and the LRs it is read over (an
    open end or an onset outside them lies beyond read_lo or read_hi)."""
    lo, hi = threshold_interval(d, k)
    low, high = d.bounds
    side = "" if math.isfinite(d.point) else "above" if d.point > 0 else "below"
    return {"onset_lr": 10 ** d.point if not side else None,
            "onset_lo": 10 ** lo if math.isfinite(lo) else None,
            "onset_hi": 10 ** hi if math.isfinite(hi) else None,
            "onset_side": side, "onset_bound": None if not side else
            10 ** (high if side == "above" else low),
            "onset": estimate_text(d.point, lo, hi, d.lrs), "read_lo": 10 ** low,
            "read_hi": 10 ** high}


def _onset_row(d: DepthDraws, options: Options) -> dict:
    c = onset_columns(d, options.threshold_widening)
    row = {"ci_lo": c["onset_lo"], "ci_hi": c["onset_hi"], "onset": c["onset"],
           "onset_lr": c["onset_lr"]}
    if d.point == np.inf:
        row.update(outside=ABOVE, note=f"the fitted gap stays under {options.min_gap:g} nats "
                                       f"up to LR {d.lrs[-1]:.3g}, the largest up to which every "
                                       "QK-norm run trained")
    elif d.point == -np.inf:
        row.update(outside=BELOW, note=f"the fitted gap is {options.min_gap:g} nats or more "
                                       "already at the LR where it is smallest")
    return row


def onset_table(gaps: pl.DataFrame, draws: dict[tuple[str, int], DepthDraws],
                options: Options) -> pl.DataFrame:
    """Per (depth, compared_arm): the onset, its 95% interval and the tested rule."""
    rows = []
    for (on, depth), g in gaps.sort("lr").group_by("compared_arm", "depth", maintain_order=True):
        tested = tested_rule(g, options.min_gap)
        row = {"depth": depth, "compared_arm": on, "seeds": int(g["pairs"].max()),
               "lrs": g.height, "lr_min": float(g["lr"].min()), "lr_max": float(g["lr"].max()),
               "min_gap": options.min_gap, **{k: v for k, v in tested.items() if k != "text"},
               "tested_rule": f"depth {depth}: {tested['text']}", "note": ""}
        if (on, depth) in draws:
            row.update(_onset_row(draws[(on, depth)], options))
        else:
            row["note"] = ("not enough data: needs >= 2 paired seeds" if g["pairs"].max() < 2
                           else "no informative LR: neither arm learned at any LR")
        rows.append(row)
    return pl.DataFrame(rows, schema=ONSET_SCHEMA).sort("compared_arm", "depth")
