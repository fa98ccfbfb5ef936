"""The analysis's statistics on known values: intervals, sign-flip and equivalence tests, error
control, the whole-seed bootstrap, the monotone fit, how verdict parts combine, the onset's
interval, and the calibration of the whole procedure."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis import hypotheses as H
from analysis import metrics as M
from analysis import stats as S
from analysis import verdicts as V


def test_statistics_known_values():
    gaps = [0.018, -0.001, 0.026]  # the mini's depth 4, lr 1e-3
    lo, hi = S.interval(gaps)
    assert (lo, hi) == (pytest.approx(-0.0201, abs=1e-4), pytest.approx(0.0488, abs=1e-4))
    assert S.p_greater(gaps) == pytest.approx(0.1077, abs=1e-4)
    assert S.p_equivalent(gaps, 0.02) > 0.05  # an interval of [-0.02, +0.05]: not equivalent
    assert S.p_equivalent([0.001, -0.002, 0.0015], 0.02) < 0.01
    # a tie (no spread) is never p = 0: the exact sign-flip bound 2^-n
    assert S.p_greater([0.5, 0.5, 0.5]) == 0.125 and S.p_greater([-0.5, -0.5, -0.5]) == 1.0
    assert S.p_greater([0.5] * 6) == pytest.approx(1 / 64)
    assert S.p_greater([0.3]) is None and S.interval([0.3]) == (None, None)
    # Benjamini-Hochberg: q_(i) = min over j >= i of p_(j) m / j
    assert S.adjust([0.01, 0.04, 0.03, None], 0.05) == [pytest.approx(0.03), pytest.approx(0.04),
                                                         pytest.approx(0.04), None]
    # Holm, written out (statsmodels' runs gc.collect() each call): the same adjusted p-values
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(3)
    for p in ([0.01, 0.04, 0.03], [0.2, 0.001, 0.02, 0.02, 0.9], rng.uniform(0, 0.2, 7)):
        assert S.holm(list(p)) == pytest.approx(multipletests(p, method="holm")[1])
    assert S.adjust([0.01, None, 0.04], 0.05, "holm") == [pytest.approx(0.02), None,
                                                          pytest.approx(0.04)]
    # Clopper-Pearson: 2 of 200 bounds the rate only below 3.6%; 0 of 100 below 3.7%
    assert S.clopper_pearson_upper(2, 200) == pytest.approx(0.0357, abs=1e-4)
    assert S.clopper_pearson_upper(0, 100) == pytest.approx(0.0362, abs=1e-4)


def test_the_sign_flip_test_scores_ties_as_what_they_are():
    """Max stable LR ratios take grid values. x18.3 in all three seeds is at least as strong
    evidence as x10, x18.3, x18.3: the exact sign-flip test gives both its smallest p, 2^-3
    (a t-test gave the spread 0.0027 and the tie 0.125)."""
    tie = [math.log(18.3)] * 3
    spread = [math.log(10), math.log(18.3), math.log(18.3)]
    assert S.p_signflip(tie) == S.p_signflip(spread) == 0.125
    assert S.p_signflip([0.5, 0.5, 0.5000001]) == 0.125  # no reward for a hair of spread
    assert S.p_signflip(tie * 2) <= S.p_signflip(spread * 2) == pytest.approx(1 / 64)
    # one seed against: 2 of the 8 patterns reach the observed sum (+a +a -b and +a +a +b)
    assert S.p_signflip([1.0, 1.0, -0.5]) == pytest.approx(2 / 8)
    # zeros never change sign: equal in every seed is p = 1 either way
    assert S.p_signflip([0.0, 0.0, 0.0]) == 1.0 and S.p_signflip([-0.0, 0.0, 0.0]) == 1.0
    # equivalence by two sign-flip tests: zeros within a margin reach 2^-n, never below
    assert S.p_signflip_equivalent([0.0] * 5, 0.5) == pytest.approx(1 / 32)
    assert S.p_signflip_equivalent([1.0] * 5, 0.5) == 1.0


def test_the_whole_seed_bootstrap_matches_a_hand_computation():
    # 3 seeds x 2 LRs; seed 2 did not run the second LR
    values = np.array([[0.1, 1.0],
                       [0.3, 2.0],
                       [0.5, np.nan]])
    draws = np.array([[0, 0, 2],   # seeds 0, 0, 2
                      [1, 1, 1],   # seed 1 three times
                      [2, 2, 2]])  # only seed 2: it never ran LR 2
    means, counts = S.seed_bootstrap(values, draws)
    # LR 1: mean 0.3, n = 3, deviations -0.2, 0, +0.2, scale sqrt(3/2)
    # LR 2: mean 1.5, n = 2, deviations -0.5, +0.5, scale sqrt(2/1)
    s3, s2 = math.sqrt(3 / 2), math.sqrt(2)
    assert means[0, 0] == pytest.approx(0.3 + s3 * (-0.2 - 0.2 + 0.2) / 3)
    assert means[0, 1] == pytest.approx(1.5 + s2 * (-0.5 - 0.5) / 2)  # seed 2 has no LR 2
    assert means[1].tolist() == pytest.approx([0.3, 1.5 + s2 * 0.5])
    assert means[2, 0] == pytest.approx(0.3 + s3 * 0.2) and np.isnan(means[2, 1])
    assert counts.tolist() == [[3, 2], [3, 3], [3, 0]]
    # a seed drawn brings every LR it ran: the draws keep the seeds' correlation across LRs
    rows = S.seed_draws(3, 500, "test")
    boot, _ = S.seed_bootstrap(values[:, :1].repeat(2, axis=1), rows)
    assert np.allclose(boot[:, 0], boot[:, 1])


def test_the_monotone_fit_is_the_least_squares_isotonic_fit():
    def pava(y, w):  # pool adjacent violators, the textbook way
        blocks = []
        for v, wt in zip(y, w):
            blocks.append([v * wt, wt, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                a, b = blocks.pop(), blocks.pop()
                blocks.append([a[0] + b[0], a[1] + b[1], a[2] + b[2]])
        return [b[0] / b[1] for b in blocks for _ in range(b[2])]

    rng = np.random.default_rng(3)
    y = rng.normal(size=(40, 7)).cumsum(axis=1) * 0.3 + rng.normal(size=(40, 7))
    w = rng.integers(1, 6, size=7).astype(float)
    fit = S.isotonic(y, w)
    for row, f in zip(y, fit):
        assert f == pytest.approx(pava(row, w))
    assert S.isotonic(np.array([[1.0, np.nan, 0.0, 4.0]]), np.array([1, 1, 3, 1])).tolist() == \
        [[0.25, 0.25, 0.25, 4.0]]  # a point without data takes its neighbours' fit


def test_a_claim_with_undecided_parts_is_only_partly_supported():
    parts = [V.Part(V.FOR, 3, "a"), V.Part(V.UNCLEAR, 3, "b")]
    assert V.combine(parts) == "partly supported"
    assert V.combine([V.Part(V.FOR, 2, "a"), V.Part(V.UNCLEAR, 2, "b")]) == \
        "partly suggestive (n=2)"
    assert V.combine([V.Part(V.AGAINST, 3, "a"), V.Part(V.UNCLEAR, 3, "b")]) == "not supported"
    assert V.combine([V.Part(V.FOR, 3, "a"), V.Part(V.AGAINST, 3, "b")]) == "mixed"
    assert V.combine([V.Part(V.NO_DATA, 1, "a")]) == "not enough data"


def test_the_onset_interval_is_widened_and_never_narrower_than_the_lrs_either_side():
    """A sharp onset leaves every whole-seed draw on one point; the data still cannot place the
    crossing anywhere finer than between the informative LRs either side."""
    import numpy as np

    from analysis.threshold import DepthDraws, threshold_interval

    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    point = math.log10(5e-3)
    sharp = DepthDraws(lrs=lrs, point=point, draws=np.full(100, point), seeds=5)
    lo, hi = threshold_interval(sharp, 1.0)
    assert (lo, hi) == (pytest.approx(math.log10(3e-3)), pytest.approx(-2.0))
    wide_lrs = [1e-4, *lrs, 0.1]  # bounds far enough that widening by 2 stays inside them
    spread = DepthDraws(lrs=wide_lrs, point=point, draws=point + np.linspace(-0.35, 0.35, 101),
                        seeds=5)
    plain, wide = threshold_interval(spread, 1.0), threshold_interval(spread, 2.0)
    assert wide[1] - point == pytest.approx(2 * (plain[1] - point))
    assert wide[0] - point == pytest.approx(2 * (plain[0] - point))


def test_calibration_runs_the_whole_procedure_on_a_tiny_scenario_count():
    from analysis.calibrate import calibrate

    table = calibrate(studies=2, seeds=5)
    assert set(table["scenario"]) == {"null", "same onset", "one decade per doubling",
                                      "half a decade per doubling", "sharp onset"}
    assert {"false supported", "false not supported", "false no difference"} <= set(
        table["claim"])
    false = table.filter(pl.col("claim").str.starts_with("false"))
    assert (false["studies"] == 2).all() and (false["upper_95"] >= false["rate"]).all()
    assert {"H1", "cells", "H2 max usable LR", "H2 LR sensitivity", "H3"} <= set(
        false["hypothesis"])
    half = table.filter(pl.col("scenario") == "half a decade per doubling")
    power = half.filter(pl.col("claim") == "power")
    assert {"H1", "H3", "H2 max usable LR"} <= set(power["hypothesis"])
    coverage = half.filter(pl.col("claim") == "coverage")
    assert set(coverage["hypothesis"]) == {"onset", "H3 slope"}
    assert coverage["rate"].is_between(0, 1).all()
    # no power is scored where the hypothesis is false: H1 in the null
    assert table.filter((pl.col("scenario") == "null") & (pl.col("claim") == "power")
                        & (pl.col("hypothesis") == "H1")).is_empty()


def test_an_equal_onset_is_a_slope_of_exactly_zero_so_a_false_rise_is_counted():
    """polyfit gives 2.5e-16 for equal onsets; unrounded, "rises" could never be scored false
    and "falls" would count as true."""
    from analysis import calibrate as K

    truth = K.truth_of(K.SCENARIOS["same onset"], K.NOISE, 5, M.Options())
    assert truth.slope == 0.0
    assert K._split("H3 false rises") == ("H3", "false rises")
    table = K.calibrate(studies=1, seeds=5, scenarios=("same onset",))
    assert table.filter((pl.col("hypothesis") == "H3")
                        & (pl.col("claim") == "false rises")).height == 1


def test_the_calibration_noise_degrades_the_off_arm_past_its_onset_and_couples_boundaries():
    """Real off runs collapse to unigram-level loss from 0.3-1.7 decades past the onset, and one
    seed's two divergence boundaries move together."""
    from dataclasses import replace as change

    from analysis import calibrate as K

    noise = change(K.NOISE, off_degrade=(0.5,), on_degrade=(math.inf,), boundary_correlation=0.9)
    world = K.make_world(K.SCENARIOS["same onset"], noise, 400, 0.1, np.random.default_rng(0))
    onset = math.log10(0.012)
    assert world.degrade[(4, "none")] == pytest.approx(np.full(400, onset + 0.5))
    assert np.isinf(world.degrade[(4, "rmsnorm")]).all()
    status, loss = world.run(4, "none", 10 ** (onset + 0.6), 0)
    assert status == "completed" and loss > K.UNIGRAM - M.Options.degraded_margin
    assert world.run(4, "rmsnorm", 10 ** (onset + 0.6), 0)[1] < 2.5
    r = np.corrcoef(world.boundary[(4, "none")], world.boundary[(4, "rmsnorm")])[0, 1]
    assert 0.85 < r < 0.95
    assert np.std(world.boundary[(4, "none")]) == pytest.approx(K.NOISE.boundary[1], rel=0.1)
    # without an effect both arms degrade alike, from the on arm's draws
    null = K.make_world(K.SCENARIOS["null"], noise, 5, 0.1, np.random.default_rng(0))
    assert np.isinf(null.degrade[(2, "none")]).all()
    # fitted back from the simulated sweep: every off seed degrades 0.3-1.2 decades past the
    # onset estimate (the grid's half-decade steps round the planted 0.5)
    points = K.sweep(K.make_world(K.SCENARIOS["same onset"], noise, 5, 0.1,
                                  np.random.default_rng(1)))
    fitted = K.fit_failures(points, H.h1_tests(points, M.Options())[0], M.Options())
    assert len(fitted[0]) == 15 and all(0.2 < x < 1.3 for x in fitted[0])
