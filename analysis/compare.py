"""Two sweeps side by side (`just report runs/mini runs/mini-seeds5-9`): where their off-minus-on
gaps and cell decisions agree, and their verdicts, for the report's comparison section."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl

from . import charts as C
from .study import Study


def comparison(study: Study, other: Study, runs_dir: str | Path, other_dir: str | Path) -> dict:
    """The comparison section's tables, sentences and chart."""
    a, b = Path(runs_dir).name, Path(other_dir).name
    if a == b:
        a, b = str(runs_dir), str(other_dir)
    gaps = gap_agreement(study, other)
    verdicts = verdict_agreement(study, other)
    return {"a": a, "b": b, "gaps": gaps, "verdicts": verdicts,
            "sentences": sentences(gaps, verdicts, a, b), "chart": gap_scatter(gaps, a, b)}


KEYS = ["compared_arm", "depth", "lr"]


def gap_agreement(a: Study, b: Study) -> pl.DataFrame:
    """Per cell run in both sweeps: both gaps and whether decisions and intervals agree."""
    cols = ["mean_gap", "ci_lo", "ci_hi", "pairs", "decision"]
    left = a.gaps.select(*KEYS, *cols)
    right = b.gaps.select(*KEYS, *[pl.col(c).alias(f"{c}_b") for c in cols])
    both = left.with_columns(lr_key=pl.col("lr").round_sig_figs(4)).join(
        right.with_columns(lr_key=pl.col("lr").round_sig_figs(4)).drop("lr"),
        on=["compared_arm", "depth", "lr_key"]).drop("lr_key")
    return (both.with_columns(
        decisions_agree=pl.col("decision") == pl.col("decision_b"),
        intervals_overlap=(pl.col("ci_lo") <= pl.col("ci_hi_b"))
        & (pl.col("ci_lo_b") <= pl.col("ci_hi")))
        .sort(KEYS))


def verdict_agreement(a: Study, b: Study) -> pl.DataFrame:
    keys = ["hypothesis", "compared_arm"]
    return (a.verdicts.select(*keys, "claim", "verdict", "seeds")
            .join(b.verdicts.select(*keys, verdict_b="verdict", seeds_b="seeds"), on=keys,
                  how="full", coalesce=True)
            .with_columns(agree=pl.col("verdict") == pl.col("verdict_b")).sort(keys))


def sentences(gaps: pl.DataFrame, verdicts: pl.DataFrame, a: str, b: str) -> list[str]:
    out = []
    if gaps.height:
        same = int(gaps["decisions_agree"].sum())
        overlap = int(gaps["intervals_overlap"].fill_null(False).sum())
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
    for r in verdicts.iter_rows(named=True):
        out.append(f"{r['hypothesis']} ({r['compared_arm']}): {r['verdict'] or 'absent'} in {a}, "
                   f"{r['verdict_b'] or 'absent'} in {b}"
                   + (" (the same)" if r["agree"] else " (they differ)") + ".")
    return out


def gap_scatter(gaps: pl.DataFrame, a: str, b: str) -> alt.Chart:
    """Each cell's seed-mean gap in one sweep against the other's (on the diagonal: equal)."""
    if gaps.is_empty():
        return C._empty("no (depth, LR) cell run in both sweeps")
    data = gaps.with_columns(agreement=pl.when("decisions_agree").then(pl.lit("same decision"))
                             .otherwise(pl.lit("different decision")))
    lo = float(min(data["mean_gap"].min(), data["mean_gap_b"].min(), 0.0))
    hi = float(max(data["mean_gap"].max(), data["mean_gap_b"].max(), 0.0))
    pad = max(0.1 * (hi - lo), 0.02)
    scale = alt.Scale(domain=[lo - pad, hi + pad], nice=False, zero=False)
    x = alt.X("mean_gap:Q", scale=scale, title=f"gap off - on in {a} (nats)")
    y = alt.Y("mean_gap_b:Q", scale=scale, title=f"gap off - on in {b} (nats)")
    color = alt.Color("agreement:N", title=None, scale=alt.Scale(
        domain=["same decision", "different decision"], range=["#1b9e77", "#d95f02"]))
    diagonal = (alt.Chart(alt.Data(values=[{"v": lo - pad}, {"v": hi + pad}]))
                .mark_line(color="#999", strokeDash=[4, 4]).encode(x=alt.X("v:Q", scale=scale),
                                                                   y=alt.Y("v:Q", scale=scale)))
    points = (alt.Chart(C.values(data)).mark_point(filled=True, size=60)
              .encode(x=x, y=y, color=color, shape=alt.Shape("depth:N"),
                      tooltip=["depth:Q", alt.Tooltip("lr:Q", format=".3g"), "compared_arm:N",
                               alt.Tooltip("mean_gap:Q", format="+.3f"),
                               alt.Tooltip("mean_gap_b:Q", format="+.3f"), "decision:N",
                               "decision_b:N"]))
    return C.finish(alt.layer(diagonal, points).properties(
        width=C.panel_width(1) // 2, height=C.PANEL_H + 120,
        title=f"Seed-mean gap per (depth, LR): {a} against {b} (dashed: equal)"))
