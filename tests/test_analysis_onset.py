"""The onset (the LR from which QK-norm matters), the paired gaps it is read from, and H3's
slope across depths, on onset sweeps with known answers."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis import metrics as M
from analysis import stats as S
from tests.known_answers import (gap_table, onset_sweep, study_tables, thresholds, verdict_of,
                                 with_gaps)


def test_the_onset_known_answer_tested_rule_and_verdicts():
    table = onset_sweep({2: 3e-2, 4: 3e-3})
    tables = study_tables(table)
    th = tables["thresholds"].sort("depth")
    # the fitted gap goes from ~0 to ~0.5 between the LRs either side: it reaches the 0.1-nat
    # margin a fifth of the way, in log LR
    assert th["onset_lr"].to_list() == pytest.approx([1e-2 * 3 ** 0.2, 1e-3 * 3 ** 0.2],
                                                     rel=0.02)
    # the interval holds at least the LRs either side: the data cannot place it within them
    assert th["ci_lo"].to_list() == pytest.approx([1e-2, 1e-3])
    assert th["ci_hi"].to_list() == pytest.approx([3e-2, 3e-3])
    assert th["outside"].to_list() == [None, None]
    assert th["onset"][0] == "0.0125 [0.01, 0.03]"
    # the tested rule: no difference up to 0.01; off worse at 0.03, but the top LR's gap is made
    # by off diverging: sign flips on 3 seeds cannot decide it (2^-3), so no "off worse from"
    assert (th["no_difference_up_to"][0], th["off_worse_from"][0]) == (1e-2, None)
    assert th["trained_up_to"][0] == 0.1
    assert th["tested_rule"][0] == (
        "depth 2: no difference (within 0.1 nats) decided up to LR 0.01; no LR from which every"
        " LR up to 0.1 (the largest up to which every QK-norm run trained) is decided \"off worse\"")
    gaps = tables["gaps"].filter(pl.col("depth") == 2)
    assert gaps["decision"].to_list() == ["no difference"] * 3 + ["off worse", "undetermined"]
    assert gaps["ci_lo"][3] > 0.45 and gaps["ci_hi"][3] < 0.55
    assert gaps["family_size"][0] == 2 * 5 * 3 + 2  # 3 tests per cell, one best loss per depth
    v = {r["hypothesis"]: r for r in tables["verdicts"].iter_rows(named=True)}
    assert v["H1"]["verdict"] == "supported" and v["H1"]["family_size"] > 20
    assert v["H3"]["verdict"] == "supported"  # a decade lower at depth 4
    assert "-1.00 decades per doubling" in v["H3"]["evidence"]


def test_the_onset_is_read_upward_from_the_smallest_mean_gap():
    """A gap of 0.15 nats at the smallest LR (QK-norm learns faster where neither arm is
    trained) does not put the onset below the LRs tested: it is read from the LR where the
    seed-mean gap is smallest, found again in every draw."""
    table = with_gaps(onset_sweep({4: 3e-2}, seeds=5), 1e-3, [0.15] * 5)
    th = thresholds(table).row(0, named=True)
    assert th["outside"] is None
    assert th["onset_lr"] == pytest.approx(1e-2 * 3 ** 0.2, rel=0.02)
    # a gap at the margin everywhere from the lowest point up: below the LRs tested
    low = thresholds(onset_sweep({4: 1e-3}, seeds=5)).row(0, named=True)
    assert low["outside"] == "below the LRs tested" and low["onset_lr"] is None
    assert low["onset"].startswith("< 0.001 [")


def test_the_onset_uses_every_cell_whatever_its_seed_count():
    """The low LRs have 6 seeds, the LRs where off is worse (0.03 and 0.1) only 3 (their cells
    were decided early): every cell enters the fit, weighted by its seeds."""
    six = onset_sweep({4: 3e-2}, seeds=6)
    early = (pl.col("lr") >= 3e-2) & (pl.col("seed") >= 3)
    table = six.filter(~early)
    assert table.filter(pl.col("lr") == 3e-2)["seed"].n_unique() == 3
    th = thresholds(table).row(0, named=True)
    assert th["outside"] is None
    assert th["onset_lr"] == pytest.approx(1e-2 * 3 ** 0.2, rel=0.02)
    # the same answer as when every cell has 3 seeds
    three = thresholds(six.filter(pl.col("seed") < 3)).row(0, named=True)
    assert th["onset_lr"] == pytest.approx(three["onset_lr"], rel=0.02)


def test_a_small_low_lr_gap_does_not_move_the_onset():
    """At the plan's 0.1-nat margin, a low-LR gap of +0.016 or +0.021 leaves the onset where
    the large effect starts."""
    base = onset_sweep({4: 3e-2}, seeds=5)
    at = [thresholds(with_gaps(base, 3e-3, [g] * 5)).row(0, named=True)["onset_lr"]
          for g in (0.016, 0.021)]
    assert at[0] == pytest.approx(at[1], rel=0.01)
    assert at[0] == pytest.approx(1e-2 * 3 ** 0.2, rel=0.02)


def test_the_top_lr_cannot_break_the_chain():
    # depth 2's 0.03 cell with gaps +0.108, +0.357, +0.040 (one noisy seed): the monotone fit
    # keeps every depth's onset inside the grid; depth 2's moves up a little
    table = onset_sweep({2: 3e-2, 4: 3e-2, 8: 3e-2})
    table = with_gaps(table, 3e-2, [0.108, 0.357, 0.040], depth=2)
    tables = study_tables(table)
    th = tables["thresholds"].sort("depth")
    assert th["outside"].to_list() == [None, None, None]
    assert (th["onset_lr"] > 1e-2).all() and (th["onset_lr"] < 3e-2).all()
    assert th["onset_lr"][0] > th["onset_lr"][1] == pytest.approx(th["onset_lr"][2])
    assert -0.25 < tables["h3"]["slope"][0] < 0  # far less than the fall H3 is about


def test_h3_is_a_slope_with_a_known_value():
    # onset half a decade earlier at each doubling of depth. The fitted gap reaches 0.1 nats a
    # fraction of the way from the last calm LR: 0.1 / 0.5 at depths 4 and 8, 0.1 / 2.5 at
    # depth 2 (off diverged at 0.1: a gap of 5.5 - 3.0), in log LR
    table = onset_sweep({2: 1e-1, 4: 3e-2, 8: 1e-2}, seeds=5)
    known = np.log10([3e-2 * (1e-1 / 3e-2) ** 0.04, 1e-2 * 3 ** 0.2, 3e-3 * (1e-2 / 3e-3) ** 0.2])
    expected = np.polyfit(np.log2([2, 4, 8]), known, 1)[0]
    assert expected == pytest.approx(-0.46, abs=0.01)
    h3 = study_tables(table)["h3"].row(0, named=True)
    assert h3["slope"] == pytest.approx(expected, abs=1e-3)
    assert h3["ci_lo"] <= h3["slope"] <= h3["ci_hi"] < 0
    assert h3["decision"] == "falls" and h3["family_size"] == 3
    assert verdict_of(table, "H3")["verdict"] == "supported"


def test_h3_interval_is_widened_by_the_calibrated_factor():
    """The slope's whole-seed draws are spread about the estimate by Options.slope_widening
    (2.75, the calibrated choice); 0 falls back to t(0.975, n - 1) / z(0.975), 1.416 at 5 seeds."""
    import analysis.hypotheses as H

    assert M.Options().slope_widening == 2.75
    assert H.small_sample_widening(5) == pytest.approx(2.7764 / 1.95996, rel=1e-4)
    assert H.small_sample_widening(2) == pytest.approx(12.7062 / 1.95996, rel=1e-4)
    assert 1 < H.small_sample_widening(200) < 1.01
    table = onset_sweep({2: 1e-1, 4: 3e-2, 8: 1e-2}, seeds=5)
    rows = {k: study_tables(table, M.Options(slope_widening=k))["h3"].row(0, named=True)
            for k in (1.0, 2.0, 0.0)}
    plain = rows[1.0]
    for k, factor in ((2.0, 2.0), (0.0, H.small_sample_widening(5))):
        assert rows[k]["slope"] == plain["slope"]
        for end in ("ci_lo", "ci_hi"):
            assert rows[k][end] - rows[k]["slope"] == pytest.approx(
                factor * (plain[end] - plain["slope"]), rel=1e-9, abs=1e-12)


def test_equal_onsets_are_not_a_fall():
    tables = study_tables(onset_sweep({2: 3e-2, 4: 3e-2, 8: 3e-2}, seeds=6))
    h3 = tables["h3"].row(0, named=True)
    assert h3["slope"] == pytest.approx(0, abs=1e-9) and h3["decision"] == "equal"
    v = tables["verdicts"].filter(pl.col("hypothesis") == "H3").row(0, named=True)
    assert v["verdict"] == "not supported" and "equal (q fall" in v["evidence"]


def test_an_onset_below_the_lrs_tested_gives_no_slope():
    tables = study_tables(onset_sweep({2: 3e-2, 4: 1e-3}, seeds=5))
    assert tables["thresholds"].sort("depth")["outside"].to_list() == [
        None, "below the LRs tested"]
    h3 = tables["h3"].row(0, named=True)
    assert math.isnan(h3["slope"]) and h3["decision"] == "undetermined"
    assert "outside the LRs read at depth 4" in h3["note"]
    assert verdict_of(onset_sweep({2: 3e-2, 4: 1e-3}, seeds=5), "H3")["verdict"] == \
        "inconclusive"


def test_an_undetermined_low_lr_is_not_no_difference():
    table = with_gaps(onset_sweep({4: 3e-2}), 1e-3, [0.15, -0.02, 0.09])
    row = gap_table(table).filter(pl.col("lr") == 1e-3).row(0, named=True)
    assert row["decision"] == "undetermined"  # the interval reaches past the 0.1 margin
    assert row["ci_lo"] < 0 < row["ci_hi"]


def test_a_harmful_on_arm_counts_against_h1():
    table = with_gaps(onset_sweep({4: 3e-2}, seeds=6), 1e-2, [-0.15, -0.16, -0.155, -0.15,
                                                                   -0.158, -0.152])
    row = gap_table(table).filter(pl.col("lr") == 1e-2).row(0, named=True)
    assert row["decision"] == "on worse" and row["ci_hi"] < -0.1
    v = verdict_of(table, "H1")
    assert v["verdict"] == "not supported" and "on worse at 0.01" in v["evidence"]


def test_a_tie_is_not_significant_and_a_tiny_gap_is_no_difference():
    tie = onset_sweep({4: 3e-2}).with_columns(final_val_loss=pl.when(
        (pl.col("qk_norm") == "none") & pl.col("final_val_loss").is_not_null())
        .then(pl.col("final_val_loss") - pl.lit([0.004, -0.003, -0.001])
              .list.get(pl.col("seed"))).otherwise(pl.col("final_val_loss")))
    row = gap_table(tie).filter(pl.col("lr") == 3e-2).row(0, named=True)
    assert row["p_off_worse"] == 0.125 and row["decision"] == "undetermined"
    gaps = [0.004, 0.006, 0.005, 0.003, 0.007, 0.005]
    tiny = with_gaps(onset_sweep({4: 3e-2}, seeds=6), 3e-2, gaps)
    row = gap_table(tiny).filter(pl.col("lr") == 3e-2).row(0, named=True)
    # above 0 beyond doubt, but far inside the margin: no difference, as the plan defines it
    assert S.p_greater(gaps) < 1e-3 and row["decision"] == "no difference"


def test_collapsed_runs_are_uninformative():
    # both arms end near the unigram entropy (3.1) at the largest LRs: they say nothing
    table = onset_sweep({4: 1e-2}).with_columns(unigram_entropy=pl.lit(3.1))
    collapsed = pl.col("lr") >= 3e-2
    table = table.with_columns(
        final_val_loss=pl.when(collapsed).then(3.05 + pl.col("seed") * 0.01)
        .otherwise(pl.col("final_val_loss") - 0.8),
        status=pl.when(collapsed).then(pl.lit("completed")).otherwise(pl.col("status")))
    scored = M.with_losses(table)
    assert scored.filter(collapsed)["degraded"].all()
    assert not scored.filter(~collapsed)["degraded"].any()
    tables = study_tables(table)
    gaps = tables["gaps"]
    assert gaps.filter(pl.col("lr") >= 3e-2)["decision"].to_list() == ["uninformative"] * 2
    th = tables["thresholds"].row(0, named=True)
    assert 3e-3 < th["onset_lr"] < 1e-2  # the collapse is passed over
    assert th["trained_up_to"] == 1e-2
    usable = M.max_usable_lr_per_seed(table)
    assert usable["max_usable_lr"].to_list() == [1e-2] * 6  # degraded from 3e-2
    pooled = tables["h2"].filter(pl.col("depth").is_null())
    assert pooled["measure"].to_list() == ["LR sensitivity", "max usable LR"]
    row = pooled.filter(pl.col("measure") == "max usable LR").row(0, named=True)
    # equal in every seed, but the boundary is known only within x3 (grid steps, no bisection):
    # coarser than the x2 margin, so "equivalent" is not claimed
    assert row["per_seed"] == ", ".join(["x1"] * 3) and row["resolution"] == pytest.approx(3)
    assert row["p_equivalent"] is None and row["decision"] == "undetermined"
    assert "not x1.41 or finer" in row["note"]


def test_added_seeds_enter_the_gaps_but_not_the_curves():
    table = onset_sweep({4: 3e-2}, seeds=6).with_columns(
        added_seed=pl.col("seed") >= 3)
    extra = (pl.col("seed") < 3) | (pl.col("lr") == 1e-2)  # seeds 3-5 ran one cell only
    table = table.filter(extra)
    assert gap_table(table).filter(pl.col("lr") == 1e-2)["pairs"][0] == 6
    assert gap_table(table).filter(pl.col("lr") == 3e-2)["pairs"][0] == 3
    assert M.lr_sensitivity_per_seed(table)["seed"].unique().sort().to_list() == [0, 1, 2]
    assert M.max_usable_lr_per_seed(table)["seed"].unique().sort().to_list() == [0, 1, 2]
