"""What a sweep trains after its grid (qkstudy/sweep/adaptive.py): bisection of the seed-mean
crossing and adaptive seeds, replayed from summary.json files written here by hand (no
training); the rules it shares with the analysis."""

from __future__ import annotations

import dataclasses
import json

import pytest

from qkstudy.sweep import adaptive
from qkstudy.sweep.config import parse_sweep_config, run_config
from qkstudy.run_folder import RunFolder


def test_a_cell_is_open_until_an_interval_decides_it():
    assert not adaptive.is_open([0.5, 0.52, 0.49], 0.02)  # off clearly worse
    assert not adaptive.is_open([-0.05, -0.06, -0.055], 0.02)  # on clearly worse
    assert not adaptive.is_open([0.001, -0.002, 0.0015], 0.02)  # 90% interval inside +-0.02
    assert adaptive.is_open([0.018, -0.001, 0.026], 0.02)  # [-0.02, +0.05]: undecided
    assert adaptive.is_open([0.3, -0.1, 0.05], 0.02)
    assert adaptive.is_open([0.5], 0.02)  # one seed decides nothing
    # above 0 with error control but not beyond the margin, nor inside it: still open
    assert adaptive.is_open([0.09, 0.10, 0.11], 0.1)


def test_no_difference_never_closes_a_cell_near_a_gap_beyond_the_margin():
    means = {0.01: 0.0, 0.0132: -0.01, 0.0173: 0.27, 0.03: 0.45}
    near = [lr for lr in means if adaptive.near_beyond_margin(lr, means, 0.1)]
    # 0.0173 is 0.12 decades above 0.0132 but 0.24 above 0.01 and 0.24 below 0.03
    assert near == [0.0132]
    assert adaptive.near_beyond_margin(0.01, {0.01: 0.3, 0.001: 0.0}, 0.1) is False  # itself
    assert adaptive.near_beyond_margin(0.1, {0.07: -0.2}, 0.1)  # either side, either sign
    tight = [0.001, -0.002, 0.0015]
    assert not adaptive.is_open(tight, 0.02) and adaptive.is_open(tight, 0.02, near=True)
    assert not adaptive.is_open([0.5, 0.52, 0.49], 0.02, near=True)  # off worse still closes


# Five seeds all short of their own onsets just below a sharp onset (a simulated study's cell
# at LR 0.0132 that the equivalence test alone called "no difference"), the next LR up with
# some seeds past theirs
ONSET_GAPS = {1e-3: [0.01, -0.01, 0.005, 0.0, -0.004], 3e-3: [0.012, -0.006, 0.0, 0.009, -0.01],
              1e-2: [0.02, -0.015, 0.004, 0.01, -0.008],
              0.0132: [0.006, -0.008, -0.011, -0.01, -0.039],
              0.0173: [0.45, 0.44, 0.003, 0.46, 0.01], 3e-2: [0.45, 0.47, 0.44, 0.46, 0.45]}


def test_the_analysis_decides_no_difference_only_away_from_a_gap_beyond_the_margin():
    import polars as pl

    from analysis.hypotheses import h1_tests
    from analysis.metrics import Options
    from analysis.threshold import tested_rule

    rows = [{"depth": 2, "qk_norm": arm, "arm": arm, "lr": lr, "seed": seed,
             "status": "completed", "init_loss": 5.5,
             "final_val_loss": 2.0 + 0.01 * seed + (gap if arm == "none" else 0.0)}
            for lr, gaps in ONSET_GAPS.items() for seed, gap in enumerate(gaps)
            for arm in ("none", "rmsnorm")]
    cells = h1_tests(pl.DataFrame(rows), Options())[0]
    by_lr = {r["lr"]: r for r in cells.iter_rows(named=True)}
    flat = by_lr[0.0132]
    # the equivalence test alone passes (the rule before: "no difference"), but an LR 0.12
    # decades up has a seed-mean gap of 0.27: undetermined
    assert flat["q_equivalent"] < 0.05 and flat["decision"] == "undetermined"
    assert flat["near_margin"]
    assert [by_lr[lr]["decision"] for lr in (1e-3, 3e-3, 1e-2)] == ["no difference"] * 3
    assert not by_lr[1e-2]["near_margin"]  # 0.24 decades below 0.0173
    assert tested_rule(cells)["no_difference_up_to"] == 1e-2  # "skip below" was 0.0132


def test_the_sweep_adds_seeds_where_no_difference_cannot_close_a_cell(tmp_path):
    sweep = parse_sweep_config(["preset=mini", f"runs_dir={tmp_path}", "lrs=0.001,0.01,0.015",
                                "depth=2", "threshold_steps=0", "seeds=0,1,2", "max_seeds=4"])
    gaps = {0.001: [0.001, -0.002, 0.0015], 0.01: [0.002, -0.001, 0.001],
            0.015: [0.45, 0.46, 0.44]}
    for lr, seed_gaps in gaps.items():
        for seed, gap in enumerate(seed_gaps):
            _write(run_config(sweep, 2, lr, "rmsnorm", seed), 2.0)
            _write(run_config(sweep, 2, lr, "none", seed), 2.0 + gap)
    # 0.01 is as tight as 0.001, but 0.18 decades below a seed-mean gap of 0.45: a fourth seed
    extra = adaptive.extra_runs(sweep, [])
    assert {(c.lr, c.qk_norm, c.seed) for c in extra} == {(0.01, arm, 3)
                                                        for arm in ("none", "rmsnorm")}


def test_the_crossing_bracket_reads_from_the_top_down():
    assert adaptive.crossing_bracket({1e-3: 0.0, 1e-2: 0.01, 1e-1: 0.4, 1.0: 0.5}, 0.02) == \
        (1e-2, 1e-1)
    # an early consistent gap below a calm LR does not move the bracket down
    assert adaptive.crossing_bracket({1e-3: 0.3, 1e-2: 0.0, 1e-1: 0.4}, 0.02) == (1e-2, 1e-1)
    assert adaptive.crossing_bracket({1e-3: 0.3, 1e-2: 0.4}, 0.02) is None  # needed everywhere
    assert adaptive.crossing_bracket({1e-3: 0.0, 1e-2: 0.01}, 0.02) is None  # never needed


def _write(cfg, loss: float, status: str = "completed") -> None:
    folder = RunFolder.of(cfg).path
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({
        "status": status, "init_loss": 5.5, "unigram_entropy": 3.1,
        "final_val_loss": loss if status == "completed" else None}))


GAPS = {0.01: [0.001, -0.002, 0.0015], 0.1: [0.5, 0.52, 0.49], 1.0: [0.3, -0.1, 0.05]}


@pytest.fixture
def sweep(tmp_path):
    return parse_sweep_config(["preset=mini", f"runs_dir={tmp_path}", "lrs=0.01,0.1,1",
                               "depth=2", "threshold_steps=1", "seeds=0,1,2", "max_seeds=4",
                               "min_gap=0.02"])


def test_crossing_bisection_then_adaptive_seeds(sweep):
    for lr, gaps in GAPS.items():
        for seed, gap in enumerate(gaps):
            _write(run_config(sweep, 2, lr, "rmsnorm", seed), 2.0)
            _write(run_config(sweep, 2, lr, "none", seed), 2.0 + gap)
    # no run diverged, so no boundary refinement: the seed-mean gap crosses between 0.01 and 0.1
    first = adaptive.extra_runs(sweep, [])
    assert {(c.lr, c.qk_norm, c.seed) for c in first} == {
        (0.0316, arm, seed) for arm in ("none", "rmsnorm") for seed in range(3)}
    # while those runs have no result, nothing else is asked for
    assert adaptive.extra_runs(sweep, []) == first
    for cfg in first:
        _write(cfg, 2.3 if cfg.qk_norm == "none" else 2.0)
    # threshold_steps=1 is spent: adaptive seeds, one more seed for the one open cell (lr 1)
    second = adaptive.extra_runs(sweep, [])
    assert {(c.lr, c.qk_norm, c.seed) for c in second} == {(1.0, "none", 3), (1.0, "rmsnorm", 3)}
    for cfg in second:
        _write(cfg, 2.1 if cfg.qk_norm == "none" else 2.0)
    # seed 3 leaves the cell open, but max_seeds=4 is reached: done
    assert adaptive.extra_runs(sweep, []) == []


def test_cells_where_neither_arm_learned_get_no_seeds(sweep):
    for lr, gaps in GAPS.items():
        for seed, gap in enumerate(gaps):
            collapsed = lr == 1.0  # both arms end near the unigram entropy: uninformative
            _write(run_config(sweep, 2, lr, "rmsnorm", seed), 3.05 if collapsed else 2.0)
            _write(run_config(sweep, 2, lr, "none", seed), 3.05 + gap / 10 if collapsed
                   else 2.0 + gap)
    assert adaptive.extra_runs(dataclasses.replace(sweep, threshold_steps=0), []) == []


def test_the_closing_report_counts_the_runs_added_after_the_grid(sweep):
    from qkstudy.sweep.run import added_runs

    def write_config(cfg):
        folder = RunFolder.of(cfg).path
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({**cfg.identity(), "run_id": cfg.run_id,
                                                        "framework": "mlx"}))

    extra = run_config(sweep, 2, 0.0316, "rmsnorm", 4)  # an adaptive seed at a crossing point
    grid_run = run_config(sweep, 2, 0.01, "none", 0)
    other = dataclasses.replace(extra, d_model=32)  # another setting in the same folder
    for cfg in (extra, grid_run, other):
        write_config(cfg)
    assert [c.run_id for c in added_runs(sweep, {grid_run.run_id})] == [extra.run_id]


def test_a_sweep_waits_on_extras_another_process_holds(sweep):
    from qkstudy.run_folder import RunFolder
    from qkstudy.sweep.run import _held_elsewhere

    cfg = run_config(sweep, 2, 0.0316, "none", 0)
    run_dir = RunFolder.of(cfg).path
    run_dir.mkdir(parents=True)
    assert not _held_elsewhere(cfg)
    with RunFolder(run_dir).lock() as acquired:  # a second open file: flock treats it as another holder
        assert acquired and _held_elsewhere(cfg)
    _write(cfg, 2.0)
    assert not _held_elsewhere(cfg)  # finished: nothing to wait for


def test_one_rule_scores_a_run_for_the_sweep_the_analysis_and_the_simulation():
    import math

    import polars as pl

    from analysis.metrics import with_losses
    from qkstudy.summaries import DEGRADED_MARGIN, scored_loss

    # (status, final, init, unigram entropy) -> (scored loss, degraded)
    cases = [("completed", 2.0, 5.5, 3.1, 2.0, False),  # learned
             ("completed", 6.0, 5.5, 3.1, 5.5, True),  # worse than at the start: clipped
             ("completed", 3.0, 5.5, 3.1, 3.0, True),  # within 0.2 nats of the unigram entropy
             ("completed", 2.85, 5.5, 3.1, 2.85, False),  # 0.25 below it
             ("completed", 3.0, 5.5, math.nan, 3.0, False),  # entropy unknown: never degraded
             ("diverged", 1.0, 5.5, 3.1, 5.5, False),  # diverged: its initial loss
             ("completed", math.nan, 5.5, 3.1, 5.5, False),  # no finite loss: the same
             ("diverged", math.nan, math.nan, 3.1, math.inf, False)]  # nothing known
    status, final, init, entropy, loss, degraded = map(list, zip(*cases))
    got_loss, got_degraded = scored_loss(final, init, [s == "diverged" for s in status], entropy)
    assert got_loss.tolist() == loss and got_degraded.tolist() == degraded
    assert DEGRADED_MARGIN == 0.2
    for case in cases:  # one run at a time, as the sweep scores its cells
        one_loss, one_degraded = scored_loss(case[1], case[2], case[0] == "diverged", case[3])
        assert (float(one_loss), bool(one_degraded)) == (case[4], case[5])
    # the analysis's per-run table carries the same numbers
    table = pl.DataFrame({"depth": 2, "arm": "none", "status": status, "final_val_loss": final,
                          "init_loss": init, "unigram_entropy": entropy})
    table = table.with_columns(pl.col(c).fill_nan(None) for c in ("init_loss",
                                                                    "unigram_entropy"))
    scored = with_losses(table[:-1])  # the last row would borrow its arm's mean initial loss
    assert scored["loss_clipped"].to_list() == loss[:-1]
    assert scored["degraded"].to_list() == degraded[:-1]


def test_the_sweep_scores_its_cells_by_the_one_rule(sweep):
    # seed 0: off degraded (3.0 > 3.1 - 0.2), on learned; seed 1: off diverged, on learned
    _write(run_config(sweep, 2, 0.1, "none", 0), 3.0)
    _write(run_config(sweep, 2, 0.1, "rmsnorm", 0), 2.0)
    _write(run_config(sweep, 2, 0.1, "none", 1), 0.0, status="diverged")
    _write(run_config(sweep, 2, 0.1, "rmsnorm", 1), 6.0)  # above its initial loss: clipped
    gaps, failed, pending = adaptive.cell(sweep, 2, 0.1, "rmsnorm", [0, 1])
    assert gaps == pytest.approx([1.0, 0.0]) and not failed and pending == []
    _write(run_config(sweep, 2, 0.1, "rmsnorm", 0), 3.05)  # now both arms of seed 0 degraded
    _write(run_config(sweep, 2, 0.1, "rmsnorm", 1), 3.0)  # and seed 1's on arm
    assert adaptive.cell(sweep, 2, 0.1, "rmsnorm", [0, 1])[1]  # every pair failed to learn
