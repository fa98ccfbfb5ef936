"""The transfer law's calibration (docs/report.md, the ladder's plan): simulated ladders whose
necessity threshold follows a known law, run through the whole procedure, measure the
coverage of the b, c and prediction intervals and how often the law claims a fall or rise that
is not there.

One simulated ladder: each of the law's five points is a study of its own (analysis/calibrate.py's
World, with the noise fitted from real sweeps at depth 4), swept on the ladder's grid by the
sweep's own rules (one boundary-bisection step per curve, two threshold-bisection steps), its H1
cells tested, its threshold estimated with its own fresh whole-seed draws (analysis.threshold),
then the law fitted and tested by analysis.ladder.fit_law.

    python -m analysis ladder-calibrate [studies=100] [seeds=5] [reading=plan|onset]
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.errors import UsageError
from qkstudy.sweep.ladder import KNOWN, LAW_POINTS, LRS, REFINE_STEPS

from . import calibrate as K
from . import stats as S
from .hypotheses import h1_tests
from .ladder import STUDY_X, PointResult, design, fit_law
from .metrics import Options, paired_gaps
from .study import ReportOptions
from .threshold import READINGS, depth_draws, gap_matrix, tested_rule

A = math.log10(0.008)  # the anchor's threshold: the published minis' depth-4 estimates
LAWS = {  # (b, c) decades per doubling of width and of steps
    "flat": (0.0, 0.0),
    "half a decade per doubling": (-0.5, -0.5),  # the plan's
    "a quarter decade per doubling": (-0.25, -0.25),  # added: every point's threshold in the grid
    # amendment 11: a rise with training length only, as the onset reading's cells suggest
    "a quarter decade rise per doubling of steps": (0.0, 0.25),
}
ONSET_LAWS = ("flat", "a quarter decade per doubling", "a quarter decade rise per doubling of steps")
# amendment 11: the under-training gap (nats) at the points where the ladder showed one
UNDERTRAIN = {"w256-s300": 0.3, "w64-s4800": 0.3}
LATTICE = np.arange(-4.25, 0.75, 1 / 32)  # the ladder's grid starts at 1e-4


def simulate(law: tuple[float, float], noise: K.Noise, seeds: int, options: Options,
             rng: np.random.Generator, study: int, reading: str = "plan",
             undertrain: bool = False) -> list[PointResult]:
    """One simulated ladder's five law points, each read by `reading` (the plan's threshold or
    amendment 11's onset); `undertrain` adds UNDERTRAIN's gap at the smallest LRs."""
    b, c = law
    points = [KNOWN[n] for n in LAW_POINTS]
    keys = tuple(range(len(points)))
    x = design(points)
    onset = {k: 10 ** float(x[k] @ [A, b, c]) for k in keys}
    low = {k: UNDERTRAIN.get(p.name, 0.0) for k, p in zip(keys, points)} if undertrain else {}
    world = K.make_world(K.Scenario(onset, undertrain=low), replace(noise, gap_sd={k: noise.gap_sd[4] for k in keys}),
                         seeds, options.min_gap, rng, depths=keys, lrs=LRS, lattice=LATTICE,
                         refine_steps=REFINE_STEPS)
    runs = K.sweep(world)
    gaps, _ = h1_tests(runs, options)
    paired = paired_gaps(runs, options)
    out = []
    for k, p in zip(keys, points):
        cells = gaps.filter((pl.col("depth") == k) & pl.col("informative"))
        lrs = sorted(cells["lr"].to_list())
        mine = paired.filter((pl.col("depth") == k) & pl.col("lr").is_in(lrs))
        d = depth_draws(gap_matrix(mine, list(range(seeds)), lrs), lrs,
                        S.seed_draws(seeds, options.bootstrap, f"ladder-calibration/{study}/{k}"),
                        options.min_gap, reading=reading,
                        trained_up_to=tested_rule(cells)["trained_up_to"])
        out.append(PointResult(name=p.name, point=p, study=None, complete=True,  # type: ignore[arg-type]
                               left=0, log_threshold=d.point, draws=d.draws, seeds=seeds))
    return out


def judge(results: list[PointResult], law: tuple[float, float], options: ReportOptions) -> dict:
    table, prediction = fit_law(results, options)
    b, c = law
    truth = {"b": b, "c": c}
    out: dict[str, float] = {"fitted": float(prediction["lr"] is not None)}
    if prediction["lr"] is None:  # an unfitted law makes no claim: none false, none found
        out |= {f"{term} false {claim}": 0.0 for term in "bc"
                for claim in ("falls", "rises", "equal")}
        out |= {f"{term} power ({claim})": 0.0 for term, true in truth.items()
                for claim, sign in (("falls", -1), ("rises", 1)) if sign * true > 0}
        return out
    rows = {r["term"]: r for r in table.iter_rows(named=True)}
    for term, true in truth.items():
        r = rows[term]
        out[f"{term} coverage"] = float(r["ci_lo"] <= true <= r["ci_hi"])
        out[f"{term} false falls"] = float(r["decision"] == "falls" and not true < 0)
        out[f"{term} false rises"] = float(r["decision"] == "rises" and not true > 0)
        out[f"{term} false equal"] = float(r["decision"] == "equal"
                                           and not abs(true) < options.study.slope_margin)
        out[f"{term} power (falls)"] = float(r["decision"] == "falls") if true < 0 else math.nan
        out[f"{term} power (rises)"] = float(r["decision"] == "rises") if true > 0 else math.nan
        out[f"{term} error"] = r["estimate"] - true
    true_prediction = float(STUDY_X @ [A, b, c])
    out["prediction coverage"] = float(
        math.log10(prediction["ci_lo"]) <= true_prediction <= math.log10(prediction["ci_hi"]))
    out["prediction error"] = prediction["log10_lr"] - true_prediction
    return out


def calibrate_ladder(studies: int, seeds: int = 5, laws: tuple[str, ...] = tuple(LAWS),
                     noise: K.Noise = K.NOISE, base_seed: int = 0, reading: str = "plan",
                     undertrain: bool = False) -> pl.DataFrame:
    options = ReportOptions()
    rows = []
    for name in laws:
        rng = np.random.default_rng([base_seed, seeds, list(LAWS).index(name)])
        scores = [judge(simulate(LAWS[name], noise, seeds, options.study, rng, i, reading,
                                 undertrain), LAWS[name], options) for i in range(studies)]
        keys = sorted({k for s in scores for k in s})
        for key in keys:
            values = np.array([s.get(key, math.nan) for s in scores], float)
            values = values[np.isfinite(values)]
            n = len(values)
            if not n:
                continue
            false = " false " in f" {key} "
            hits = int(values.sum()) if false or "power" in key or key == "fitted" else None
            rows.append({"law": name, "seeds": seeds, "measure": key, "studies": n,
                         "count": hits, "rate": float(values.mean()),
                         "upper_95": S.clopper_pearson_upper(hits, n) if false else math.nan})
    return pl.DataFrame(rows, schema={"law": pl.String, "seeds": pl.Int64, "measure": pl.String,
                                      "studies": pl.Int64, "count": pl.Int64,
                                      "rate": pl.Float64, "upper_95": pl.Float64})


def markdown(table: pl.DataFrame) -> str:
    lines = ["| law (b = c) | measure | studies | result | 95% upper bound |",
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


USAGE = """usage: python -m analysis ladder-calibrate [studies=100] [seeds=5] [reading=plan|onset]
       [undertrain=auto|true|false]

The transfer law's calibration on simulated ladders of known law (docs/report.md): coverage
of the b, c and prediction intervals, false falls / rises / equal, power. reading=onset
calibrates amendment 11's onset reading, with the under-training gap at w256-s300 and w64-s4800
(undertrain=auto: with reading=onset only) and the laws flat, a quarter decade fall per
doubling and a quarter decade rise per doubling of steps. Exits 1 when a false-claim rate's
95% upper bound passes 5%."""


def cli(argv: list[str]) -> int:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Args:
        studies: int = 100
        seeds: int = 5
        reading: str = "plan"
        undertrain: str = "auto"

    args = apply_overrides(Args(), split_key_values(argv))
    if args.reading not in READINGS:
        raise UsageError(f"reading={args.reading!r}; known: {', '.join(READINGS)}")
    if args.undertrain not in ("auto", "true", "false"):
        raise UsageError(f"undertrain={args.undertrain!r}; give auto, true or false")
    undertrain = (args.reading == "onset" if args.undertrain == "auto"
                  else args.undertrain == "true")
    t0 = time.perf_counter()
    table = calibrate_ladder(args.studies, args.seeds,
                             ONSET_LAWS if args.reading == "onset" else tuple(LAWS)[:3],
                             reading=args.reading, undertrain=undertrain)
    sys.stdout.write(markdown(table))
    bad = table.filter(pl.col("measure").str.contains(" false ") & (pl.col("upper_95") > 0.05))
    print(f"{args.studies} simulated ladders a law, {time.perf_counter() - t0:.0f} s; "
          + ("every false-claim upper bound <= 5%" if bad.is_empty() else
             f"{bad.height} false-claim upper bounds above 5%"), file=sys.stderr)
    return 1 if bad.height else 0
