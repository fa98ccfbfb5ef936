"""The early warning (analysis/early_warning.py): the onset read from the off arm's max attention
logit at the warmup's end, on hand-made probes with known crossings."""

from __future__ import annotations

import math

import polars as pl
import pytest

from analysis import early_warning as E


def test_the_probe_is_the_first_scheduled_one_at_or_after_the_warmups_end():
    assert E.probe_step(1200, 480) == 600  # probes every 200
    assert E.probe_step(300, 30) == 50
    assert E.probe_step(4800, 1000) == 1600 and E.probe_step(4800, 1600) == 1600


def test_logits_are_the_off_arms_seed_0_and_1_median_and_a_run_without_the_probe_is_inf():
    runs = [(f"r{i}", arm, lr, seed, grid) for i, (arm, lr, seed, grid) in enumerate([
        ("none", 0.01, 0, True), ("none", 0.01, 1, True), ("none", 0.01, 2, True),
        ("rmsnorm", 0.01, 0, True), ("none", 0.03, 0, True), ("none", 0.03, 1, True),
        ("none", 0.02, 0, False)])]
    per_run = pl.DataFrame(runs, schema=["run", "arm", "lr", "seed", "in_grid"], orient="row")
    probes = pl.DataFrame({"run": ["r0", "r1", "r2", "r3", "r4", "r0", "r6"],
                           "step": [600, 600, 600, 600, 600, 400, 600],
                           "name": ["max_attention_logit"] * 7,
                           "value": [10.0, 1000.0, 1e9, 5.0, 100.0, 1e9, 1e9]})
    out = E.warmup_logits(per_run, probes, 600)
    assert out == {0.01: pytest.approx(2.0), 0.03: math.inf}  # r5 diverged before step 600


def test_the_crossing_is_straight_in_log_lr_against_log_logit_and_a_bound_at_the_ends():
    logits = {0.001: 1.0, 0.01: 2.0, 0.1: 4.0}
    assert E.crossing(logits, 3.0) == (pytest.approx(-1.5), "")
    assert E.crossing(logits, 0.5) == (-3.0, "below")
    assert E.crossing(logits, 5.0) == (-1.0, "above")
    assert E.crossing({0.001: 1.0, 0.01: math.inf}, 3.0) == (-2.0, "")


def test_the_level_is_the_median_logit_at_the_measured_onsets():
    readings = [({0.001: 1.0, 0.01: 2.0}, -2.5), ({0.001: 1.0, 0.01: 3.0}, -2.5),
                ({0.001: 1.0, 0.01: 5.0}, -2.5), ({0.001: 1.0, 0.01: 2.0}, -math.inf),
                ({0.001: 1.0, 0.01: 2.0}, -1.0)]  # censored, and outside its grid: skipped
    assert E.fitted_level(readings) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        E.fitted_level(readings[3:])
