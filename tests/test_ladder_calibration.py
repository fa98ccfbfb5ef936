"""The warmup law's calibration runs the whole procedure on simulated ladders of known law."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import polars as pl

from analysis import calibrate as K
from analysis.law import fit_law, design
from analysis.ladder_calibration import A, LAWS, NEW, calibrate_ladder, judge, simulate
from analysis.metrics import Options
from analysis.scatter import onset_scatter
from analysis.study import ReportOptions
from qkstudy.sweep.ladder import WARMUP_POINTS

QUIET = K.Noise(gap_sd={4: tuple(1e-6 for _ in K.LRS)}, correlation=0.5, boundary=(0.0, 1e-6),
                collapse_lr=1.0, on_sd=1e-6)


def test_a_noiseless_ladder_recovers_each_points_planted_onset_past_an_under_training_gap():
    """Each point read as a real one: the under-training gap at the smallest LRs of the longer
    points is skipped, and the onset interpolates straight across the planted convex onset
    (within a tenth of a decade)."""
    results, new = simulate(LAWS["share"], QUIET, 5, Options(), np.random.default_rng(0), 0)
    assert [r.name for r in results] == [*WARMUP_POINTS, NEW.name]
    truth = design([r.point for r in results]) @ [A, *LAWS["share"]]
    assert np.allclose([r.onset.point for r in results], truth, atol=0.1)
    assert new == truth[-1]
    scores = judge(results, LAWS["share"], ReportOptions(), new)
    assert scores["fitted"] == 1.0
    assert abs(scores["b error"]) < 0.05 and abs(scores["c error"]) < 0.05
    for form in ("straight", "bent"):  # the new point, measured past the eight, is predicted
        assert scores[f"{form} prediction coverage"] == 1.0
        assert abs(scores[f"{form} prediction error"]) < 0.1


def test_the_simulated_points_scatter_about_the_law_by_tau_and_their_seeds_by_onset_sd():
    """Without noise the law fits the points exactly unless tau plants a lack of fit; a seed's
    onset is its point's unless onset_sd moves it, and the fit of the scatter recovers it."""
    def ladder(tau: float, onset_sd: float):
        noise = replace(QUIET, onset_sd=onset_sd)
        return simulate(LAWS["steps"], noise, 5, Options(), np.random.default_rng(2), 0, tau)[0]

    plain = ladder(0.0, 0.0)
    assert fit_law(plain, ReportOptions())[1]["lack_of_fit"] < 0.03
    assert onset_scatter(plain)[0] < 1e-3
    assert fit_law(ladder(0.3, 0.0), ReportOptions())[1]["lack_of_fit"] > 0.1
    sd, lines = onset_scatter(ladder(0.0, 0.15))
    assert 0.1 < sd < 0.2 and len(lines) == 9


def test_the_calibration_table_scores_every_claim_as_false_or_power_by_the_truth():
    table = calibrate_ladder(studies=2, laws=("no warmup effect", "share"))
    rows = {(r["law"], r["measure"]) for r in table.iter_rows(named=True)}
    assert ("no warmup effect", "false: warmup raises it") in rows
    assert ("no warmup effect", "power: it follows the warmup's steps") in rows
    assert ("share", "false: it follows the warmup's steps") in rows
    assert ("share", "power: it follows the warmup's share of the run") in rows
    for law in ("no warmup effect", "share"):
        assert {(law, m) for m in ("b coverage", "c coverage", "straight prediction coverage",
                                   "bent prediction coverage", "bent true onset coverage",
                                   "fitted")} <= rows
    false = table.filter(pl.col("measure").str.starts_with("false"))
    assert (false["upper_95"] >= false["rate"]).all()
    assert all(math.isfinite(x) for x in table["rate"])


def test_an_unfitted_simulated_law_makes_no_claim():
    results, new = simulate(LAWS["steps"], K.NOISE, 5, Options(), np.random.default_rng(3), 0)
    for r in results[1:]:
        r.complete = False  # too few points: the law is not fitted
    scores = judge(results, LAWS["steps"], ReportOptions(), new)
    assert scores["fitted"] == 0.0
    assert all(v == 0.0 for k, v in scores.items() if k.startswith(("false", "power")))
