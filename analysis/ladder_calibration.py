"""`python -m analysis ladder-calibrate [studies=100] [seeds=5]`: the warmup law's calibration.
Simulated ladders of the law's eight points under a known law, each point swept by the sweep's
rules with noise fitted from real sweeps and read as a real one, then the law fitted and scored:
coverage, each claim's false rate and power (docs/report.md)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.sweep.ladder import KNOWN, REFINE_STEPS, STUDY_POINT, WARMUP_POINTS

from . import calibrate as K
from . import stats as S
from .hypotheses import h1_tests
from .ladder import PointResult
from .law import CLAIMS, MARGIN, design, fit_law
from .metrics import Options, paired_gaps
from .study import ReportOptions
from .threshold import depth_draws, gap_matrix, tested_rule

STUDY_X = design([STUDY_POINT])[0]
A = math.log10(0.0068)  # the anchor's onset (w64-s300)
# (b, c) decades per doubling of warmup and of steps: none; the measured warmup effect (+0.19),
# following the warmup's steps; the same, following its share of the run
LAWS = {"no warmup effect": (0.0, 0.0), "steps": (0.19, 0.0), "share": (0.19, -0.19)}
UNDERTRAIN = 0.3  # nats at the smallest LRs of the points of 1,200 steps and more
LATTICE = np.arange(-4.25, 0.75, 1 / 32)  # the ladder's grid starts at 1e-4


def simulate(law: tuple[float, float], noise: K.Noise, seeds: int, options: Options,
             rng: np.random.Generator, study: int) -> list[PointResult]:
    """One simulated ladder's eight points, each read as the plan reads a real one."""
    points = [KNOWN[n] for n in WARMUP_POINTS]
    onsets = 10 ** (design(points) @ [A, *law])
    out: dict[str, PointResult] = {}
    for grid in sorted({p.lrs for p in points}):
        keys = tuple(i for i, p in enumerate(points) if p.lrs == grid)
        scenario = K.Scenario({k: float(onsets[k]) for k in keys},
                              undertrain={k: UNDERTRAIN for k in keys if points[k].steps >= 1200})
        world = K.make_world(scenario, replace(noise, gap_sd={k: noise.gap_sd[4] for k in keys}),
                             seeds, options.min_gap, rng, depths=keys, lrs=grid,
                             lattice=LATTICE, refine_steps=REFINE_STEPS)
        runs = K.sweep(world)
        gaps, _ = h1_tests(runs, options)
        paired = paired_gaps(runs, options)
        for k in keys:
            cells = gaps.filter((pl.col("depth") == k) & pl.col("informative"))
            lrs = sorted(cells["lr"].to_list())
            mine = paired.filter((pl.col("depth") == k) & pl.col("lr").is_in(lrs))
            draws = S.seed_draws(seeds, options.bootstrap, f"ladder-calibration/{study}/{k}")
            d = depth_draws(gap_matrix(mine, list(range(seeds)), lrs), lrs, draws,
                            options.min_gap, tested_rule(cells)["trained_up_to"])
            p = points[k]
            out[p.name] = PointResult(name=p.name, point=p, study=None, complete=True, left=0,
                                      onset=d, seeds=seeds)
    return [out[n] for n in WARMUP_POINTS]


def judge(results: list[PointResult], law: tuple[float, float], options: ReportOptions) -> dict:
    """One simulated ladder's scores: fitted, coverage and error of b, c and the prediction,
    each claim made (false where the truth is outside it, power where inside)."""
    table, fit = fit_law(results, options)
    b, c = law
    truth = {"p_raises": b > 0, "p_steps": abs(c) < MARGIN, "p_share": abs(b + c) < MARGIN}
    out: dict[str, float] = {"fitted": float(fit["lr"] is not None)}
    for key, claim in CLAIMS.items():
        made = fit["lr"] is not None and claim in fit["decided"].split("; ")
        out[f"{'power' if truth[key] else 'false'}: {claim}"] = float(made)
    if fit["lr"] is None:  # an unfitted law makes no claim
        return out
    rows = {r["term"]: r for r in table.iter_rows(named=True)}
    for term, true in (("b", b), ("c", c)):
        out[f"{term} coverage"] = float(rows[term]["ci_lo"] <= true <= rows[term]["ci_hi"])
        out[f"{term} error"] = rows[term]["estimate"] - true
    true_prediction = float(STUDY_X @ [A, b, c])
    out["prediction coverage"] = float(
        math.log10(fit["ci_lo"]) <= true_prediction <= math.log10(fit["ci_hi"]))
    out["prediction error"] = fit["log10_lr"] - true_prediction
    return out


def calibrate_ladder(studies: int, seeds: int = 5, laws: tuple[str, ...] = tuple(LAWS),
                     noise: K.Noise = K.NOISE, base_seed: int = 0) -> pl.DataFrame:
    options = ReportOptions()
    rows = []
    for name in laws:
        rng = np.random.default_rng([base_seed, seeds, list(LAWS).index(name)])
        scores = [judge(simulate(LAWS[name], noise, seeds, options.study, rng, i), LAWS[name],
                        options) for i in range(studies)]
        for key in sorted({k for s in scores for k in s}):
            values = np.array([s.get(key, math.nan) for s in scores], float)
            values = values[np.isfinite(values)]
            if not values.size:
                continue
            counted = not key.endswith(("error", "coverage"))
            hits = int(values.sum()) if counted else None
            rows.append({"law": name, "measure": key, "studies": values.size, "count": hits,
                         "rate": float(values.mean()),
                         "upper_95": S.clopper_pearson_upper(hits, values.size)
                         if key.startswith("false") else math.nan})
    return pl.DataFrame(rows, schema={"law": pl.String, "measure": pl.String,
                                      "studies": pl.Int64, "count": pl.Int64,
                                      "rate": pl.Float64, "upper_95": pl.Float64})


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


USAGE = """usage: python -m analysis ladder-calibrate [studies=100] [seeds=5]

The warmup law's calibration on simulated ladders of known law (docs/report.md): coverage of
b, c and the prediction, each claim's false rate (with its 95% upper bound) and power, under
three laws: no warmup effect, the onset following the warmup's steps, and its share of the run.
Exits 1 when a false-claim rate's 95% upper bound passes 5%."""


@dataclass(frozen=True)
class Args:
    studies: int = 100
    seeds: int = 5


def cli(argv: list[str]) -> int:
    args: Args = apply_overrides(Args(), split_key_values(argv))
    t0 = time.perf_counter()
    table = calibrate_ladder(args.studies, args.seeds)
    sys.stdout.write(markdown(table))
    bad = table.filter(pl.col("measure").str.starts_with("false") & (pl.col("upper_95") > 0.05))
    print(f"{args.studies} simulated ladders a law, {time.perf_counter() - t0:.0f} s; "
          + ("every false-claim upper bound <= 5%" if bad.is_empty() else
             f"{bad.height} false-claim upper bounds above 5%"), file=sys.stderr)
    return 1 if bad.height else 0
