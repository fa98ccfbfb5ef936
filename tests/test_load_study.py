"""analysis.load_study, the entry point for notebooks and scripts, on a tiny sweep."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from analysis import load_study
from analysis import metrics as M
from analysis.load import load_runs
from analysis.study import analyse
from analysis.study import probe_curves, training_curves
from qkstudy.config import TrainConfig
from qkstudy.errors import UsageError

LRS = (3e-3, 1.0)  # one LR that trains, one that diverges


@pytest.fixture(scope="module")
def tiny_runs(tiny_data, tmp_path_factory) -> Path:
    """Depth 1 x both arms x 2 LRs x 2 seeds, 12 steps each: the smallest sweep with paired
    gaps (a few seconds of training)."""
    from qkstudy.trainer import train

    runs = tmp_path_factory.mktemp("explore") / "runs"
    base = TrainConfig(data=tiny_data, depth=1, n_heads=2, d_model=16, block_size=16,
                       batch_size=2, max_steps=12, warmup_steps=2, eval_every=6,
                       eval_batches=1, probe_every=6, log_every=2, ckpt_every=12,
                       runs_dir=str(runs), sweep="tiny", divergence_window=4)
    for qk in ("none", "rmsnorm"):
        for lr in LRS:
            for seed in (0, 1):
                train(dataclasses.replace(base, qk_norm=qk, lr=lr, seed=seed).validate(),
                      verbose=False)
    return runs


def test_load_study_returns_the_report_tables(tiny_runs):
    study = load_study(tiny_runs)
    expected = {
        "gaps": {"depth", "compared_arm", "lr", "pairs", "mean_gap", "ci_lo", "ci_hi", "decision"},
        "thresholds": {"depth", "compared_arm", "onset_lr", "ci_lo", "ci_hi", "onset", "tested_rule"},
        "verdicts": {"hypothesis", "compared_arm", "verdict", "family_size", "seeds", "evidence"},
        "per_run": {"run", "depth", "arm", "lr", "seed", "status", "final_val_loss"},
        "arms": {"depth", "arm", "max_usable_lr", "optimal_lr", "best_loss"},
        "h2_tests": {"depth", "compared_arm", "measure", "effect", "decision"},
        "h3_tests": {"compared_arm", "depths", "slope", "ci_lo", "ci_hi", "decision"},
        "best_gaps": {"depth", "compared_arm", "mean_gap", "ci_lo", "ci_hi", "decision"},
    }
    for name, columns in expected.items():
        table = getattr(study, name)
        assert isinstance(table, pl.DataFrame), name
        assert columns <= set(table.columns), (name, columns - set(table.columns))
    assert study.per_run.height == 8
    assert study.verdicts["hypothesis"].to_list() == ["H1", "H2", "H3"]
    assert sorted(study.gaps["lr"].to_list()) == list(LRS) and set(study.gaps["pairs"]) == {2}
    # the report's numbers, not a second implementation of them
    same = analyse(load_runs(tiny_runs))
    assert study.gaps.drop("seed_gaps").equals(same.gaps.drop("seed_gaps"))
    assert study.verdicts.equals(same.verdicts)
    assert isinstance(study.runs.metrics, pl.LazyFrame)
    assert isinstance(study.runs.probes, pl.LazyFrame)
    assert {"run", "step", "val_loss"} <= set(study.runs.metrics.collect_schema().names())
    # study options alone are accepted and reach the metrics
    wider = load_study(str(tiny_runs), M.Options(min_gap=0.05))
    assert set(wider.thresholds["min_gap"]) == {0.05}


def test_curves_carry_each_runs_own_design(tiny_runs):
    study = load_study(tiny_runs)
    curves = training_curves(study)
    # the logs' scheduled `lr` must not replace the run's LR
    per_run = curves.group_by("run").agg(pl.col("lr").n_unique(), lr_value=pl.col("lr").first())
    assert set(per_run["lr"]) == {1} and set(per_run["lr_value"]) == set(LRS)
    assert curves["val_loss"].drop_nulls().len() > 0 and curves["run"].n_unique() == 8
    probes = probe_curves(study, "max_attention_logit")
    assert set(probes["name"]) == {"max_attention_logit"} and probes["run"].n_unique() == 8


def test_load_study_bad_input_is_one_line_usage_error(tmp_path, tiny_runs):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "file.txt").write_text("x")
    cases = [(tmp_path / "missing", "does not exist"), (tmp_path / "file.txt", "not a folder"),
             (empty, "no runs under"), (None, "expected a runs folder")]
    for path, words in cases:
        with pytest.raises(UsageError) as e:
            load_study(path)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(UsageError, match="options must be"):
        load_study(tiny_runs, {"alpha": 0.1})
