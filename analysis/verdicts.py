"""The verdicts on H1-H3, from effects with intervals and tests with error control.

Each hypothesis (per compared arm) is one family of pre-specified, one-directional tests,
adjusted together by Benjamini-Hochberg (analysis.stats); the family's size is printed beside
its verdict. "No difference" and "not needed" come only from an equivalence test (TOST).
Per depth (H1, H2) or per pair of depths (H3) the data point for, against or neither way; the
label says what they can bear ("supported" needs 3 paired seeds, "partly" when some parts are
undecided). Every rule is written out in docs/report.md; the numbers come from
analysis.metrics.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from . import stats as S
from .metrics import (
    ARM,
    NO_DIFFERENCE,
    OFF,
    OFF_WORSE,
    ON_WORSE,
    TOO_FEW,
    UNDETERMINED,
    Options,
    control_words,
    h1_tests,
    lr_sensitivity_per_seed,
    max_stable_lr_per_seed,
    necessity_threshold,
    on_kinds,
    paired_gaps,
    threshold_draws,
)

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, MIXED, NO_DATA = (
    "supported", "not supported", "inconclusive", "mixed", "not enough data")
FOR, AGAINST, UNCLEAR = "for", "against", "unclear"


@dataclass(frozen=True)
class Part:
    """One per-depth (or per-measure) judgement: which way the data point, on how many paired
    seeds, and the numbers behind it."""

    direction: str
    seeds: int
    text: str


def label(direction: str, seeds: int) -> str:
    """The verdict a direction can bear on `seeds` paired seeds: with fewer than 3 seeds the
    data only suggest, never support or refute."""
    if direction == FOR:
        return SUPPORTED if seeds >= 3 else f"suggestive (n={seeds})"
    if direction == AGAINST:
        return NOT_SUPPORTED if seeds >= 3 else f"suggestive against (n={seeds})"
    return INCONCLUSIVE if direction == UNCLEAR else NO_DATA


def combine(parts: list[Part]) -> str:
    """Parts without data are left out; decided parts must agree, else "mixed". A claim that
    holds in some parts while others are unclear is only "partly" supported; one part against
    it is enough for "not supported". If none is decided, "inconclusive" (or "not enough data"
    when no part had data at all)."""
    decided = [p for p in parts if p.direction in (FOR, AGAINST)]
    ways = {p.direction for p in decided}
    if len(ways) > 1:
        return MIXED
    if ways:
        way = ways.pop()
        verdict = label(way, min(p.seeds for p in decided))
        unclear = any(p.direction == UNCLEAR for p in parts)
        return f"partly {verdict}" if way == FOR and unclear else verdict
    return INCONCLUSIVE if any(p.direction == UNCLEAR for p in parts) else NO_DATA


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


VERDICT_SCHEMA = {"hypothesis": pl.String, "on_kind": pl.String, "claim": pl.String,
                  "verdict": pl.String, "family_size": pl.Int64, "correction": pl.String,
                  "seeds": pl.Int64, "measured": pl.String, "evidence": pl.String}


def verdicts(points: pl.DataFrame, options: Options | None = None) -> pl.DataFrame:
    """H1-H3 per on_kind (every arm but the off arm, each against the off arm by the same
    rules), with the family size, the seeds and the per-depth numbers behind each verdict."""
    return study_verdicts(points, options or Options())[0]


def study_verdicts(points: pl.DataFrame, options: Options
                   ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(verdicts, H1 best-loss gaps, H2 tests, H3 depth-pair tests): the verdict table and the
    tables of the tests behind it that the gap table does not already hold."""
    gaps, best = h1_tests(points, options)
    thresholds = necessity_threshold(points, options, gaps)
    h2 = h2_tests(points, options)
    h3 = h3_tests(points, gaps, options)
    rows = []
    for on in on_kinds(points):
        rows += [_h1(on, gaps, best, thresholds), _h2(on, h2), _h3(on, h3, thresholds)]
    return pl.DataFrame(rows, schema=VERDICT_SCHEMA), best, h2, h3


def _row(hypothesis: str, on: str, claim: str, parts: list[Part], unit: str, family: int,
         verdict: str | None = None) -> dict:
    judged = sum(p.direction != NO_DATA for p in parts)
    decided = sum(p.direction in (FOR, AGAINST) for p in parts)
    seeds = [p.seeds for p in parts if p.direction != NO_DATA]
    return {"hypothesis": hypothesis, "on_kind": on, "claim": claim,
            "verdict": verdict or combine(parts), "family_size": family,
            "correction": S.CORRECTION, "seeds": min(seeds) if seeds else 0,
            "measured": f"{decided} of {len(parts)} {unit if len(parts) != 1 else unit[:-1]} "
                        f"decided ({judged} had the data)",
            "evidence": "; ".join(p.text for p in parts) or "no paired runs"}


# --- H1 -----------------------------------------------------------------------------------------

def _h1(on: str, gaps: pl.DataFrame, best: pl.DataFrame, thresholds: pl.DataFrame) -> dict:
    """Per depth: FOR when off is worse at some LR and a lower LR shows no difference (TOST);
    AGAINST when the on arm is worse anywhere, when off is worse at every informative LR (the
    effect is not LR-conditional), or when every informative LR shows no difference; else
    UNCLEAR."""
    mine = gaps.filter(pl.col("on_kind") == on)
    parts = []
    for d in sorted(mine["depth"].unique().to_list()):
        g = mine.filter(pl.col("depth") == d).sort("lr")
        tested = g.filter(pl.col("decision") != TOO_FEW)
        if tested.is_empty():
            parts.append(Part(NO_DATA, int(g["pairs"].max()),
                              f"depth {d}: needs >= 2 paired seeds"))
            continue
        informative = tested.filter("informative")
        # the usual number of paired seeds (a boundary-refinement LR of some seeds has fewer)
        n = int(tested["pairs"].median())
        by = {k: informative.filter(pl.col("decision") == k)["lr"].to_list()
              for k in (OFF_WORSE, NO_DIFFERENCE, ON_WORSE, UNDETERMINED)}
        worse, calm, harm = by[OFF_WORSE], by[NO_DIFFERENCE], by[ON_WORSE]
        if harm:
            direction = AGAINST
        elif worse and any(lr < min(worse) for lr in calm):
            direction = FOR
        elif worse and len(worse) == informative.height:
            direction = AGAINST  # needed at every informative LR: not LR-conditional
        elif not worse and informative.height and len(calm) == informative.height:
            direction = AGAINST  # no effect anywhere
        else:
            direction = UNCLEAR
        t = thresholds.filter((pl.col("on_kind") == on) & (pl.col("depth") == d))
        b = best.filter((pl.col("on_kind") == on) & (pl.col("depth") == d))
        strongest = informative.filter(pl.col("decision") == OFF_WORSE).sort("mean_gap").tail(1)
        # only the outcomes some LR had: a list is never empty ("at lr none")
        outcomes = "; ".join(
            f"{words} at {'lr ' if words == 'off worse' else ''}{_lrs(lrs)}" + extra
            for words, lrs, extra in (
                ("off worse", worse, "" if strongest.is_empty() else
                 " (largest gap {} at lr {}, q {})".format(
                     _effect(strongest["mean_gap"][0], strongest["ci_lo"][0],
                             strongest["ci_hi"][0]), _lr(strongest["lr"][0]),
                     _q(strongest["q_off_worse"][0]))),
                ("no difference", calm, ""), ("on worse", harm, ""),
                ("undetermined", by[UNDETERMINED], ""))
            if lrs) or "no informative LR"
        text = (f"depth {d}: {outcomes}"
                + (f"; {tested.height - informative.height} LRs where neither arm learned"
                   if tested.height > informative.height else "")
                + (f"; threshold {t['threshold'][0]}" if t.height and t["threshold"][0] else "")
                + ("" if b.is_empty() else
                   f"; best loss off - on {_effect(b['mean_gap'][0], b['ci_lo'][0], b['ci_hi'][0])}"
                   f" (q {_q(b['q_off_worse'][0])})")
                + f" (n={n})")
        parts.append(Part(direction, n, text))
    family = int(mine["family_size"].max() or 0) if mine.height else 0
    return _row("H1", on, f"{control_words(on)}'s effect on final loss is LR-conditional: none "
                "at low LR, large at high LR", parts, "depths", family)


# --- H2 -----------------------------------------------------------------------------------------

H2_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "measure": pl.String, "pairs": pl.Int64,
             "effect": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
             "unit": pl.String, "per_seed": pl.String, "p_for": pl.Float64,
             "p_against": pl.Float64, "p_equivalent": pl.Float64, "q_for": pl.Float64,
             "q_against": pl.Float64, "q_equivalent": pl.Float64, "family_size": pl.Int64,
             "decision": pl.String, "note": pl.String}

MAX_STABLE, MAX_USABLE, SENSITIVITY = "max stable LR", "max usable LR", "LR sensitivity"
LR_MEASURES = (MAX_STABLE, MAX_USABLE)


def _paired_values(per_seed: pl.DataFrame, on: str, depth: int, column: str) -> pl.DataFrame:
    d = per_seed.filter(pl.col("depth") == depth)
    off = d.filter(pl.col(ARM) == OFF).select("seed", off=column)
    return off.join(d.filter(pl.col(ARM) == on).select("seed", on=column), on="seed")


def h2_tests(points: pl.DataFrame, options: Options) -> pl.DataFrame:
    """Per (depth, on_kind) and measure, three one-directional tests over seeds:
    max stable LR (not diverged) and max usable LR (neither diverged nor degraded): log(on /
    off) > 0 (for), < 0 (against), |log ratio| < log(lr_ratio_margin) (TOST, against); equal in
    every seed is "against" outright (equal at the resolution of the grid and bisection), a seed
    where off never failed leaves only a lower bound (untested).
    LR sensitivity: off - on > 0 (for), < 0 (against), |off - on| < min_gap (TOST, against).
    One family per on_kind, Benjamini-Hochberg."""
    stable = max_stable_lr_per_seed(points, options).with_columns(
        log_lr=pl.col("max_stable_lr").log(), log_usable=pl.col("max_usable_lr").log())
    sensitivity = lr_sensitivity_per_seed(points)
    rows = []
    for on in on_kinds(points):
        for d in sorted(points["depth"].unique().to_list()):
            for measure, column, censored in ((MAX_STABLE, "log_lr", "censored"),
                                              (MAX_USABLE, "log_usable", "usable_censored")):
                pairs = _paired_values(stable, on, d, column)
                if not pairs.height:
                    continue
                diffs = (pairs["on"] - pairs["off"]).to_list()
                off_censored = stable.filter((pl.col("depth") == d) & (pl.col(ARM) == OFF)
                                             & pl.col(censored)).height
                row = _h2_row(on, d, measure, diffs, math.log(options.lr_ratio_margin),
                              tested=not off_censored and len(diffs) >= 2)
                row["per_seed"] = ", ".join(f"x{math.exp(x):.3g}" for x in diffs)
                if off_censored:
                    row["note"] = (f"off never {'diverged' if measure == MAX_STABLE else 'diverged or degraded'} "
                                   f"in {off_censored} seeds: a lower bound only")
                elif len(diffs) >= 2 and all(x == 0 for x in diffs):
                    row["decision"] = "equal in every seed"
                rows.append(row)
            s = _paired_values(sensitivity, on, d, "lr_sensitivity").drop_nulls()
            if s.height:
                drops = (s["off"] - s["on"]).to_list()
                row = _h2_row(on, d, SENSITIVITY, drops, options.min_gap,
                              tested=len(drops) >= 2)
                row["per_seed"] = ", ".join(f"{x:+.3g}" for x in drops)
                row["note"] = f"off {s['off'].mean():.3g} vs on {s['on'].mean():.3g} (seed means)"
                rows.append(row)
    for on in {r["on_kind"] for r in rows}:
        mine = [r for r in rows if r["on_kind"] == on]
        keys = [(r, k) for r in mine for k in ("p_for", "p_against", "p_equivalent")]
        S.adjust_family(keys, options.alpha)
    for r in rows:
        if r["decision"] is not None:
            continue
        a = options.alpha
        if r["pairs"] < 2 or r["p_for"] is None:
            r["decision"] = TOO_FEW if r["pairs"] < 2 else UNDETERMINED
        elif r["q_for"] < a and r["effect"] > (1 if r["measure"] in LR_MEASURES else 0) and (
                r["measure"] in LR_MEASURES or r["effect"] >= options.min_gap):
            r["decision"] = "for"
        elif r["q_against"] < a or r["q_equivalent"] < a:
            r["decision"] = "against" if r["q_against"] < a else "equivalent"
        else:
            r["decision"] = UNDETERMINED
    return pl.DataFrame(rows, schema=H2_SCHEMA).sort("on_kind", "measure", "depth")


def _h2_row(on: str, depth: int, measure: str, diffs: list[float], margin: float,
            tested: bool) -> dict:
    lo, hi = S.interval(diffs)
    log_scale = measure in LR_MEASURES
    return {"depth": depth, "on_kind": on, "measure": measure, "pairs": len(diffs),
            "effect": math.exp(np.mean(diffs)) if log_scale else float(np.mean(diffs)),
            "ci_lo": None if lo is None else (math.exp(lo) if log_scale else lo),
            "ci_hi": None if hi is None else (math.exp(hi) if log_scale else hi),
            "unit": "ratio on/off (geometric mean)" if log_scale else "nats (off - on)",
            "p_for": S.p_greater(diffs) if tested else None,
            "p_against": S.p_less(diffs) if tested else None,
            "p_equivalent": S.p_equivalent(diffs, margin) if tested else None,
            "q_for": None, "q_against": None, "q_equivalent": None, "family_size": 0,
            "decision": None, "note": ""}


# An LR ratio's interval wider than this (four decades) says more than any preset's LR grid
# can measure: with 2 seeds a t-interval on the log ratio can span 1e-10 to 1e9
MAX_LR_SPAN = 1e4


def _h2(on: str, h2: pl.DataFrame) -> dict:
    mine = h2.filter(pl.col("on_kind") == on)
    verdicts, all_parts = {}, []
    for measure in (MAX_STABLE, MAX_USABLE, SENSITIVITY):
        parts = []
        for r in mine.filter(pl.col("measure") == measure).iter_rows(named=True):
            way = {"for": FOR, "against": AGAINST, "equivalent": AGAINST,
                   "equal in every seed": AGAINST, TOO_FEW: NO_DATA}.get(r["decision"], UNCLEAR)
            fmt = ".3g" if measure in LR_MEASURES else "+.3f"
            if measure in LR_MEASURES and r["ci_lo"] and r["ci_hi"] \
                    and r["ci_hi"] / r["ci_lo"] > MAX_LR_SPAN:  # wider than any LR grid
                effect = f"x{r['effect']:.3g} (too few seeds to bound it)"
            else:
                effect = (f"x{_effect(r['effect'], r['ci_lo'], r['ci_hi'], fmt)}"
                          if measure in LR_MEASURES
                          else _effect(r["effect"], r["ci_lo"], r["ci_hi"]))
            parts.append(Part(way, r["pairs"], (
                f"depth {r['depth']}: {measure} {effect} per seed {r['per_seed']}, "
                f"{r['decision']} (q for {_q(r['q_for'])}, n={r['pairs']})"
                + (f"; {r['note']}" if r["note"] else ""))))
        verdicts[measure] = combine(parts)
        all_parts += parts
    both = set(verdicts.values())
    supported = any(v.startswith((SUPPORTED, "partly supported")) for v in verdicts.values())
    verdict = both.pop() if len(both) == 1 else (
        ("partly supported" if supported else combine(all_parts))
        + " (" + "; ".join(f"{m}: {v}" for m, v in verdicts.items()) + ")")
    family = int(mine["family_size"].max() or 0) if mine.height else 0
    return _row("H2", on, f"{control_words(on)} raises the max stable (and usable) LR and "
                "lowers LR sensitivity", all_parts, "parts", family, verdict)


# --- H3 -----------------------------------------------------------------------------------------

H3_SCHEMA = {"on_kind": pl.String, "depth_shallow": pl.Int64, "depth_deep": pl.Int64,
             "shift_decades": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
             "undefined_share": pl.Float64, "p_fall": pl.Float64, "p_rise": pl.Float64,
             "p_equal": pl.Float64, "q_fall": pl.Float64, "q_rise": pl.Float64,
             "q_equal": pl.Float64, "family_size": pl.Int64, "decision": pl.String}


def _boot_p(hits: np.ndarray) -> float:
    """A bootstrap p-value: the share of resamples on the null side, counted with the observed
    sample as one more (never 0)."""
    return float((1 + hits.sum()) / (len(hits) + 1))


def h3_tests(points: pl.DataFrame, gaps: pl.DataFrame, options: Options) -> pl.DataFrame:
    """Per pair of depths (shallow, deep), the shift of the necessity threshold in decades
    (log10 deep - log10 shallow) with its 95% bootstrap interval, and three bootstrap tests:
    falls (shift < 0), rises (shift > 0), equal (|shift| < threshold_margin, TOST on the
    bootstrap distribution). Seeds are resampled independently per depth. A resample where a
    threshold is censored gives an infinite shift, and one where both are censored the same way
    gives no shift at all: it counts against every claim, so a censored depth can never make a
    trend. One family per on_kind, Benjamini-Hochberg."""
    draws = threshold_draws(paired_gaps(points, options), gaps, options)
    rows = []
    for on in on_kinds(points):
        depths = sorted(d for (k, d) in draws if k == on)
        for shallow, deep in itertools.combinations(depths, 2):
            p_s, b_s, _ = draws[(on, shallow)]
            p_d, b_d, _ = draws[(on, deep)]
            with np.errstate(invalid="ignore"):
                shift, point = b_d - b_s, p_d - p_s
            undefined = np.isnan(shift)
            finite = shift[~undefined]
            lo, hi = (np.percentile(finite, [2.5, 97.5], method="inverted_cdf")
                      if finite.size else (np.nan, np.nan))
            m = options.threshold_margin
            rows.append({
                "on_kind": on, "depth_shallow": shallow, "depth_deep": deep,
                "shift_decades": float(point), "ci_lo": float(lo), "ci_hi": float(hi),
                "undefined_share": float(undefined.mean()),
                "p_fall": _boot_p(undefined | (shift >= 0)),
                "p_rise": _boot_p(undefined | (shift <= 0)),
                "p_equal": max(_boot_p(undefined | (shift >= m)),
                               _boot_p(undefined | (shift <= -m))),
                "q_fall": None, "q_rise": None, "q_equal": None, "family_size": 0,
                "decision": None})
    for on in {r["on_kind"] for r in rows}:
        mine = [r for r in rows if r["on_kind"] == on]
        keys = [(r, k) for r in mine for k in ("p_fall", "p_rise", "p_equal")]
        S.adjust_family(keys, options.alpha)
    for r in rows:
        a = options.alpha
        r["decision"] = ("falls" if r["q_fall"] < a else "rises" if r["q_rise"] < a
                         else "equal" if r["q_equal"] < a else UNDETERMINED)
    return pl.DataFrame(rows, schema=H3_SCHEMA).sort("on_kind", "depth_shallow", "depth_deep")


def _shift(x: float) -> str:
    return "undefined" if math.isnan(x) else ("+inf" if x == math.inf else "-inf"
                                              if x == -math.inf else f"{x:+.2f}")


def _h3(on: str, h3: pl.DataFrame, thresholds: pl.DataFrame) -> dict:
    """FOR when some pair of depths shows a significant fall and none a rise; AGAINST when some
    pair rises, or when every pair is equal within threshold_margin; else UNCLEAR."""
    claim = "the necessity LR falls with depth"
    t = thresholds.filter((pl.col("on_kind") == on) & (pl.col("seeds") >= 2)).sort("depth")
    per_depth = "; ".join(f"depth {r['depth']}: {r['threshold'] or r['note']}"
                          for r in t.iter_rows(named=True))
    mine = h3.filter(pl.col("on_kind") == on)
    if mine.is_empty():
        part = Part(NO_DATA, 0, (per_depth + "; " if per_depth else "")
                    + "needs >= 2 depths with a threshold estimate (>= 2 paired seeds)")
        return _row("H3", on, claim, [part], "depth pairs", 0)
    pairs = "; ".join(
        f"{r['depth_shallow']}->{r['depth_deep']}: {_shift(r['shift_decades'])} decades "
        f"[{_shift(r['ci_lo'])}, {_shift(r['ci_hi'])}] {r['decision']} (q fall "
        f"{_q(r['q_fall'])})" for r in mine.iter_rows(named=True))
    decisions = mine["decision"].to_list()
    n = int(t["seeds"].min()) if t.height else 0
    if "rises" in decisions:
        way = AGAINST
    elif "falls" in decisions:
        way = FOR
    elif all(d == "equal" for d in decisions):
        way = AGAINST
    else:
        way = UNCLEAR
    part = Part(way, n, f"{per_depth}; shift of the threshold, deep minus shallow: {pairs}")
    return _row("H3", on, claim, [part], "depth pairs", int(mine["family_size"].max()))
