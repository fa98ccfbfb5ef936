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
