"""Two sweeps compared at the level of their answers (`just report A B`, docs/report.md): per
(compared arm, depth, LR) cell run in both, each sweep's seed-mean gap, interval and decision and
whether they agree; per (compared arm, depth) both onsets, both tested rules and the onset's
difference (B minus A, decades) with a 95% interval from the two sweeps' whole-seed draws,
combined independently; every verdict side by side. A and B may be two folders (an MLX sweep
and its CUDA replication) or two frameworks' runs in one folder."""

from __future__ import annotations

import math
from dataclasses import dataclass

import altair as alt
import numpy as np
import polars as pl

from . import charts as C
from . import stats as S
from .metrics import Options, control_words
from .study import Study
from .threshold import DepthDraws, threshold_draws, widened

KEYS = ["compared_arm", "depth", "lr"]
SIDES = ["compared_arm", "depth"]


@dataclass
class Comparison:
    """The comparison section's tables, sentences and chart; `a` and `b` name the two sides."""

    a: str
    b: str
    gaps: pl.DataFrame
    onsets: pl.DataFrame
    verdicts: pl.DataFrame
    sentences: list[str]
    chart: alt.TopLevelMixin


def compare(a: Study, b: Study, a_name: str, b_name: str, options: Options) -> Comparison:
    gaps, onsets = gap_agreement(a, b), onset_difference(a, b, options)
    verdicts = verdict_agreement(a, b)
    return Comparison(a_name, b_name, gaps, onsets, verdicts,
                      sentences(gaps, onsets, verdicts, a_name, b_name),
                      gap_scatter(gaps, a_name, b_name))


def _overlap(lo, hi, lo_b, hi_b) -> pl.Expr:
    """Whether two intervals share a point (a null end: open, beyond every value)."""
    return ((lo.fill_null(-math.inf) <= hi_b.fill_null(math.inf))
            & (lo_b.fill_null(-math.inf) <= hi.fill_null(math.inf)))


def gap_agreement(a: Study, b: Study) -> pl.DataFrame:
    """Per cell run in both sweeps: both gaps and whether decisions and intervals agree."""
    cols = ["mean_gap", "ci_lo", "ci_hi", "pairs", "decision"]
    left = a.gaps.select(*KEYS, *cols).with_columns(lr_key=pl.col("lr").round_sig_figs(4))
    right = b.gaps.select(*KEYS, *[pl.col(c).alias(f"{c}_b") for c in cols]).with_columns(
        lr_key=pl.col("lr").round_sig_figs(4)).drop("lr")
    both = left.join(right, on=["compared_arm", "depth", "lr_key"]).drop("lr_key")
    return (both.with_columns(
        decisions_agree=pl.col("decision") == pl.col("decision_b"),
        intervals_overlap=_overlap(*(pl.col(c) for c in ("ci_lo", "ci_hi", "ci_lo_b",
                                                          "ci_hi_b"))))
        .sort(KEYS))


ONSET_COLUMNS = ["onset", "onset_lr", "ci_lo", "ci_hi", "tested_rule", "seeds"]


def onset_difference(a: Study, b: Study, options: Options) -> pl.DataFrame:
    """Per (compared arm, depth) in both: both onsets and tested rules, whether the onsets'
    intervals overlap, and the difference B minus A in decades of LR with its 95% interval:
    the percentile interval of the differences of the two sweeps' widened whole-seed draws
    (options.threshold_widening, as each onset's own interval), paired at random."""
    both = (a.thresholds.select(*SIDES, *ONSET_COLUMNS)
            .join(b.thresholds.select(*SIDES, *[pl.col(c).alias(f"{c}_b")
                                                 for c in ONSET_COLUMNS]), on=SIDES)
            .with_columns(intervals_overlap=_overlap(*(pl.col(c) for c in (
                "ci_lo", "ci_hi", "ci_lo_b", "ci_hi_b")))))
    draws = [threshold_draws(s.points, s.gaps, options) for s in (a, b)]
    extra = [_difference(*(d.get((r["compared_arm"], r["depth"])) for d in draws), options,
                         f"{r['compared_arm']}/{r['depth']}")
             for r in both.iter_rows(named=True)]
    schema = {"difference": pl.Float64, "difference_lo": pl.Float64,
              "difference_hi": pl.Float64, "draws_at_a_bound": pl.Float64, "note": pl.String}
    return pl.concat([both, pl.DataFrame(extra, schema=schema)], how="horizontal").sort(SIDES)


def _difference(da: DepthDraws | None, db: DepthDraws | None, options: Options, key: str
                ) -> dict:
    """One (compared arm, depth)'s onset difference B - A (decades) and its interval."""
    none = {"difference": None, "difference_lo": None, "difference_hi": None,
            "draws_at_a_bound": None}
    if da is None or db is None:
        return {**none, "note": "no onset in " + ("both" if da is db else "A" if da is None
                                                    else "B") + " (needs >= 2 paired seeds)"}
    if not (math.isfinite(da.point) and math.isfinite(db.point)):
        return {**none, "note": "an onset lies outside the LRs read: no difference is measured"}
    k = options.threshold_widening
    joint = S.joint_draws([widened(da, k), widened(db, k)], options.bootstrap, f"compare/{key}")
    lo, hi = S.percentile_interval(joint[:, 1] - joint[:, 0])
    low, high = np.array([da.bounds, db.bounds]).T  # each side's range of LRs read (log10)
    at_bound = ((joint <= low + 1e-9) | (joint >= high - 1e-9)).any(axis=1)
    return {"difference": db.point - da.point, "difference_lo": lo, "difference_hi": hi,
            "draws_at_a_bound": float(at_bound.mean()), "note": ""}


def verdict_agreement(a: Study, b: Study) -> pl.DataFrame:
    keys = ["hypothesis", "compared_arm"]
    return (a.verdicts.select(*keys, "claim", "verdict", "seeds")
            .join(b.verdicts.select(*keys, verdict_b="verdict", seeds_b="seeds"), on=keys,
                  how="full", coalesce=True)
            .with_columns(agree=pl.col("verdict").eq_missing(pl.col("verdict_b")))
            .sort(keys))


def _decades(x: float) -> str:
    return f"{x:+.2f}"


def sentences(gaps: pl.DataFrame, onsets: pl.DataFrame, verdicts: pl.DataFrame, a: str,
              b: str) -> list[str]:
    """The comparison in words: cells, onsets, verdicts."""
    out = []
    if gaps.height:
        same = int(gaps["decisions_agree"].sum())
        overlap = int(gaps["intervals_overlap"].sum())
        out.append(f"The cell decisions agree at {same} of the {gaps.height} (depth, LR) cells "
                   f"run in both; the gaps' 95% intervals overlap at {overlap}.")
        differ = gaps.filter(~pl.col("decisions_agree"))
        if differ.height:
            out.append("They differ at " + "; ".join(
                f"depth {r['depth']} LR {r['lr']:.3g} ({r['decision']} in {a}, "
                f"{r['decision_b']} in {b})" for r in differ.head(8).iter_rows(named=True))
                + ("; ..." if differ.height > 8 else "") + ".")
    else:
        out.append(f"No (depth, LR) cell was run in both {a} and {b}.")
    for r in onsets.iter_rows(named=True):
        text = (f"Depth {r['depth']} ({control_words(r['compared_arm'])}): onset "
                f"{r['onset'] or 'none'} in {a}, {r['onset_b'] or 'none'} in {b}")
        if r["difference"] is not None:
            text += (f"; {b} minus {a} {_decades(r['difference'])} decades "
                     f"[{_decades(r['difference_lo'])}, {_decades(r['difference_hi'])}]")
        out.append(text + ("; the intervals overlap" if r["intervals_overlap"] else
                           "; the intervals do not overlap") + ".")
    for r in verdicts.iter_rows(named=True):
        out.append(f"{r['hypothesis']} ({r['compared_arm']}): {r['verdict'] or 'absent'} in {a}, "
                   f"{r['verdict_b'] or 'absent'} in {b}"
                   + (" (the same)" if r["agree"] else " (they differ)") + ".")
    return out


def gap_scatter(gaps: pl.DataFrame, a: str, b: str) -> alt.TopLevelMixin:
    """Each cell's seed-mean gap in one sweep against the other's (on the diagonal: equal)."""
    if gaps.is_empty():
        return C._empty("no (depth, LR) cell run in both sweeps")
    data = gaps.with_columns(agreement=pl.when("decisions_agree").then(pl.lit("same decision"))
                             .otherwise(pl.lit("different decision")))
    lo = float(min(data["mean_gap"].min(), data["mean_gap_b"].min(), 0.0))
    hi = float(max(data["mean_gap"].max(), data["mean_gap_b"].max(), 0.0))
    pad = max(0.1 * (hi - lo), 0.02)
    scale = alt.Scale(domain=[lo - pad, hi + pad], nice=False, zero=False)
    color = alt.Color("agreement:N", title=None, scale=alt.Scale(
        domain=["same decision", "different decision"], range=["#1b9e77", "#d95f02"]))
    diagonal = (alt.Chart(alt.Data(values=[{"v": lo - pad}, {"v": hi + pad}]))
                .mark_line(color="#999", strokeDash=[4, 4])
                .encode(x=alt.X("v:Q", scale=scale), y=alt.Y("v:Q", scale=scale)))
    points = (alt.Chart(C.values(data)).mark_point(filled=True, size=60).encode(
        x=alt.X("mean_gap:Q", scale=scale, title=f"gap off - on in {a} (nats)"),
        y=alt.Y("mean_gap_b:Q", scale=scale, title=f"gap off - on in {b} (nats)"),
        color=color, shape=alt.Shape("depth:N"),
        tooltip=["depth:Q", alt.Tooltip("lr:Q", format=".3g"), "compared_arm:N",
                 alt.Tooltip("mean_gap:Q", format="+.3f"),
                 alt.Tooltip("mean_gap_b:Q", format="+.3f"), "decision:N", "decision_b:N"]))
    return C.finish(alt.layer(diagonal, points).properties(
        width=C.panel_width(1) // 2, height=C.PANEL_H + 120,
        title=f"Seed-mean gap per (depth, LR): {a} against {b} (dashed: equal)"))
