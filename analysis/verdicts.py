"""The verdicts on H1-H3: per depth and compared arm, each part points for, against or unclear
on n paired seeds, and the label says what the data can bear ("supported" needs 3 seeds, "partly"
when some parts are undecided). The rules are written out in docs/report.md; the numbers they
judge (gaps, paired tests, thresholds, per-seed metrics) come from analysis.metrics.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from .metrics import (ARM, OFF, Options, control_words, gap_table, lr_sensitivity_per_seed,
                      max_stable_lr_per_seed, necessity_threshold, on_kinds, paired_t,
                      seeds_label)

# --- hypotheses ---------------------------------------------------------------------------------

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, MIXED, NO_DATA = (
    "supported", "not supported", "inconclusive", "mixed", "not enough data")
FOR, AGAINST, UNCLEAR = "for", "against", "unclear"


@dataclass(frozen=True)
class Part:
    """One per-depth judgement: which way the data point (for / against / unclear / no data),
    on how many paired seeds, and the numbers behind it."""

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


def _p(p: float | None) -> str:
    return "-" if p is None else ("< 1e-4" if p < 1e-4 else f"{p:.2g}")


def verdicts(points: pl.DataFrame, options: Options | None = None) -> pl.DataFrame:
    """H1-H3 per on_kind (every arm but the off arm, each against the off arm by the same
    rules), each with the per-depth numbers behind it (rules: docs/report.md).

    H1 (the effect is LR-conditional): per depth, for when a necessity threshold exists and a
    lower LR shows no difference; against when off is needed at every LR run; unclear when no
    LR shows a consistent gap (or the grid starts above the threshold).
    H2 (QK-norm raises the max stable LR and lowers LR sensitivity): per depth and part, a
    one-sided paired t-test over seeds (log max stable LR on - off; sensitivity off - on).
    H3 (the necessity LR falls with depth): the thresholds never rise with depth and fall at
    least once. With fewer than 3 paired seeds a verdict is "suggestive (n=2)" at most.
    """
    options = options or Options()
    gaps = gap_table(points, options)
    thresholds = necessity_threshold(points, options, gaps)
    rows = []
    for on in on_kinds(points):
        rows += [_h1(on, gaps, thresholds), _h2(on, points, options), _h3(on, thresholds)]
    return pl.DataFrame(rows, schema={"hypothesis": pl.String, "on_kind": pl.String,
                                      "claim": pl.String, "verdict": pl.String,
                                      "measured": pl.String, "evidence": pl.String})


def _row(hypothesis: str, on: str, claim: str, parts: list[Part], unit: str) -> dict:
    judged = sum(p.direction != NO_DATA for p in parts)
    decided = sum(p.direction in (FOR, AGAINST) for p in parts)
    return {"hypothesis": hypothesis, "on_kind": on, "claim": claim, "verdict": combine(parts),
            "measured": f"{decided} of {len(parts)} {unit if len(parts) != 1 else unit[:-1]} "
                        f"decided ({judged} had the data)",
            "evidence": "; ".join(p.text for p in parts) or "no paired runs"}


def _h1(on: str, gaps: pl.DataFrame, thresholds: pl.DataFrame) -> dict:
    parts = []
    for t in thresholds.filter(pl.col("on_kind") == on).iter_rows(named=True):
        d = t["depth"]
        g = gaps.filter((pl.col("on_kind") == on) & (pl.col("depth") == d)
                        & pl.col("significant").is_not_null()).sort("lr")
        if g.is_empty():
            parts.append(Part(NO_DATA, t["seeds"], f"depth {d}: needs >= 2 paired seeds"))
            continue
        n = int(g["pairs"].min())
        if t["threshold_lr"] is None:
            off_div = g.filter(pl.col("off_diverged") == pl.col("pairs")).height > 0
            parts.append(Part(UNCLEAR, n, f"depth {d}: off never consistently worse up to lr "
                              f"{g['lr'].max():.3g}" + ("" if off_div else
                                                         "; off never diverged (grid too low)")))
            continue
        lower = g.filter(pl.col("lr") < t["threshold_lr"])
        calm = lower.filter("no_difference")
        if calm.height:
            direction = FOR
        elif lower.height and lower["worse"].all():
            direction = AGAINST  # needed at every LR run, not only at high LR
        else:
            direction = UNCLEAR
        if not lower.height:
            direction = AGAINST
        parts.append(Part(direction, n, (
            f"depth {d}: needed from lr {_lr(t['threshold_lr'])} (gaps {t['seed_gaps_at_threshold']}, "
            f"{t['spread']}); {calm.height} of {lower.height} lower LRs show no difference"
            + (f" (lowest lr {lower['lr'][0]:.3g}: gaps {lower['seed_gaps'][0]})"
               if lower.height else ""))))
    return _row("H1", on, f"{control_words(on)}'s effect on final loss is LR-conditional: none "
                "at low LR, large at high LR", parts, "depths")


def _paired_values(per_seed: pl.DataFrame, on: str, depth: int, column: str) -> pl.DataFrame:
    d = per_seed.filter(pl.col("depth") == depth)
    off = d.filter(pl.col(ARM) == OFF).select("seed", off=column)
    return off.join(d.filter(pl.col(ARM) == on).select("seed", on=column), on="seed")


def _judge(diffs: list[float], alpha: float, min_effect: float = 0.0
           ) -> tuple[str, float | None, float | None]:
    """FOR when mean(diffs) > 0 is significant and at least min_effect, AGAINST when the same
    holds for < 0, else UNCLEAR."""
    _, p_for = paired_t(diffs)
    _, p_against = paired_t([-x for x in diffs])
    if p_for is None:
        return UNCLEAR, None, None
    mean = float(np.mean(diffs))
    if p_for < alpha and mean >= min_effect:
        return FOR, p_for, p_against
    if p_against < alpha and -mean >= min_effect:
        return AGAINST, p_for, p_against
    return UNCLEAR, p_for, p_against


def _h2(on: str, points: pl.DataFrame, options: Options) -> dict:
    stable = max_stable_lr_per_seed(points)
    sensitivity = lr_sensitivity_per_seed(points)
    parts = []
    for d in sorted(points["depth"].unique().to_list()):
        pairs = _paired_values(stable.with_columns(log_lr=pl.col("max_stable_lr").log()),
                               on, d, "log_lr")
        if pairs.is_empty():
            continue
        n = pairs.height
        off_censored = stable.filter((pl.col("depth") == d) & (pl.col(ARM) == OFF)
                                     & pl.col("censored")).height
        ratios = (pairs["on"] - pairs["off"]).exp().to_list()
        values = ", ".join(f"x{r:.3g}" for r in ratios)
        if n < 2:
            parts.append(Part(NO_DATA, n, f"depth {d}: max stable LR on/off {values} from one "
                              "seed (no spread to judge by)"))
        elif off_censored:
            parts.append(Part(UNCLEAR, n, f"depth {d}: max stable LR not measurable (off never "
                              f"diverged in {off_censored} seeds: a lower bound only)"))
        else:
            way, p, _ = _judge((pairs["on"] - pairs["off"]).to_list(), options.alpha)
            parts.append(Part(way, n, f"depth {d}: max stable LR on/off per seed {values} "
                              f"({seeds_label(n)}, p {_p(p)})"))
        s = _paired_values(sensitivity, on, d, "lr_sensitivity").drop_nulls()
        if s.height < 2:
            parts.append(Part(NO_DATA, s.height, f"depth {d}: LR sensitivity needs >= 2 seeds "
                              "with a defined value in both arms"))
            continue
        drops = (s["off"] - s["on"]).to_list()
        way, p, _ = _judge(drops, options.alpha, options.min_gap)
        parts.append(Part(way, s.height, (
            f"depth {d}: LR sensitivity off {s['off'].mean():.3g} vs on {s['on'].mean():.3g}, "
            f"drop per seed {', '.join(f'{x:+.3g}' for x in drops)} "
            f"({seeds_label(s.height)}, p {_p(p)})")))
    return _row("H2", on, f"{control_words(on)} raises the max stable LR and lowers LR "
                "sensitivity", parts,
                "parts")


def _h3(on: str, thresholds: pl.DataFrame) -> dict:
    t = thresholds.filter((pl.col("on_kind") == on) & (pl.col("seeds") >= 2)).sort("depth")
    claim = "the necessity LR falls with depth"
    def one(r: dict) -> str:
        if r["threshold_lr"] is None:
            return f"depth {r['depth']}: no threshold up to lr {_lr(r['lr_max'])} ({r['spread']})"
        below = (f"not needed at {_lr(r['not_needed_below'])}" if r["not_needed_below"]
                 else "needed from the smallest LR")
        return f"depth {r['depth']}: {_lr(r['threshold_lr'])} ({below}, {r['spread']})"

    text = "; ".join(one(r) for r in t.iter_rows(named=True))
    if t.height < 2:
        part = Part(NO_DATA, 0, (text + "; " if text else "")
                    + "needs >= 2 depths with >= 2 paired seeds")
        return _row("H3", on, claim, [part], "depth pairs")
    n = int(t["seeds"].min())
    values = [math.inf if v is None else v for v in t["threshold_lr"].to_list()]
    moves = [b - a for a, b in itertools.pairwise(values) if not (math.isinf(a) and math.isinf(b))]
    if all(math.isinf(v) for v in values):
        part = Part(UNCLEAR, n, text + "; no depth has a threshold within the LRs run")
    elif any(m > 0 for m in moves):
        part = Part(AGAINST, n, text + "; the threshold rises with depth somewhere")
    elif any(m < 0 for m in moves):
        part = Part(FOR, n, text + "; it never rises and falls at least once (grid resolution)")
    else:
        part = Part(UNCLEAR, n, text + "; equal at every depth on this grid")
    return _row("H3", on, claim, [part], "depth pairs")
