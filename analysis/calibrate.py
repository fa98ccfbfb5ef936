"""Calibration of the analysis plan (`just calibrate`; docs/report.md): the whole procedure run
on simulated studies of known truth (analysis.simulate), counting every kind of false claim and
measuring power and the coverage of the onset's and H3's slope intervals."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.errors import UsageError

from . import stats as S
from .hypotheses import MAX_USABLE, NO_DIFFERENCE, OFF_WORSE, ON_WORSE, SENSITIVITY
from .metrics import Options, lr_sensitivity_per_seed
from .scatter import fitted
from .simulate import (DEPTHS, LRS, NOISE, REFINE_STEPS, SCENARIOS, SLOPE_TOLERANCE,  # noqa: F401
                       UNIGRAM, Noise, Scenario, World, expected_gap, fit_failures, fit_noise,
                       make_world, population_onset, sweep)
from .verdicts import study_verdicts


@dataclass(frozen=True)
class Truth:
    """What the noiseless study says: the yardstick of every claim."""

    h1: bool
    usable_effect: float  # log(on / off) of the failure edges above the best LR, over depths
    sensitivity_drop: float  # off - on, pooled over depths
    onsets: dict[int, float]  # log10 LR (+inf: no onset)
    slope: float  # NaN without an onset


def _edge(world: World, depth: int, arm: str) -> float:
    degrade = world.degrade[(depth, arm)][0] if world.degrade else math.inf
    return min(float(world.boundary[(depth, arm)][0]), float(degrade),
               math.log10(world.noise.collapse_lr))


def truth_of(scenario: Scenario, noise: Noise, seeds: int, options: Options) -> Truth:
    """The noiseless study's claims; where seeds' onsets scatter, over 25 seeds at the normal
    quantiles of their shifts, and each depth's onset the seeds' mean gap's."""
    world = make_world(scenario, noise, max(seeds, 25) if noise.onset_sd else seeds,
                       options.min_gap, np.random.default_rng(0), noiseless=True)
    sens = lr_sensitivity_per_seed(sweep(world)).pivot("arm", index=["depth", "seed"],
                                                      values="lr_sensitivity")
    drop = float((sens["none"] - sens["rmsnorm"]).mean()) if "none" in sens.columns else 0.0
    usable = math.log(10) * float(np.mean([_edge(world, d, "rmsnorm") - _edge(world, d, "none")
                                           for d in DEPTHS]))
    if scenario.onset is None:
        return Truth(False, usable, drop, {d: math.inf for d in DEPTHS}, math.nan)
    onsets = {d: population_onset(scenario, d, options.min_gap, noise.onset_sd) for d in DEPTHS}
    slope = float(np.polyfit(np.log2(DEPTHS), [onsets[d] for d in DEPTHS], 1)[0])
    if abs(slope) < SLOPE_TOLERANCE:  # polyfit's rounding of an equal onset (2.5e-16) is 0
        slope = 0.0
    return Truth(True, usable, drop, onsets, slope)


def supported(verdict: str) -> bool:
    return verdict.startswith(("supported", "partly supported"))


def _score_h1(world: World, truth: Truth, verdict: str, gaps: pl.DataFrame, m: float) -> dict:
    bad_worse = bad_same = False
    for depth, lr, decision in gaps.select("depth", "lr", "decision").iter_rows():
        g = expected_gap(world.scenario, depth, lr, m, world.noise.onset_sd)
        bad_worse |= (decision == OFF_WORSE and g <= m) or (decision == ON_WORSE and g >= -m)
        bad_same |= decision == NO_DIFFERENCE and abs(g) >= m
    return {"H1 false supported": float(not truth.h1 and supported(verdict)),
            "H1 false not supported": float(truth.h1 and verdict == "not supported"),
            "H1 power": float(supported(verdict)) if truth.h1 else math.nan,
            "cells false needed": float(bad_worse), "cells false no difference": float(bad_same)}


def _score_h2(truth: Truth, h2: pl.DataFrame, options: Options) -> dict:
    pooled = h2.filter(pl.col("depth").is_null())
    decision = dict(zip(pooled["measure"], pooled["decision"]))
    out = {}
    for measure, effect, margin in ((MAX_USABLE, truth.usable_effect,
                                     math.log(options.lr_ratio_margin)),
                                    (SENSITIVITY, truth.sensitivity_drop, options.min_gap)):
        d = decision.get(measure)
        out[f"H2 {measure} false supported"] = float(d == "for" and effect <= margin)
        out[f"H2 {measure} false not supported"] = float(
            (d == "against" and effect >= -margin) or (d == "equivalent" and abs(effect) >= margin))
        out[f"H2 {measure} false no difference"] = float(d == "equivalent"
                                                         and abs(effect) >= margin)
        out[f"H2 {measure} power"] = float(d == "for") if effect > margin else math.nan
    return out


def _score_h3(truth: Truth, verdict: str, h3: pl.DataFrame, slope_margin: float) -> dict:
    row = h3.row(0, named=True) if h3.height else None
    d = row["decision"] if row else None
    s = truth.slope
    falls = not math.isnan(s) and s < 0
    covered = (float(row["ci_lo"] <= s <= row["ci_hi"])
               if row and not math.isnan(s) and not math.isnan(row["slope"]) else math.nan)
    return {"H3 false supported": float(supported(verdict) and not falls),
            "H3 false not supported": float(verdict == "not supported" and (
                (d == "rises" and not s > 0) or (d == "equal" and not abs(s) < slope_margin))),
            "H3 false no difference": float(d == "equal" and not abs(s) < slope_margin),
            "H3 false rises": float(d == "rises" and not s > 0),
            "H3 power": float(supported(verdict)) if falls else math.nan,
            "H3 slope coverage": covered}


def _onset_coverage(truth: Truth, onsets: pl.DataFrame) -> float:
    """The share of depths with a true onset inside the grid whose interval holds it."""
    hits = total = 0
    for r in onsets.iter_rows(named=True):
        t = truth.onsets.get(r["depth"], math.inf)
        if not -3 <= t <= math.log10(0.3):
            continue
        lo = math.log10(r["ci_lo"]) if r["ci_lo"] else -math.inf
        hi = math.log10(r["ci_hi"]) if r["ci_hi"] else math.inf
        hits += lo <= t <= hi
        total += 1
    return hits / total if total else math.nan


def judge(world: World, truth: Truth, options: Options) -> dict[str, float]:
    """Every claim of one simulated study scored against the truth (1: made and false)."""
    study = study_verdicts(sweep(world), options)
    verdict = dict(zip(study.verdicts["hypothesis"], study.verdicts["verdict"]))
    return {**_score_h1(world, truth, verdict["H1"], study.gaps, options.min_gap),
            **_score_h2(truth, study.h2, options),
            **_score_h3(truth, verdict["H3"], study.h3, options.slope_margin),
            "onset coverage": _onset_coverage(truth, study.thresholds)}


KINDS = ("false supported", "false not supported", "false no difference", "false needed",
         "false rises", "power", "coverage")


def _split(key: str) -> tuple[str, str]:
    kind = next(k for k in KINDS if key.endswith(k))
    return key[: -len(kind)].strip(), kind


def calibrate(studies: int, seeds: int = 5, noise: Noise = NOISE,
              scenarios: tuple[str, ...] = tuple(SCENARIOS)) -> pl.DataFrame:
    """Per scenario and claim: count, rate and Clopper-Pearson bound, or mean coverage."""
    options = Options()
    rows = []
    for name in scenarios:
        scenario = SCENARIOS[name]
        truth = truth_of(scenario, noise, seeds, options)
        rng = np.random.default_rng([0, seeds, list(SCENARIOS).index(name)])
        scores = [judge(make_world(scenario, noise, seeds, options.min_gap, rng), truth,
                        replace(options, draw_key=f"#{name}/{i}")) for i in range(studies)]
        for key in scores[0]:
            what, kind = _split(key)
            row = tally(scores, key, counted=kind != "coverage", false=kind.startswith("false"))
            if kind != "power" or row["studies"]:  # no power where the hypothesis is false
                rows.append({"scenario": name, "seeds": seeds, "hypothesis": what, "claim": kind,
                             **row})
    return pl.DataFrame(rows, schema={"scenario": pl.String, "seeds": pl.Int64,
                                      "hypothesis": pl.String, "claim": pl.String, **TALLY})


TALLY = {"studies": pl.Int64, "count": pl.Int64, "rate": pl.Float64, "upper_95": pl.Float64}


def tally(scores: list[dict[str, float]], key: str, counted: bool, false: bool) -> dict:
    """One measure over the simulated studies that scored it (NaN: not scored): their number,
    the count of hits when `counted`, the rate and a false claim's Clopper-Pearson bound."""
    values = np.array([s.get(key, math.nan) for s in scores], float)
    values = values[np.isfinite(values)]
    hits = int(values.sum()) if counted else None
    return {"studies": values.size, "count": hits,
            "rate": float(values.mean()) if values.size else math.nan,
            "upper_95": S.clopper_pearson_upper(hits, values.size) if false and values.size
            else math.nan}


def markdown(table: pl.DataFrame) -> str:
    lines = ["| scenario | hypothesis | claim | studies | rate | 95% upper bound |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in table.iter_rows(named=True):
        if not math.isfinite(r["rate"]):
            result = "-"
        elif r["claim"] == "coverage":
            result = f"{r['rate']:.1%} of intervals"
        else:
            result = f"{r['count']} ({r['rate']:.1%})"
        bound = f"{r['upper_95']:.1%}" if math.isfinite(r["upper_95"]) else ""
        lines.append(f"| {r['scenario']} | {r['hypothesis']} | {r['claim']} | {r['studies']} | "
                     f"{result} | {bound} |")
    return "\n".join(lines)


USAGE = """usage: python -m analysis calibrate [key=value ...]

The analysis plan's error rates, power and interval coverage: the sweep's rules and the
report's verdict code on simulated studies of known truth (docs/report.md), printed as one
Markdown table. Exit 1 when the upper 95% bound of some false-claim rate is 5% or more or some
interval's coverage is below 90%.

keys (defaults shown):
  studies=300  simulated studies per scenario (a false-claim rate of 1.5% needs about 300 for
               its upper 95% bound to fall below 5%)
  seeds=5      seeds per cell (the mini's, fixed in advance; >= 2)
  scenarios=   comma-separated, of: null, same onset, one decade per doubling, half a decade
               per doubling, sharp onset (default: all)
  runs=        a runs folder (e.g. runs/mini) to fit the noise from; default: the noise fitted
               from the earlier mini
  onset_sd=    decades each simulated seed's onset scatters by about its depth's; default: as
               single seeds' onsets scatter about their point's in results/ladder (0 without it)"""


@dataclass(frozen=True)
class CalibrateArgs:
    studies: int = 300
    seeds: int = 5
    scenarios: str = ""
    runs: str = ""
    onset_sd: float | None = None


def cli(argv: list[str]) -> int:
    args = apply_overrides(CalibrateArgs(), split_key_values(argv))
    if args.studies < 1:
        raise UsageError(f"studies must be >= 1, not {args.studies}")
    if args.seeds < 2:
        raise UsageError(f"seeds must be >= 2 (a paired test needs two), not {args.seeds}")
    if args.onset_sd is not None and not args.onset_sd >= 0:
        raise UsageError(f"onset_sd must be >= 0 decades, not {args.onset_sd}")
    names = tuple(n.strip() for n in args.scenarios.split(",") if n.strip()) or tuple(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    noise = NOISE
    if args.runs:
        from .load import load_runs
        from .study import analyse

        noise = fit_noise(analyse(load_runs(args.runs)).points)
    noise = replace(noise, onset_sd=fitted(args.onset_sd, 0.0)[0])
    t0 = time.perf_counter()
    table = calibrate(args.studies, args.seeds, noise, names)
    print(f"noise: {noise.source} (correlation across LRs {noise.correlation:.2f}); seeds' "
          f"onsets scatter by {noise.onset_sd:.3f} decades; {args.seeds} seeds; {REFINE_STEPS} "
          "boundary-bisection step(s) per curve\n")
    print(markdown(table))
    false = table.filter(pl.col("claim").str.starts_with("false"))
    worst = false.sort("upper_95").row(-1, named=True)
    print(f"\nlargest false-claim rate: {false['rate'].max():.1%}; largest upper 95% bound "
          f"{worst['upper_95']:.1%} ({worst['scenario']}, {worst['hypothesis']} "
          f"{worst['claim']}; must be < 5%); {time.perf_counter() - t0:.0f} s")
    covered = table.filter(pl.col("claim") == "coverage").drop_nans("rate").sort("rate")
    least = covered.row(0, named=True) if covered.height else None
    if least:
        print(f"smallest coverage: {least['rate']:.1%} ({least['scenario']}, "
              f"{least['hypothesis']}; must be >= 90%)")
    return 0 if worst["upper_95"] < 0.05 and (least is None or least["rate"] >= 0.9) else 1
