"""The necessity threshold: per depth and compared arm, the learning rate from which switching
the control off costs at least the plan's margin (`min_gap`, 0.1 nats) in final loss.

Read from a monotone fit: the seed-mean gaps (off minus on, clipped losses) of every
informative cell, weighted by their paired seeds, are fitted by a non-decreasing function of
log LR (isotonic regression), and the threshold is where the fit reaches the margin, linear in
log LR between the two cells either side. Every cell enters, whatever its seed count (a
threshold-bisection LR run by every seed, a boundary-refinement LR run by some). Censored
below the grid when the fit is at or above the margin at the smallest LR, above when it stays
under the margin at the largest: never a number then.

Its 95% interval resamples whole seeds (analysis.stats.seed_bootstrap): a drawn seed brings its
gaps at every LR and depth, so one seed's correlated runs move together, and the rule is applied
to each draw. The same draws give H3's slope (analysis.hypotheses). Every rule is written out in
docs/report.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from . import stats as S
from .metrics import Options, paired_gaps


def threshold_from_fit(log_lrs: np.ndarray, fit: np.ndarray, margin: float,
                       floor: float | None = None, midpoint: bool = False) -> np.ndarray:
    """log10 of the threshold for each row of a monotone fit (rows x LRs, ascending): where the
    fit first reaches `margin`, linear in log LR from the LR before; -inf when it is already
    there at the smallest LR (censored below), +inf when it never gets there (censored above).
    NaN fits (no data at an LR in a draw) are passed over. `floor` (nats) interpolates log(gap)
    instead, the gap below it read as `floor`: a logistic onset's lower half is straight
    there, where the gap itself is convex (a candidate estimator, analysis/calibrate.py).
    `midpoint` reads the bracket's geometric midpoint instead (amendment 12's candidate: where
    the data cannot place a sharp onset inside its bracket)."""
    fit = np.atleast_2d(fit)
    valid = ~np.isnan(fit)
    reached = valid & (np.where(valid, fit, -np.inf) >= margin)
    cols = np.arange(fit.shape[1])
    # the last LR with data before each LR (-1: none)
    last = np.maximum.accumulate(np.where(valid, cols, -1), axis=1)
    first = np.argmax(reached, axis=1)
    rows = np.arange(fit.shape[0])
    k = np.where(first > 0, last[rows, np.maximum(first - 1, 0)], -1)
    out = np.where(reached.any(axis=1), -np.inf, np.inf)
    inside = reached.any(axis=1) & (k >= 0)
    r, i, kk = rows[inside], first[inside], k[inside]
    lo, hi = fit[r, kk], fit[r, i]
    with np.errstate(invalid="ignore", divide="ignore"):
        if midpoint:
            t = np.full(lo.shape, 0.5)
        elif floor is None:
            t = np.where(hi > lo, (margin - lo) / (hi - lo), 1.0)
        else:  # lo < margin <= hi; floor < margin
            lo = np.log(np.maximum(lo, floor))
            t = np.where(np.log(hi) > lo, (math.log(margin) - lo) / (np.log(hi) - lo), 1.0)
    out[inside] = log_lrs[kk] + np.clip(t, 0.0, 1.0) * (log_lrs[i] - log_lrs[kk])
    return out


@dataclass
class DepthDraws:
    """One (compared arm, depth): its informative LRs, the point threshold and the bootstrap
    draws (log10 LR; +-inf when censored), and the gaps by seed behind them."""

    lrs: list[float]
    point: float
    draws: np.ndarray
    fit: np.ndarray  # the monotone fit of the seed-mean gaps at `lrs`
    seeds: int  # the most paired seeds of any of its cells
    boot_fit: np.ndarray | None = None  # the fit under each draw (draws x LRs)
    # the seed-mean gaps and paired seeds behind the fits (LRs; draws x LRs under each draw)
    means: np.ndarray | None = None
    counts: np.ndarray | None = None
    boot_means: np.ndarray | None = None
    boot_counts: np.ndarray | None = None


LOGISTIC_CAP = 0.5  # nats: amendment 13 caps each seed-mean gap here before fitting
LOGISTIC_WIDTHS = (0.0125, 0.025, 0.05, 0.1, 0.2, 0.4)  # decades: doublings
LOGISTIC_STEP = 1 / 64  # decades: the lattice of the logistic's centre


def logistic_threshold(log_lrs: np.ndarray, means: np.ndarray, counts: np.ndarray,
                       margin: float) -> np.ndarray:
    """Amendment 13's candidate reading: per row of seed-mean gaps (rows x LRs, NaN where no
    data; `counts` the paired seeds), the weighted least-squares logistic P / (1 + exp(-(x -
    c) / w)) in x = log10 LR (P >= 0 in closed form, c on a lattice, w from LOGISTIC_WIDTHS)
    fitted to the gaps capped at LOGISTIC_CAP, and log10 of where it reaches `margin`: -inf
    when it is there at the smallest LR, +inf when it does not get there by the largest."""
    means = np.atleast_2d(means)
    weights = np.where(np.isnan(means), 0.0, np.atleast_2d(counts).astype(float))
    y = np.where(np.isnan(means), 0.0, np.minimum(means, LOGISTIC_CAP))
    lo, hi = float(log_lrs.min()), float(log_lrs.max())
    centres = np.arange(lo - 0.5, hi + 0.5 + 1e-9, LOGISTIC_STEP)
    c = np.repeat(centres, len(LOGISTIC_WIDTHS))
    w = np.tile(LOGISTIC_WIDTHS, len(centres))
    shapes = 1 / (1 + np.exp(-np.clip((log_lrs[None, :] - c[:, None]) / w[:, None], -700, 700)))
    num = (weights * y) @ shapes.T  # (rows, shapes)
    den = weights @ (shapes ** 2).T
    with np.errstate(invalid="ignore", divide="ignore"):
        height = np.where(den > 0, np.maximum(num / den, 0.0), 0.0)
    best = np.argmin(height * height * den - 2 * height * num, axis=1)
    rows = np.arange(means.shape[0])
    p, cc, ww = height[rows, best], c[best], w[best]
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(p > margin, cc + ww * np.log(margin / np.maximum(p - margin, 1e-300)),
                     np.inf)
    x = np.where(x <= lo, -np.inf, np.where(x > hi, np.inf, x))
    return np.where(weights.sum(axis=1) > 0, x, np.inf)


def reread(d: DepthDraws, margin: float, floor: float | None = None,
           midpoint: bool = False, logistic: bool = False) -> DepthDraws:
    """The same fits read by one of threshold_from_fit's other readings (`floor`, `midpoint`),
    or the same gaps read by amendment 13's fitted logistic (`logistic`)."""
    logs = np.log10(d.lrs)
    if logistic:
        point = float(logistic_threshold(logs, d.means[None], d.counts, margin)[0])  # type: ignore[index]
        return DepthDraws(lrs=d.lrs, point=point, fit=d.fit, seeds=d.seeds,
                          draws=logistic_threshold(logs, d.boot_means, d.boot_counts, margin),  # type: ignore[arg-type]
                          boot_fit=d.boot_fit)
    return DepthDraws(lrs=d.lrs, point=float(threshold_from_fit(logs, d.fit[None], margin,
                                                                 floor, midpoint)[0]),
                      draws=threshold_from_fit(logs, d.boot_fit, margin, floor, midpoint),
                      fit=d.fit,
                      seeds=d.seeds, boot_fit=d.boot_fit)


def widened(d: DepthDraws, k: float) -> np.ndarray:
    """The draws moved away from the point estimate by the factor k (censored draws and a
    censored estimate are left as they are)."""
    if k == 1 or not math.isfinite(d.point):
        return d.draws
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(d.draws), d.point + k * (d.draws - d.point), d.draws)


def threshold_interval(d: DepthDraws, k: float) -> tuple[float, float]:
    """The 95% interval of log10(threshold) (docs/report.md, amendment 5): the whole-seed
    percentile interval of the draws widened by k about the estimate, and never narrower than
    the two informative LRs either side of the estimated crossing, between which the data
    cannot place it (a sharp onset leaves every draw on one point inside that bracket)."""
    lo, hi = S.percentile_interval(widened(d, k))
    if math.isfinite(d.point):
        logs = np.log10(d.lrs)
        below, above = logs[logs <= d.point], logs[logs >= d.point]
        if below.size:
            lo = min(lo, float(below.max()))
        if above.size:
            hi = max(hi, float(above.min()))
    return lo, hi


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
    """Per (compared_arm, depth) with at least 2 paired seeds somewhere: the threshold's point
    estimate and its whole-seed bootstrap draws. Seeds are drawn once for the whole study (the
    same draw at every depth, LR and arm: a seed's runs share its data order), from a generator
    seeded by the arm's name, so a report is reproducible."""
    gaps = paired_gaps(points, options)
    out: dict[tuple[str, int], DepthDraws] = {}
    informative = cells.filter(pl.col("informative"))
    for on in sorted(set(informative["compared_arm"].to_list())):
        mine = gaps.filter(pl.col("compared_arm") == on)
        seeds = sorted(set(mine["seed"].to_list()))
        draws = S.seed_draws(len(seeds), options.bootstrap, f"whole-seed/{on}{options.draw_key}")
        for depth in sorted(set(informative.filter(pl.col("compared_arm") == on)["depth"].to_list())):
            c = informative.filter((pl.col("compared_arm") == on) & (pl.col("depth") == depth))
            if int(c["pairs"].max()) < 2:
                continue
            lrs = sorted(c["lr"].to_list())
            values = gap_matrix(mine.filter((pl.col("depth") == depth)
                                            & pl.col("lr").is_in(lrs)), seeds, lrs)
            out[(on, depth)] = depth_draws(values, lrs, draws, options.min_gap)
    return out


READINGS = ("plan", "onset")  # the plan's threshold; amendment 11's instability onset


def above_valley(means: np.ndarray, searched: int | None = None) -> np.ndarray:
    """Each row of seed-mean gaps (rows x LRs) with every LR below its valley (the smallest LR
    at which the row's mean is smallest, among the first `searched` LRs: those up to where
    every QK-norm run trained) set to NaN: the rising branch the onset reading fits
    (docs/report.md, amendments 11 and 11a). A row without data is left as it is."""
    means = np.atleast_2d(means)
    window = np.where(np.isnan(means), np.inf, means)[:, :searched]
    has = np.isfinite(window).any(axis=1)
    valley = np.where(has, np.argmin(window, axis=1), 0)
    below = np.arange(means.shape[1])[None, :] < valley[:, None]
    return np.where(below, np.nan, means)


def _fit(means: np.ndarray, counts: np.ndarray, reading: str, searched: int | None = None
         ) -> np.ndarray:
    """The monotone fit the reading reads: over every LR (plan), or from the valley up (onset;
    NaN below it, where threshold_from_fit then finds no LR to start from: censored below when
    the valley itself reaches the margin)."""
    if reading == "plan":
        return S.isotonic(means, counts)
    kept = above_valley(means, searched)
    return np.where(np.isnan(kept), np.nan, S.isotonic(kept, counts))


def depth_draws(values: np.ndarray, lrs: list[float], draws: np.ndarray, margin: float,
                reading: str = "plan", trained_up_to: float | None = None) -> DepthDraws:
    """The threshold of one depth from its (seeds, LRs) gaps, and under each whole-seed draw;
    `reading="onset"` reads amendment 11's instability onset instead (the fit from the gap's
    valley up, the valley found again in every draw, and searched only up to `trained_up_to`,
    the largest LR at which every QK-norm run trained: above it both arms fail and the gap
    sits near 0 for that reason; None: every LR)."""
    if reading not in READINGS:
        raise ValueError(f"reading {reading!r}; known: {', '.join(READINGS)}")
    searched = None if trained_up_to is None else sum(lr <= trained_up_to for lr in lrs) or None
    log_lrs = np.log10(lrs)
    n = (~np.isnan(values)).sum(axis=0)
    means = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
    fit = _fit(means[None], n.astype(float), reading, searched)
    point = float(threshold_from_fit(log_lrs, fit, margin)[0])
    boot_means, counts = S.seed_bootstrap(values, draws)
    boot_fit = _fit(boot_means, counts.astype(float), reading, searched)
    return DepthDraws(lrs=lrs, point=point, draws=threshold_from_fit(log_lrs, boot_fit, margin),
                      fit=fit[0], seeds=int(n.max()), boot_fit=boot_fit, means=means,
                      counts=n, boot_means=boot_means, boot_counts=counts)


def tested_rule(cells: pl.DataFrame, margin: float = 0.1) -> dict:
    """The practitioner's rule made of tested claims (docs/report.md, amendments 1 and 9), from
    one (depth, compared_arm)'s H1 cells: no_difference_up_to, the largest LR such that every
    informative cell at or below it is decided "no difference"; off_worse_from, the smallest LR
    such that every informative cell from it up to `trained_up_to` is decided "off worse";
    trained_up_to, the largest informative LR at which no run of the compared arm diverged or
    degraded (above it QK-norm fails too, and the rule says nothing); None where no such LR
    exists; and the rule in words. Cells without the arm's failure counts count as trained."""
    informative = cells.filter(pl.col("informative")).sort("lr")
    lrs, decisions = informative["lr"].to_list(), informative["decision"].to_list()
    failed = [0] * len(lrs)
    for column in ("on_diverged", "on_degraded"):
        if column in informative.columns:
            failed = [f + (v or 0) for f, v in zip(failed, informative[column].to_list())]
    trained = [lr for lr, f in zip(lrs, failed) if f == 0]
    top = max(trained) if trained else None
    a = b = None
    for lr, decision in zip(lrs, decisions):
        if decision != "no difference":
            break
        a = lr
    for lr, decision in zip(reversed(lrs), reversed(decisions)):
        if top is None or lr > top:
            continue
        if decision != "off worse":
            break
        b = lr
    low = (f"no difference within {margin:g} nats decided up to LR {a:.3g}" if a is not None
           else "no LR decided \"no difference\" from the smallest up")
    span = "" if b is None else f"at LR {b:.3g}" if b == top else f"from LR {b:.3g} up to {top:.3g}"
    high = (f"off worse decided {span}, the largest at which every QK-norm run trained"
            if b is not None
            else "no LR from which every larger one is decided \"off worse\" up to where "
            "QK-norm's runs fail")
    return {"no_difference_up_to": a, "off_worse_from": b, "trained_up_to": top,
            "text": f"{low}; {high}"}


THRESHOLD_SCHEMA = {"depth": pl.Int64, "compared_arm": pl.String, "seeds": pl.Int64,
                    "lrs": pl.Int64, "lr_min": pl.Float64, "lr_max": pl.Float64,
                    "min_gap": pl.Float64, "threshold_lr": pl.Float64, "censored": pl.String,
                    "ci_lo": pl.Float64, "ci_hi": pl.Float64, "threshold": pl.String,
                    "bracket_lo": pl.Float64, "bracket_hi": pl.Float64,
                    "not_needed_below": pl.Float64, "rule": pl.String,
                    "no_difference_up_to": pl.Float64, "off_worse_from": pl.Float64,
                    "tested_rule": pl.String, "note": pl.String}


def _lr_text(log_lr: float) -> str:
    return f"{10 ** log_lr:.3g}"


def bound_text(v: float, point: float, lrs: list[float]) -> str:
    """An interval bound (log10 LR); one past the grid on a censored estimate's side reads as
    past it (a draw of 10 ** -400 would print as 0)."""
    if v == -np.inf or (point == -np.inf and v < np.log10(lrs[0])):
        return f"< {lrs[0]:.3g}"
    if v == np.inf or (point == np.inf and v > np.log10(lrs[-1])):
        return f"> {lrs[-1]:.3g}"
    return _lr_text(v)


def estimate_text(point: float, lo: float, hi: float, lrs: list[float]) -> str:
    """A threshold estimate with its interval (log10 LRs; +-inf censored), as the tables print
    it: "0.0066 [0.0055, 0.022]", "<= 0.0001 [...]" or "> 3 [...]"."""
    head = (f"<= {lrs[0]:.3g}" if point == -np.inf else f"> {lrs[-1]:.3g}" if point == np.inf
            else _lr_text(point))
    return f"{head} [{bound_text(lo, point, lrs)}, {bound_text(hi, point, lrs)}]"


def practitioner_line(depth: int, margin: float, point: float, lo: float, hi: float,
                      lrs: list[float]) -> str:
    """The rule the study exists to give, in one line (log10 LRs; +-inf when censored)."""
    low, top = f"{lrs[0]:.3g}", f"{lrs[-1]:.3g}"
    if point == np.inf:
        return (f"depth {depth}: up to LR {top}, the largest informative LR, QK-norm changes the "
                f"final loss by less than {margin:g} nats (fit); not needed within the grid")
    if point == -np.inf:
        return (f"depth {depth}: QK-norm changes the final loss by {margin:g} nats or more "
                f"already at LR {low}, the smallest run: needed everywhere in the grid")
    lower = f"< {low}" if lo == -np.inf else _lr_text(lo)
    upper = f"above {top}" if hi == np.inf else _lr_text(hi)
    return (f"depth {depth}: below LR {_lr_text(point)} (95% lower bound {lower}) QK-norm "
            f"changes the final loss by less than {margin:g} nats; from LR {upper} (95% upper "
            f"bound) it is needed")


def _training_note(cells: pl.DataFrame, lr: float) -> str:
    """Both arms' final losses at `lr` beside the best either reaches at any LR: a gap at LRs
    too small to train either arm measures how fast each learns, not the off arm's instability
    (the ladder's w64-s4800, docs/results.md). Descriptive: the rule is not changed by it."""
    if not {"loss_off", "loss_on"} <= set(cells.columns):
        return ""
    at = cells.filter(pl.col("lr") == lr)
    best = cells.select(pl.min_horizontal("loss_off", "loss_on").min()).item()
    if not at.height or best is None or at["loss_off"][0] is None or at["loss_on"][0] is None:
        return ""
    return (f" (there off ends at {at['loss_off'][0]:.3g} nats and on at {at['loss_on'][0]:.3g};"
            f" the best LR reaches {best:.3g}: where neither arm is trained, the gap measures how "
            "fast each learns, not instability)")


def necessity_threshold(points: pl.DataFrame, options: Options, gaps: pl.DataFrame,
                        draws: dict[tuple[str, int], DepthDraws] | None = None) -> pl.DataFrame:
    """Per (depth, compared_arm): the threshold with its 95% whole-seed interval and the
    practitioner's line. `gaps` is the H1 cell table (analysis.hypotheses.h1_tests).
    censored: "above" (shown as "> largest LR"), "below" ("<= smallest LR") or null.
    bracket_lo/hi: the informative LRs either side of the crossing. not_needed_below: the
    largest LR under the threshold whose cell is "no difference" (equivalence within the
    margin)."""
    if draws is None:
        draws = threshold_draws(points, gaps, options)
    rows = []
    for (on, depth), g in gaps.sort("lr").group_by("compared_arm", "depth", maintain_order=True):
        row = {"depth": depth, "compared_arm": on, "seeds": int(g["pairs"].max()), "lrs": g.height,
               "lr_min": float(g["lr"].min()), "lr_max": float(g["lr"].max()),
               "min_gap": options.min_gap, "threshold_lr": None, "censored": None,
               "ci_lo": None, "ci_hi": None, "threshold": None, "bracket_lo": None,
               "bracket_hi": None, "not_needed_below": None, "rule": None, "note": ""}
        tested = tested_rule(g, options.min_gap)
        row.update(no_difference_up_to=tested["no_difference_up_to"],
                   off_worse_from=tested["off_worse_from"],
                   tested_rule=f"depth {depth}: {tested['text']}")
        if (on, depth) not in draws:
            row["note"] = ("not enough data: needs >= 2 paired seeds" if g["pairs"].max() < 2
                           else "no informative LR: neither arm learned at any LR")
            rows.append(row)
            continue
        d = draws[(on, depth)]
        point, lrs = d.point, d.lrs
        lo, hi = threshold_interval(d, options.threshold_widening)
        row.update(ci_lo=10 ** lo if np.isfinite(lo) else None,
                   ci_hi=10 ** hi if np.isfinite(hi) else None,
                   rule=practitioner_line(depth, options.min_gap, point, lo, hi, lrs))
        text = estimate_text(point, lo, hi, lrs)
        if point == np.inf:
            row.update(censored="above", threshold=text,
                       note=f"the fitted gap stays under {options.min_gap:g} nats up to the "
                            f"largest informative LR {lrs[-1]:.3g}")
        elif point == -np.inf:
            row.update(censored="below", threshold=text,
                       note="needed already at the smallest informative LR"
                            + _training_note(g, lrs[0]))
        else:
            k = max(i for i, lr in enumerate(lrs) if np.log10(lr) <= point)
            row.update(threshold_lr=10 ** point, threshold=text,
                       bracket_lo=lrs[k], bracket_hi=lrs[min(k + 1, len(lrs) - 1)])
        limit = row["threshold_lr"] if row["threshold_lr"] is not None else (
            math.inf if point == np.inf else -math.inf)
        calm = g.filter(pl.col("no_difference") & (pl.col("lr") < limit))
        row["not_needed_below"] = float(calm["lr"].max()) if calm.height else None
        rows.append(row)
    return pl.DataFrame(rows, schema=THRESHOLD_SCHEMA).sort("compared_arm", "depth")
