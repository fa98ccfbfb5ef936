"""The transfer law's calibration runs the whole procedure on simulated ladders of known law."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from analysis import calibrate as K
from analysis.ladder_calibration import LAWS, calibrate_ladder, simulate
from analysis.metrics import Options
from qkstudy.sweep.ladder import LAW_POINTS


def test_a_noiseless_ladder_recovers_each_points_planted_threshold():
    quiet = K.Noise(gap_sd={4: tuple(1e-6 for _ in K.LRS)}, correlation=0.5,
                    boundary=(0.0, 1e-6), collapse_lr=1.0, on_sd=1e-6)
    results = simulate(LAWS["a quarter decade per doubling"], quiet, 5, Options(),
                       np.random.default_rng(0), 0)
    assert [r.name for r in results] == list(LAW_POINTS)
    # the estimate interpolates straight across a convex onset: within a tenth of a decade
    from analysis.ladder import design
    from analysis.ladder_calibration import A
    truth = design([r.point for r in results]) @ [A, -0.25, -0.25]
    assert np.allclose([r.log_threshold for r in results], truth, atol=0.1)


def test_the_calibration_table_scores_every_claim_kind():
    table = calibrate_ladder(studies=2, laws=("flat", "a quarter decade per doubling"))
    measures = set(table["measure"])
    for term in "bc":
        assert {f"{term} coverage", f"{term} false falls", f"{term} false rises",
                f"{term} false equal"} <= measures
    assert "prediction coverage" in measures and "fitted" in measures
    false = table.filter(pl.col("measure").str.contains(" false "))
    assert (false["upper_95"] >= false["rate"]).all()
    power = table.filter((pl.col("law") == "flat") & pl.col("measure").str.contains("power"))
    assert power.is_empty()  # no power to speak of where nothing falls
    assert all(math.isfinite(x) for x in table["rate"])


def test_an_under_training_gap_censors_the_plans_reading_and_not_the_onsets():
    """Amendment 11's calibration: the simulated under-training gap (0.3 nats below LR 3e-4 at
    w256-s300 and w64-s4800) leaves a plan threshold censored below the grid, while the onset reading recovers every point's planted onset, as without the gap."""
    from analysis.ladder import design
    from analysis.ladder_calibration import A, UNDERTRAIN

    quiet = K.Noise(gap_sd={4: tuple(1e-6 for _ in K.LRS)}, correlation=0.5,
                    boundary=(0.0, 1e-6), collapse_lr=1.0, on_sd=1e-6)
    law = LAWS["a quarter decade rise per doubling of steps"]
    plan = simulate(law, quiet, 5, Options(), np.random.default_rng(0), 0, "plan", True)
    onset = simulate(law, quiet, 5, Options(), np.random.default_rng(0), 0, "onset", True)
    censored = {r.name for r in plan if r.log_threshold == -math.inf}
    assert censored and censored <= set(UNDERTRAIN)  # (w64-s4800's long flat middle dilutes it)
    truth = design([r.point for r in onset]) @ [A, *law]
    assert np.allclose([r.log_threshold for r in onset], truth, atol=0.1)


def test_an_unfitted_simulated_law_makes_no_claim_and_finds_nothing():
    from analysis.ladder_calibration import judge
    from analysis.study import ReportOptions

    results = simulate(LAWS["flat"], K.NOISE, 5, Options(), np.random.default_rng(3), 0)
    results[0].log_threshold = -math.inf
    scores = judge(results, (0.0, 0.25), ReportOptions())
    assert scores["fitted"] == 0.0 and scores["c power (rises)"] == 0.0
    assert all(v == 0.0 for k, v in scores.items() if " false " in f" {k} ")
