"""Analysis metrics on hand-made tables with known answers: LR sensitivity and its base grid,
the max usable and optimal LR, scoring that drops no run, loss thresholds, probe and spike
summaries, and each run's arm."""

from __future__ import annotations

import math

import polars as pl
import pytest

from analysis import metrics as M
from qkstudy.config import TrainConfig
from tests.known_answers import points


# --- LR sensitivity ---------------------------------------------------------------------------

def test_lr_sensitivity_clips_at_init_and_ignores_refinement_points():
    grid = [1e-3, 1e-2, 1e-1, 1.0]
    seed0 = [3.0, 2.5, 2.8, None]  # diverged at lr 1 -> counts as its init loss 4.0
    seed1 = [3.1, 2.6, 2.7, 4.5]  # finished above its init loss 4.2 -> clipped to 4.2
    rows = [(2, "none", lr, 0, loss, 4.0) for lr, loss in zip(grid, seed0)]
    rows += [(2, "none", lr, 1, loss, 4.2) for lr, loss in zip(grid, seed1)]
    rows.append((2, "none", 0.05, 0, 2.0, 4.0))  # a refinement run of one seed: not in the grid
    per_seed = M.lr_sensitivity_per_seed(points(rows))
    assert per_seed["grid_points"].to_list() == [4, 4]
    # seed 0: mean(3.0, 2.5, 2.8, 4.0) - 2.5 = 0.575; seed 1: mean(3.1, 2.6, 2.7, 4.2) - 2.6 = 0.55
    assert per_seed["lr_sensitivity"].to_list() == pytest.approx([0.575, 0.55])
    arm = M.arm_table(points(rows)).row(0, named=True)
    assert arm["lr_sensitivity"] == pytest.approx(0.5625)
    assert arm["sensitivity_seeds"] == 2
    grid_marks = M.mark_base_grid(points(rows)).filter(pl.col("lr") == 0.05)
    assert grid_marks["in_grid"].to_list() == [False]


def test_refine_marker_takes_precedence_over_presence():
    rows = [(1, q, lr, s, 3.0 - lr, 4.0) for q in ("none", "rmsnorm") for s in (0, 1)
            for lr in (0.01, 0.1, 0.3)]
    marked = points(rows).with_columns(refine=pl.col("lr") == 0.3)
    per_seed = M.lr_sensitivity_per_seed(marked)
    assert set(per_seed["grid_points"].to_list()) == {2}
    assert per_seed["lr_sensitivity"].to_list() == pytest.approx([0.045] * 4)  # (2.99+2.9)/2-2.9


def test_base_grid_is_common_to_every_depth_else_per_depth():
    rows = [(d, q, lr, s, 3.0, 4.0) for d in (1, 2) for q in ("none", "rmsnorm") for s in (0, 1)
            for lr in (0.01, 0.1, 1.0)]
    rows += [(2, q, 0.3, s, 2.5, 4.0) for q in ("none", "rmsnorm") for s in (0, 1)]  # refinement
    marked = M.mark_base_grid(points(rows))
    assert set(marked["grid_rule"]) == {"common"}
    assert marked.filter(pl.col("lr") == 0.3)["in_grid"].to_list() == [False] * 4
    assert marked.filter(pl.col("lr") != 0.3)["in_grid"].all()
    # grids that share fewer than two LRs across depths: each depth keeps its own
    shifted = points(rows).with_columns(lr=pl.when(pl.col("depth") == 2).then(pl.col("lr") / 7)
                                        .otherwise(pl.col("lr")))
    marked = M.mark_base_grid(shifted)
    assert set(marked["grid_rule"]) == {"per depth"} and marked["in_grid"].all()


# --- max usable LR ----------------------------------------------------------------------------

def test_max_usable_lr_starts_at_the_best_lr_and_counts_bisection_runs():
    rows = [
        # seed 0: best at 0.1; 0.3 (a bisection LR) ok, 0.5 diverged, 1.0 diverged
        (4, "none", 0.01, 0, 3.0, 5.0), (4, "none", 0.1, 0, 2.9, 5.0),
        (4, "none", 1.0, 0, None, 5.0), (4, "none", 0.3, 0, 3.1, 5.0),
        (4, "none", 0.5, 0, None, 5.0),
        # seed 1: 0.001 diverged below the best LR (does not enter); 0.1 diverged above it
        (4, "none", 0.001, 1, None, 5.0), (4, "none", 0.01, 1, 3.0, 5.0),
        (4, "none", 0.1, 1, None, 5.0), (4, "none", 1.0, 1, 3.4, 5.0),
        (4, "none", 0.03, 1, 2.95, 5.0),
        # on arm: nothing failed above its best LR -> a lower bound at the largest LR run
        (4, "rmsnorm", 0.01, 0, 3.0, 5.0), (4, "rmsnorm", 1.0, 0, 3.2, 5.0),
    ]
    per_seed = M.max_usable_lr_per_seed(points(rows))
    got = {(r["arm"], r["seed"]): r for r in per_seed.iter_rows(named=True)}
    assert (got[("none", 0)]["best_lr"], got[("none", 0)]["max_usable_lr"]) == (0.1, 0.3)
    assert got[("none", 0)]["first_failed_lr"] == 0.5
    assert (got[("none", 1)]["best_lr"], got[("none", 1)]["max_usable_lr"]) == (0.03, 0.03)
    assert got[("none", 1)]["first_failed_lr"] == 0.1
    assert got[("none", 1)]["first_divergent_lr"] == 0.001
    assert got[("rmsnorm", 0)]["max_usable_lr"] == 1.0 and got[("rmsnorm", 0)]["lower_bound"]
    arms = M.arm_table(points(rows)).filter(pl.col("arm") == "none").row(0, named=True)
    assert arms["max_usable_lr"] == pytest.approx(math.sqrt(0.3 * 0.03))
    assert (arms["max_usable_lr_lo"], arms["max_usable_lr_hi"]) == (0.03, 0.3)
    assert arms["lower_bound_seeds"] == 0


def test_optimal_lr_and_best_loss_per_seed():
    rows = [(1, "none", 0.01, 0, 3.0, 5.0), (1, "none", 0.1, 0, 2.0, 5.0),
            (1, "none", 1.0, 0, None, 5.0),
            (1, "none", 0.01, 1, 2.5, 5.0), (1, "none", 0.1, 1, 2.6, 5.0)]
    row = M.arm_table(points(rows)).row(0, named=True)
    assert row["optimal_lr"] == pytest.approx(math.sqrt(0.1 * 0.01))
    assert row["best_loss"] == pytest.approx(2.25)


# --- scoring: no run is ever dropped ---------------------------------------------------------

def test_a_completed_run_with_a_nan_final_loss_counts_as_its_init_loss():
    # Wortsman et al.: every grid point is scored, a non-finite loss as the initial loss. The
    # NaN run must neither vanish nor take its LR out of the other arm's grid.
    grid = [1e-3, 1e-2, 1e-1]
    rows = [(2, "none", 1e-3, 0, 3.0, 5.0), (2, "none", 1e-2, 0, 2.5, 5.0),
            (2, "none", 1e-1, 0, math.nan, 5.0)]
    rows += [(2, "rmsnorm", lr, 0, loss, 5.0) for lr, loss in zip(grid, (3.0, 2.5, 2.4))]
    table = points(rows)
    scored = M.with_losses(table)
    assert scored.height == 6
    assert scored.filter(pl.col("nonfinite_final"))["loss_clipped"].to_list() == [5.0]
    sens = {r["arm"]: r for r in M.lr_sensitivity_per_seed(table).iter_rows(named=True)}
    assert sens["none"]["grid_points"] == sens["rmsnorm"]["grid_points"] == 3
    assert sens["none"]["lr_sensitivity"] == pytest.approx((3.0 + 2.5 + 5.0) / 3 - 2.5)
    assert sens["rmsnorm"]["lr_sensitivity"] == pytest.approx((3.0 + 2.5 + 2.4) / 3 - 2.4)
    assert M.arm_table(table).filter(pl.col("arm") == "none")["nonfinite_final"][0] == 1


def test_default_loss_threshold_is_reached_by_both_arms_mid_training():
    runs = pl.DataFrame({"run": ["a", "b"], "depth": [2, 2], "arm": ["none", "rmsnorm"],
                         "lr": [0.01, 0.01], "seed": [0, 0], "status": ["completed"] * 2,
                         "final_val_loss": [2.0, 1.8], "init_loss": [5.0, 5.0],
                         "steps": [100, 100]})
    metrics = pl.LazyFrame({"run": ["a"] * 3 + ["b"] * 3, "step": [0, 50, 100] * 2,
                            "val_loss": [5.0, 2.6, 2.0, 5.0, 2.2, 1.8], "tokens": [0] * 6})
    level = M.default_loss_thresholds(runs, metrics)
    assert level.to_dicts() == [{"depth": 2, "loss_threshold": 2.6}]
    reached = M.steps_to_threshold(metrics, runs, level).sort("run")
    assert reached["steps_to_threshold"].to_list() == [50, 50]


def test_worst_probe_values_over_training():
    per_step = pl.DataFrame({"run": ["a"] * 6, "step": [0, 10, 20] * 2,
                             "name": ["attention_entropy_min_head"] * 3 + ["residual_kurtosis"] * 3,
                             "value": [2.0, 0.1, 0.5, 3.0, 40.0, 10.0]})
    row = M.probe_summary(per_step).row(0, named=True)
    assert (row["worst_attention_entropy_min_head"], row["worst_attention_entropy_min_head_step"]
            ) == (0.1, 10)
    assert (row["worst_residual_kurtosis"], row["worst_residual_kurtosis_step"]) == (40.0, 10)
    assert row["final_residual_kurtosis"] == 10.0


def test_spikes_are_summed_per_arm_and_lr():
    table = points([(2, "none", 0.1, s, 3.0, 5.0) for s in range(3)]
                   + [(2, "rmsnorm", 0.1, s, 2.9, 5.0) for s in range(3)])
    table = table.with_columns(loss_spikes=pl.Series([2, 0, 1, 0, 0, 0]),
                               max_spike=pl.Series([1.5, 0.2, 3.0, 0.1, 0.1, 0.2]))
    rows = {r["arm"]: r for r in M.spike_table(table).iter_rows(named=True)}
    assert (rows["none"]["runs_with_spikes"], rows["none"]["loss_spikes"],
            rows["none"]["max_spike"]) == (2, 3, 3.0)
    assert (rows["rmsnorm"]["runs_with_spikes"], rows["rmsnorm"]["loss_spikes"]) == (0, 0)


def test_probe_parts_with_and_without_a_head_column_read_together(tmp_path):
    """Parts written before the head column read back with it null; a per-head probe's rows
    reduce over heads and layers together by its registry entry (attention_sink_share: max)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis import load as L

    old, new = tmp_path / "old" / "probes", tmp_path / "new" / "probes"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    pq.write_table(pa.table({"step": [0], "layer": [0], "name": ["max_attention_logit"],
                             "value": [2.0]}), old / "part-00000000-00000000.parquet")
    pq.write_table(pa.table({"step": [0] * 5, "layer": [0, 0, 1, 1, 0],
                             "name": ["attention_sink_share"] * 4 + ["max_attention_logit"],
                             "value": [0.2, 0.7, 0.4, 0.1, 3.0],
                             "head": pa.array([0, 1, 0, 1, None], pa.int64())}),
                   new / "part-00000000-00000000.parquet")
    parts = {run: L._check_parts(tmp_path / run / "probes", L.PROBES_COLUMNS)[0]
             for run in ("old", "new")}
    probes = L._scan(parts, L.PROBES_COLUMNS, L.PROBES_OPTIONAL).collect().sort("run", "value")
    assert probes.filter(pl.col("run") == "old")["head"].to_list() == [None]
    assert probes.filter(pl.col("name") == "attention_sink_share")["head"].to_list() == [1, 0, 0, 1]
    reduced = M.probe_over_layers(probes.lazy()).collect()
    share = reduced.filter(pl.col("name") == "attention_sink_share")
    assert share["value"].to_list() == [0.7]


def test_load_names_each_run_by_its_arm_as_the_sweep_does():
    from qkstudy.arms import arm_name, arm_of, canonical

    for name in ("none", "rmsnorm", "layernorm", "softcap50", "softcap7.5", "zloss1e-4",
                 "zloss3e-5", "zloss0.01"):
        cfg = sweep_arm_config(name)
        assert arm_of(cfg.identity()) == arm_name(cfg) == canonical(name) == name
    assert arm_of({"lr": 0.1, "qk_norm": "rmsnorm"}) == "rmsnorm"  # an older run
    assert arm_of({"qk_norm": "none", "z_loss": "7", "attn_softcap": True}) == "none"  # damaged
    both = TrainConfig(qk_norm="layernorm", z_loss=1e-4)
    assert arm_of(both.identity()) == "layernorm+zloss1e-4"
    assert M.arm_words("layernorm+zloss1e-4") == "QK-norm on (layernorm) + z-loss 1e-4"


def sweep_arm_config(name: str) -> TrainConfig:
    from qkstudy.arms import apply_arm

    return apply_arm(TrainConfig(), name)
