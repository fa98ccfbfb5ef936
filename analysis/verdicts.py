"""The verdicts on H1-H3 (docs/report.md): per depth (H1), measure (H2) or the onset's slope
(H3) the tests of analysis.hypotheses point for, against or neither way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import polars as pl

from . import stats as S
from .hypotheses import (H2_MEASURES, MAX_USABLE, NO_DIFFERENCE, OFF_WORSE, ON_WORSE, TOO_FEW,
                         UNDETERMINED, h1_tests, h2_tests, h3_tests, mark_needed)
from .metrics import Options, control_words, compared_arms
from .threshold import onset_table, threshold_draws

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, MIXED, NO_DATA = (
    "supported", "not supported", "inconclusive", "mixed", "not enough data")
FOR, AGAINST, UNCLEAR = "for", "against", "unclear"


@dataclass(frozen=True)
class Part:
    """One per-depth (or per-measure) judgement: its direction, paired seeds and numbers."""

    direction: str
    seeds: int
    text: str


def label(direction: str, seeds: int) -> str:
    """The verdict a direction can bear on `seeds` paired seeds (below 3: only suggestive)."""
    if direction == FOR:
        return SUPPORTED if seeds >= 3 else f"suggestive (n={seeds})"
    if direction == AGAINST:
        return NOT_SUPPORTED if seeds >= 3 else f"suggestive against (n={seeds})"
    return INCONCLUSIVE if direction == UNCLEAR else NO_DATA


def combine(parts: list[Part]) -> str:
    """Decided parts must agree, else "mixed"; support with some parts unclear is "partly";
    none decided: "inconclusive", or "not enough data" when no part had data."""
    decided = [p for p in parts if p.direction in (FOR, AGAINST)]
    ways = {p.direction for p in decided}
    unclear = any(p.direction == UNCLEAR for p in parts)
    if len(ways) > 1:
        return MIXED
    if not ways:
        return INCONCLUSIVE if unclear else NO_DATA
    way = ways.pop()
    verdict = label(way, min(p.seeds for p in decided))
    return f"partly {verdict}" if way == FOR and unclear else verdict


def _lr(x: float | None) -> str:
    return "none" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _q(q: float | None) -> str:
    return "-" if q is None else ("< 1e-4" if q < 1e-4 else f"{q:.2g}")


def _effect(mean: float, lo: float | None, hi: float | None, fmt: str = "+.3f") -> str:
    if lo is None:
        return f"{mean:{fmt}}"
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def _lrs(values: list[float]) -> str:
    return ", ".join(_lr(v) for v in values) or "none"


VERDICT_SCHEMA = {"hypothesis": pl.String, "compared_arm": pl.String, "claim": pl.String,
                  "verdict": pl.String, "family_size": pl.Int64, "correction": pl.String,
                  "seeds": pl.Int64, "measured": pl.String, "evidence": pl.String}


class StudyVerdicts(NamedTuple):

    verdicts: pl.DataFrame
    gaps: pl.DataFrame  # H1's cells
    best: pl.DataFrame  # H1's best-loss gaps
    thresholds: pl.DataFrame
    h2: pl.DataFrame
    h3: pl.DataFrame


def study_verdicts(points: pl.DataFrame, options: Options) -> StudyVerdicts:
    """H1-H3 per compared arm and the tables behind them, from one study's runs."""
    gaps, best = h1_tests(points, options)
    draws = threshold_draws(points, gaps, options)
    thresholds = onset_table(gaps, draws, options)
    gaps = mark_needed(gaps, thresholds)
    h2 = h2_tests(points, options)
    h3 = h3_tests(points, draws, options)
    rows = []
    for on in compared_arms(points):
        rows += [_h1(on, gaps, best, thresholds), _h2(on, h2), _h3(on, h3, thresholds)]
    return StudyVerdicts(pl.DataFrame(rows, schema=VERDICT_SCHEMA), gaps, best, thresholds, h2,
                         h3)


def _row(hypothesis: str, on: str, claim: str, parts: list[Part], unit: str, family: int,
         verdict: str | None = None, correction: str = S.CORRECTION) -> dict:
    judged = sum(p.direction != NO_DATA for p in parts)
    decided = sum(p.direction in (FOR, AGAINST) for p in parts)
    seeds = [p.seeds for p in parts if p.direction != NO_DATA]
    return {"hypothesis": hypothesis, "compared_arm": on, "claim": claim,
            "verdict": verdict or combine(parts), "family_size": family,
            "correction": correction, "seeds": min(seeds) if seeds else 0,
            "measured": f"{decided} of {len(parts)} {unit if len(parts) != 1 else unit[:-1]} "
                        f"decided ({judged} had the data)",
            "evidence": "; ".join(p.text for p in parts) or "no paired runs"}


def h1_direction(informative: pl.DataFrame) -> str:
    """One depth's H1 direction from its informative cells: FOR when off is worse at some LR
    and a lower LR shows no difference; AGAINST when on is worse anywhere, or off worse at
    every LR, or no difference at every LR; else UNCLEAR."""
    worse, calm, harm = (_lrs_at(informative, k) for k in (OFF_WORSE, NO_DIFFERENCE, ON_WORSE))
    if harm or (worse and len(worse) == informative.height):
        return AGAINST
    if worse and any(lr < min(worse) for lr in calm):
        return FOR
    if not worse and informative.height and len(calm) == informative.height:
        return AGAINST
    return UNCLEAR


def _lrs_at(cells: pl.DataFrame, decision: str) -> list[float]:
    return cells.filter(pl.col("decision") == decision)["lr"].to_list()


def _h1(on: str, gaps: pl.DataFrame, best: pl.DataFrame, thresholds: pl.DataFrame) -> dict:
    mine = gaps.filter(pl.col("compared_arm") == on)
    parts = []
    for d in sorted(mine["depth"].unique().to_list()):
        g = mine.filter(pl.col("depth") == d).sort("lr")
        tested = g.filter(pl.col("decision") != TOO_FEW)
        if tested.is_empty():
            parts.append(Part(NO_DATA, int(g["pairs"].max()),
                              f"depth {d}: needs >= 2 paired seeds"))
            continue
        informative = tested.filter("informative")
        # the fewest paired seeds of the decided cells (an undecided bisection LR does not count)
        decided = informative.filter(pl.col("decision") != UNDETERMINED)
        n = int((decided if decided.height else tested)["pairs"].min())
        here = (pl.col("compared_arm") == on) & (pl.col("depth") == d)
        t, b = thresholds.filter(here), best.filter(here)
        top = informative.filter(pl.col("decision") == OFF_WORSE).sort("mean_gap").tail(1)
        largest = "" if top.is_empty() else " (largest gap {} at lr {}, q {})".format(
            _effect(top["mean_gap"][0], top["ci_lo"][0], top["ci_hi"][0]), _lr(top["lr"][0]),
            _q(top["q_off_worse"][0]))
        outcomes = "; ".join(
            f"{k} at {'lr ' if k == OFF_WORSE else ''}{_lrs(lrs)}"
            + (largest if k == OFF_WORSE else "")
            for k in (OFF_WORSE, NO_DIFFERENCE, ON_WORSE, UNDETERMINED)
            if (lrs := _lrs_at(informative, k))) or "no informative LR"
        text = (f"depth {d}: {outcomes}"
                + (f"; {tested.height - informative.height} LRs where neither arm learned"
                   if tested.height > informative.height else "")
                + (f"; onset {t['onset'][0]}" if t.height and t["onset"][0] else "")
                + ("" if b.is_empty() else
                   f"; best loss off - on {_effect(b['mean_gap'][0], b['ci_lo'][0], b['ci_hi'][0])}"
                   f" (q {_q(b['q_off_worse'][0])})")
                + f" (n={n})")
        parts.append(Part(h1_direction(informative), n, text))
    family = int(mine["family_size"].max() or 0) if mine.height else 0
    return _row("H1", on, f"{control_words(on)}'s effect on final loss is LR-conditional: none "
                "at low LR, large at high LR", parts, "depths", family)


def _h2(on: str, h2: pl.DataFrame) -> dict:
    """Two parts, max usable LR and LR sensitivity, each decided on its pooled tests."""
    mine = h2.filter(pl.col("compared_arm") == on)
    parts, shown = [], {}
    for measure in H2_MEASURES:
        pooled = mine.filter((pl.col("measure") == measure) & pl.col("depth").is_null())
        if pooled.is_empty():
            continue
        r = pooled.row(0, named=True)
        way = {"for": FOR, "against": AGAINST, "equivalent": AGAINST,
               TOO_FEW: NO_DATA}.get(r["decision"], UNCLEAR)
        effect = (f"x{_effect(r['effect'], r['ci_lo'], r['ci_hi'], '.3g')}"
                  if measure == MAX_USABLE else _effect(r["effect"], r["ci_lo"], r["ci_hi"]))
        depth_rows = mine.filter((pl.col("measure") == measure)
                                 & pl.col("depth").is_not_null()).sort("depth")
        by_depth = ", ".join(f"depth {d['depth']} {d['per_seed']}"
                             for d in depth_rows.iter_rows(named=True))
        text = (f"{measure} {effect} over {r['pairs']} (depth, seed) pairs, {r['decision']} "
                f"(q for {_q(r['q_for'])}, against {_q(r['q_against'])}, equivalent "
                f"{_q(r['q_equivalent'])}; smallest attainable p {_q(r['smallest_p'])})"
                + (f"; {r['note']}" if r["note"] else "")
                + (f"; per seed: {by_depth}" if by_depth else ""))
        seeds = int(depth_rows["pairs"].min()) if depth_rows.height else r["pairs"]
        parts.append(Part(way, seeds, text))
        shown[measure] = combine([parts[-1]])
    verdict = combine(parts)
    verdict += " (" + "; ".join(f"{m}: {v}" for m, v in shown.items()) + ")" if shown else ""
    family = int(mine["family_size"].max() or 0) if mine.height else 0
    return _row("H2", on, f"{control_words(on)} raises the max usable LR and lowers LR "
                "sensitivity", parts, "measures", family, verdict, S.HOLM)


def _h3(on: str, h3: pl.DataFrame, thresholds: pl.DataFrame) -> dict:
    claim = "the onset LR falls with depth"
    t = thresholds.filter((pl.col("compared_arm") == on) & (pl.col("seeds") >= 2)).sort("depth")
    per_depth = "; ".join(f"depth {r['depth']}: onset {r['onset'] or r['note']}"
                          for r in t.iter_rows(named=True))
    mine = h3.filter(pl.col("compared_arm") == on)
    if mine.is_empty():
        part = Part(NO_DATA, 0, (per_depth + "; " if per_depth else "")
                    + "needs >= 2 depths with an onset estimate (>= 2 paired seeds)")
        return _row("H3", on, claim, [part], "slopes", 0, correction=S.HOLM)
    r = mine.row(0, named=True)
    n = int(t["seeds"].min()) if t.height else 0
    way = {"falls": FOR, "rises": AGAINST, "equal": AGAINST}.get(r["decision"], UNCLEAR)
    text = (f"{per_depth}; slope of log10(onset) on log2(depth): {_shift(r['slope'])} "
            f"decades per doubling [{_shift(r['ci_lo'])}, {_shift(r['ci_hi'])}] "
            f"{r['decision']} (q fall {_q(r['q_fall'])}, rise {_q(r['q_rise'])}, equal "
            f"{_q(r['q_equal'])}; {r['censored_share']:.0%} of draws with an onset at a bound)"
            + (f"; {r['note']}" if r["note"] else ""))
    return _row("H3", on, claim, [Part(way, n, text)], "slopes", int(r["family_size"]),
                correction=S.HOLM)


def _shift(x: float | None) -> str:
    return "undefined" if x is None or math.isnan(x) else f"{x:+.2f}"
