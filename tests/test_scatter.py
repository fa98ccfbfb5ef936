"""Single seeds' onsets scatter about their point's, in the simulations as in the archives."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from analysis import calibrate as K
from analysis.metrics import Options


def crossings(world: K.World, depth: int) -> list[float]:
    """Each seed's log10 LR where its noiseless gap (off minus on) first reaches 0.1."""
    grid = 10 ** np.arange(-2.6, -1.2, 0.001)
    out = []
    for seed in range(world.seeds):
        gap = [world.run(depth, "none", lr, seed)[1] - world.run(depth, "rmsnorm", lr, seed)[1]
               for lr in grid]
        out.append(math.log10(grid[np.argmax(np.array(gap) >= 0.1)]))
    return out


def test_a_noiseless_world_with_onset_scatter_gives_each_seed_its_own_crossing():
    """The seeds cross at the planted onset moved by onset_sd times the normal quantiles; with
    no scatter they cross together."""
    scenario = K.SCENARIOS["one decade per doubling"]
    rng = np.random.default_rng(0)
    same = crossings(K.make_world(scenario, K.NOISE, 5, 0.1, rng, noiseless=True), 4)
    assert max(same) - min(same) < 0.002
    noise = replace(K.NOISE, onset_sd=0.2)
    moved = crossings(K.make_world(scenario, noise, 5, 0.1, rng, noiseless=True), 4)
    expected = math.log10(0.02) + 0.2 * stats.norm.ppf((np.arange(5) + 0.5) / 5)
    assert moved == pytest.approx(expected, abs=0.002)
    drawn = K.make_world(scenario, noise, 2000, 0.1, rng).onset_shift[8]
    assert np.std(drawn) == pytest.approx(0.2, rel=0.05)


def test_the_truth_is_where_the_seeds_mean_gap_crosses():
    """Over seeds whose onsets scatter, the mean gap of a sharp onset reaches 0.1 of its 0.45
    nats where a fifth of the seeds are past theirs: sd * z(0.1 / 0.45) below the planted."""
    sharp = K.SCENARIOS["sharp onset"]
    truth = K.truth_of(sharp, replace(K.NOISE, onset_sd=0.11), 5, Options())
    below = 0.11 * stats.norm.ppf(0.1 / 0.45)
    assert truth.onsets[4] - math.log10(0.015) == pytest.approx(below, abs=0.01)
    assert truth.slope == 0.0
    assert K.truth_of(sharp, K.NOISE, 5, Options()).onsets[4] == math.log10(0.015)
    # a cell's truth is the seeds' mean gap: half the seeds past a sharp onset, half the plateau
    assert K.expected_gap(sharp, 4, 0.015 * 10 ** 0.005, 0.1, 0.11) == pytest.approx(0.225, abs=0.02)
