"""`python -m analysis ladder-calibrate`: the warmup law's calibration on simulated ladders of
known law, each point swept and read as a real one, both forms fitted and scored (USAGE)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.sweep.ladder import KNOWN, LRS, REFINE_STEPS, STUDY_POINT, WARMUP_POINTS

from . import calibrate as K
from . import stats as S
from .hypotheses import h1_tests
from .ladder import PointResult
from .law import CLAIMS, FORMS, MARGIN, design, fit_law, score
from .metrics import Options, paired_gaps
from .scatter import fitted
from .study import ReportOptions
from .threshold import read_onset

A = math.log10(0.0068)  # the anchor's onset (w64-s300)
# (b, c) decades per doubling of warmup and of steps: none; the measured warmup effect (+0.19),
# following the warmup's steps; the same, following its share of the run
LAWS = {"no warmup effect": (0.0, 0.0), "steps": (0.19, 0.0), "share": (0.19, -0.19)}
UNDERTRAIN = 0.3  # nats at the smallest LRs of the points of 1,200 steps and more
LATTICE = np.arange(-4.25, 0.75, 1 / 32)  # the ladder's grid starts at 1e-4
# the new point whose measured onset the law predicts: the study preset's schedule on the
# ladder's model, over the ladder's whole grid so its onset is read wherever the law puts it
NEW = replace(KNOWN["w64-s24414-wu1000"], lrs=LRS)


def simulate(law: tuple[float, float], noise: K.Noise, seeds: int, options: Options,
             rng: np.random.Generator, study: int, tau: float = 0.0
             ) -> tuple[list[PointResult], float]:
    """One simulated ladder's eight points and the new point (last), each read as the plan
    reads a real one, and the new point's planted onset (log10). Each point's planted onset is
    the law's plus its own N(0, tau^2) deviation (the lack of fit)."""
    points = [KNOWN[n] for n in WARMUP_POINTS] + [NEW]
    onsets = design(points) @ [A, *law] + (rng.normal(0, tau, len(points)) if tau else 0.0)
    out: dict[str, PointResult] = {}
    for grid in sorted({p.lrs for p in points}):
        keys = tuple(i for i, p in enumerate(points) if p.lrs == grid)
        scenario = K.Scenario({k: float(10 ** onsets[k]) for k in keys},
                              undertrain={k: UNDERTRAIN for k in keys if points[k].steps >= 1200})
        world = K.make_world(scenario, replace(noise, gap_sd={k: noise.gap_sd[4] for k in keys}),
                             seeds, options.min_gap, rng, depths=keys, lrs=grid,
                             lattice=LATTICE, refine_steps=REFINE_STEPS)
        runs = K.sweep(world)
        gaps, _ = h1_tests(runs, options)
        paired = paired_gaps(runs, options)
        for k in keys:
            draws = S.seed_draws(seeds, options.bootstrap, f"ladder-calibration/{study}/{k}")
            d = read_onset(gaps.filter(pl.col("depth") == k), paired.filter(pl.col("depth") == k),
                           list(range(seeds)), draws, options.min_gap)
            p = points[k]
            out[p.name] = PointResult(name=p.name, point=p, study=None, complete=True, left=0,
                                      onset=d, seeds=seeds)
    return [out[p.name] for p in points], float(onsets[-1])


def _prediction(fit: dict, new: PointResult, truth: float) -> dict[str, float]:
    """One form's prediction at the study preset: whether its interval holds the new point's
    measured onset (scored as a real one) and its planted onset, and its error."""
    d, form = new.onset, fit["form"]
    side = "" if math.isfinite(d.point) else "above" if d.point > 0 else "below"
    at = d.point if not side else d.bounds[side == "above"]
    measured = {STUDY_POINT.name: {"lr": 10 ** at, "text": "", "side": side}}
    inside = score([fit], measured)["inside"][0] == "inside"
    lo, hi = math.log10(fit["ci_lo"]), math.log10(fit["ci_hi"])
    return {f"{form} prediction coverage": float(inside),
            f"{form} true onset coverage": float(lo <= truth <= hi),
            f"{form} prediction error": fit["log10_lr"] - truth}


def judge(results: list[PointResult], law: tuple[float, float], options: ReportOptions,
          truth: float, onset_sd: float = 0.0) -> dict:
    """One simulated ladder's scores: fitted, coverage and error of b, c; per form, the
    coverage of its prediction at the study preset (of the new point, results' last, and of
    its planted onset `truth`, shifted to where its seeds' mean gap crosses) and its error;
    each claim made (false where the truth is outside it, power where inside)."""
    table, fit = fit_law(results, options)
    b, c = law
    claims = {"p_raises": b > 0, "p_steps": abs(c) < MARGIN, "p_share": abs(b + c) < MARGIN}
    out: dict[str, float] = {"fitted": float(fit["lr"] is not None)}
    for key, claim in CLAIMS.items():
        made = fit["lr"] is not None and claim in fit["decided"].split("; ")
        out[f"{'power' if claims[key] else 'false'}: {claim}"] = float(made)
    if fit["lr"] is None:  # an unfitted law makes no claim
        return out
    rows = {r["term"]: r for r in table.iter_rows(named=True)}
    for term, true in (("b", b), ("c", c)):
        out[f"{term} coverage"] = float(rows[term]["ci_lo"] <= true <= rows[term]["ci_hi"])
        out[f"{term} error"] = rows[term]["estimate"] - true
    truth += K.population_onset(K.Scenario({0: 1.0}), 0, options.study.min_gap, onset_sd)
    for form in FORMS:
        f = fit if form == "straight" else fit_law(results, options, form)[1]
        if f["lr"] is not None:
            out.update(_prediction(f, results[-1], truth))
    return out


def calibrate_ladder(studies: int, seeds: int = 5, laws: tuple[str, ...] = tuple(LAWS),
                     noise: K.Noise = K.NOISE, tau: float = 0.0) -> pl.DataFrame:
    """Per law and measure: count, rate and Clopper-Pearson bound, or mean coverage or error;
    the simulated points scatter about the law by `tau` decades and their seeds' onsets by
    noise.onset_sd."""
    options = ReportOptions()
    rows = []
    for name in laws:
        rng = np.random.default_rng([0, seeds, list(LAWS).index(name)])
        scores = []
        for i in range(studies):
            results, truth = simulate(LAWS[name], noise, seeds, options.study, rng, i, tau)
            scores.append(judge(results, LAWS[name], options, truth, noise.onset_sd))
        for key in sorted({k for s in scores for k in s}):
            row = K.tally(scores, key, counted=not key.endswith(("error", "coverage")),
                          false=key.startswith("false"))
            if row["studies"]:
                rows.append({"law": name, "measure": key, **row})
    return pl.DataFrame(rows, schema={"law": pl.String, "measure": pl.String, **K.TALLY})


def markdown(table: pl.DataFrame) -> str:
    lines = ["| law | measure | studies | result | 95% upper bound |",
             "| --- | --- | --- | --- | --- |"]
    for r in table.iter_rows(named=True):
        if r["measure"].endswith("error"):
            result = f"mean {r['rate']:+.3f} decades"
        elif r["count"] is not None:
            result = f"{r['count']} ({r['rate']:.1%})"
        else:
            result = f"{r['rate']:.1%}"
        upper = f"{r['upper_95']:.1%}" if math.isfinite(r["upper_95"]) else ""
        lines.append(f"| {r['law']} | {r['measure']} | {r['studies']} | {result} | {upper} |")
    return "\n".join(lines) + "\n"


USAGE = """usage: python -m analysis ladder-calibrate [studies=100] [seeds=5] [onset_sd=] [tau=]

The warmup law's calibration on simulated ladders of known law (docs/report.md): coverage of
b, c and of both forms' prediction at the study preset (of a new point's measured onset), each
claim's false rate (with its 95% upper bound) and power, under three laws: no warmup effect,
the onset following the warmup's steps, and its share of the run. Each simulated point's onset
scatters about the law by tau decades, and each seed's about its point's by onset_sd decades;
by default both as fitted from results/ladder (0 without it). Exits 1 when a false-claim rate's
95% upper bound reaches 5% or a coverage falls below 90%."""


@dataclass(frozen=True)
class Args:
    studies: int = 100
    seeds: int = 5
    onset_sd: float | None = None
    tau: float | None = None


def cli(argv: list[str]) -> int:
    args: Args = apply_overrides(Args(), split_key_values(argv))
    onset_sd, tau = fitted(args.onset_sd, args.tau)
    t0 = time.perf_counter()
    table = calibrate_ladder(args.studies, args.seeds, noise=replace(K.NOISE, onset_sd=onset_sd),
                             tau=tau)
    print(f"points about the law: tau {tau:.3f} decades; seeds' onsets: {onset_sd:.3f} decades")
    sys.stdout.write(markdown(table))
    false = pl.col("measure").str.starts_with("false") & (pl.col("upper_95") >= 0.05)
    low = pl.col("measure").str.ends_with("coverage") & (pl.col("rate") < 0.9)
    bad = table.filter(false | low)
    print(f"{args.studies} simulated ladders a law, {time.perf_counter() - t0:.0f} s; "
          + ("every false-claim upper bound < 5%, every coverage >= 90%" if bad.is_empty()
             else "out of bounds: " + ", ".join(f"{r['law']} {r['measure']}"
                                                 for r in bad.iter_rows(named=True))),
          file=sys.stderr)
    return 1 if bad.height else 0
