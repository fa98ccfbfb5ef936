"""Whole-seed draws (analysis/stats.py): exact enumeration where it is small, so an interval's
ends do not move with the random key; random draws beyond it."""

from __future__ import annotations

import numpy as np

from analysis import stats as S


def test_few_seeds_are_enumerated_exactly_and_the_interval_does_not_depend_on_the_key():
    three = S.seed_draws(3, 2000, "a")
    assert three.shape == (27, 3) and len({tuple(r) for r in three}) == 27
    assert np.array_equal(S.seed_draws(5, 2000, "a"), S.seed_draws(5, 2000, "b"))
    values = np.array([[0.0], [1.0], [5.0]])
    means, _ = S.seed_bootstrap(values, three)
    # the exact 2.5% end: the smallest mean of 27 equally likely draws (all seed 0)
    assert S.percentile_interval(means[:, 0])[0] == means[:, 0].min()
    seven = S.seed_draws(7, 2000, "a")  # 7^7 = 823,543 > 10^5: random draws
    assert seven.shape == (2000, 7) and not np.array_equal(seven, S.seed_draws(7, 2000, "b"))
    assert S.is_exact(27, 3) and not S.is_exact(2000, 7)


def test_an_exact_p_value_is_the_share_of_draws_and_a_random_one_counts_the_sample_once_more():
    null = np.array([False] * 26 + [True])
    assert S.p_bootstrap(null, exact=True) == 1 / 27
    assert S.p_bootstrap(null) == 2 / 28


def test_independent_units_are_drawn_each_from_its_own_enumeration():
    a, b = np.arange(27.0), np.arange(3125.0)
    joint = S.joint_draws([a, b], 4000, "key")
    assert joint.shape == (4000, 2) and set(joint[:, 0]) <= set(a) and set(joint[:, 1]) <= set(b)
    assert np.array_equal(joint, S.joint_draws([a, b], 4000, "key"))
