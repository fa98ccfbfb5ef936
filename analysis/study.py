"""The study: `analyse(runs)` chooses the runs that enter the numbers and computes every table
and verdict the report is drawn from; `load_study(path)` does the same from a runs folder for
notebooks and scripts (docs/analysis.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from qkstudy.errors import UsageError
from qkstudy.run_folder import FINISHED

from . import hypotheses as H
from . import metrics as M
from . import verdicts as V
from .load import Runs, load_runs

DESIGN = ("run", "depth", "arm", "lr", "seed", "status")


@dataclass(frozen=True)
class ReportOptions:

    loss_threshold: float | None = None  # steps-to-threshold level; None: per depth
    curve_lrs: tuple[float, ...] = ()  # LRs for training curves; empty: chosen per depth
    probe_names: tuple[str, ...] = ()  # probes for the "other probes" chart
    study: M.Options = field(default_factory=M.Options)
    png_scale: float = 2.0
    framework: str = ""  # whose runs enter the study (mlx, torch, torch-bf16, ...); empty: MLX's
    # when there are any, else the most common (docs/report.md)
    compare_with: str = ""  # a second runs folder (or the same): the page compares the answers
    compare_framework: str = ""  # the framework of the compared study; empty: as `framework`


@dataclass
class Study:

    runs: Runs
    framework: str
    setting: str
    points: pl.DataFrame  # finished runs of the primary framework and setting
    others: pl.DataFrame  # finished runs of other frameworks in that setting (overlaid)
    probe_steps: pl.DataFrame  # (run, step, name, value) reduced over layers
    per_run: pl.DataFrame
    arms: pl.DataFrame
    sensitivity_per_seed: pl.DataFrame
    usable_per_seed: pl.DataFrame  # H2's max usable LR per (depth, arm, seed)
    gaps: pl.DataFrame
    spikes: pl.DataFrame
    verdicts: pl.DataFrame
    best_gaps: pl.DataFrame  # H1: off's best loss minus on's, each at its own optimal LR
    h2_tests: pl.DataFrame  # H2: max usable LR ratio and LR sensitivity drop, pooled and per depth
    thresholds: pl.DataFrame  # the onset and the tested rule per (depth, compared arm)
    h3_tests: pl.DataFrame  # H3: the slope of log10(onset) on log2(depth)
    twins: pl.DataFrame
    exploratory_gaps: pl.DataFrame  # H1's cells with every seed, added ones too (not verdicts)
    loss_thresholds: pl.DataFrame
    notes: list[str]


def setting_label(setting: str, all_settings: list[str]) -> str:
    if len(all_settings) <= 1:
        return "all runs share one setting"
    mine = json.loads(setting)
    others = [json.loads(s) for s in all_settings if s != setting]
    keys = sorted({k for o in others for k in set(o) | set(mine) if o.get(k) != mine.get(k)})
    return ", ".join(f"{k}={mine.get(k)}" for k in keys)


def _most_common(column: pl.Series) -> str:
    return column.value_counts(sort=True).row(0)[0]


def choose_framework(runs: Runs, framework: str = "") -> str:
    """The framework whose finished runs enter the study: `framework` when given, else MLX's
    when there are any, else the most common; UsageError when it has no finished run."""
    finished = runs.table.filter(pl.col("status").is_in(FINISHED))
    if finished.is_empty():
        raise UsageError(f"no finished runs under {runs.root} (all {runs.table.height} failed)")
    found = sorted(finished["framework"].unique().to_list())
    if framework and framework not in found:
        raise UsageError(f"framework={framework}: no finished {framework} runs under "
                         f"{runs.root} (its finished runs are {', '.join(found)})")
    return framework or ("mlx" if "mlx" in found else _most_common(finished["framework"]))


def _primary(runs: Runs, notes: list[str], framework: str = ""
             ) -> tuple[str, str, pl.DataFrame, pl.DataFrame]:
    """(framework, setting, the runs that enter the metrics, other frameworks' twins)."""
    framework = choose_framework(runs, framework)
    finished = runs.table.filter(pl.col("status").is_in(FINISHED))
    primary = finished.filter(pl.col("framework") == framework)
    setting = _most_common(primary["setting"])
    settings = primary["setting"].unique().to_list()
    if len(settings) > 1:
        left = primary.filter(pl.col("setting") != setting)
        notes.append(f"the study metrics use the largest group of {framework} runs that share "
                     f"one setting: {primary.height - left.height} runs with "
                     f"{setting_label(setting, settings)}; the other {left.height} runs differ "
                     f"in that setting and are listed but left out of the metrics (give their "
                     f"sweep folder to report them)")
    points = primary.filter(pl.col("setting") == setting)
    unique = points.unique(subset="identity", keep="first", maintain_order=True)
    if unique.height < points.height:
        notes.append(f"{points.height - unique.height} runs repeat the configuration of another "
                     f"run (same identity, another folder); the first of each is used")
        points = unique
    pairs = points.select("seed", "data_seed").unique()
    if pairs.height > pairs["seed"].n_unique():
        points = points.with_columns(
            seed=(pl.struct("seed", "data_seed").rank("dense") - 1).cast(pl.Int64))
        notes.append("seeds count as (seed, data_seed) pairs, numbered from 0 in the metrics")
    others = finished.filter((pl.col("framework") != framework) & (pl.col("setting") == setting))
    if others.height:
        notes.append(f"{others.height} run{'s' if others.height != 1 else ''} of framework "
                     f"{', '.join(sorted(others['framework'].unique()))} are overlaid on their "
                     f"{framework} twins, not mixed into the study metrics")
    return framework, setting, points, others


def analyse(runs: Runs, options: ReportOptions = ReportOptions()) -> Study:
    notes: list[str] = []
    framework, setting, points, others = _primary(runs, notes, options.framework)
    study = options.study
    exploratory_gaps = pl.DataFrame(schema=H.GAP_SCHEMA)
    if "added_seed" in points.columns and points["added_seed"].fill_null(False).any():
        # seeds added after looking at the data are optional stopping: kept out of the verdicts
        added = points.filter(pl.col("added_seed").fill_null(False))
        notes.append(f"{added.height} runs of seeds added after the data were seen (seeds "
                     f"{', '.join(map(str, sorted(added['seed'].unique().to_list())))}) are "
                     f"exploratory: left out of the verdicts, their cells are in the "
                     f"exploratory_gaps table")
        exploratory_gaps = H.h1_tests(points, study)[0]
        points = points.filter(~pl.col("added_seed").fill_null(False))
    v = V.study_verdicts(points, study)
    if options.loss_threshold is not None:
        loss_thresholds = pl.DataFrame({"depth": sorted(runs.table["depth"].unique().to_list())}
                                       ).with_columns(loss_threshold=options.loss_threshold)
    else:
        loss_thresholds = M.default_loss_thresholds(points, runs.metrics)
    probe_steps = M.probe_over_layers(runs.probes).collect()
    per_run = per_run_table(runs, probe_steps, loss_thresholds, in_study=points["run"]).join(
        M.mark_base_grid(points).select("run", "in_grid"), on="run", how="left")
    return Study(runs=runs, framework=framework, setting=setting, points=points, others=others,
                 probe_steps=probe_steps, per_run=per_run, arms=M.arm_table(points),
                 sensitivity_per_seed=M.lr_sensitivity_per_seed(points),
                 usable_per_seed=M.max_usable_lr_per_seed(points, study), gaps=v.gaps,
                 thresholds=v.thresholds, spikes=M.spike_table(points), verdicts=v.verdicts,
                 best_gaps=v.best, h2_tests=v.h2, h3_tests=v.h3,
                 twins=twin_table(runs, framework), exploratory_gaps=exploratory_gaps,
                 loss_thresholds=loss_thresholds, notes=notes)


def per_run_table(runs: Runs, probe_steps: pl.DataFrame, loss_thresholds: pl.DataFrame,
                  in_study: pl.Series) -> pl.DataFrame:
    t = runs.table
    reached = M.steps_to_threshold(runs.metrics, t, loss_thresholds)
    probes = M.probe_summary(probe_steps)
    first = ["run", "sweep", "run_id", "framework", "depth", "arm", "qk_norm", "lr", "seed",
             "data_seed", "status", "init_loss", "final_val_loss", "final_val_ppl",
             "min_val_loss", "final_train_loss", "diverged_step", "diverged_reason", "steps",
             "tokens_seen", "loss_threshold", "steps_to_threshold", "tokens_to_threshold",
             "peak_max_attention_logit"]
    out = (t.with_columns(final_val_ppl=pl.col("final_val_loss").exp(),
                          in_study=pl.col("run").is_in(in_study.implode()))
           .join(loss_thresholds, on="depth", how="left")
           .join(reached, on="run", how="left")
           .join(probes, on="run", how="left"))
    out = out.with_columns(pl.lit(None, pl.Float64).alias(n) for n in first if n not in out.columns)
    probe_cols = sorted(c for c in out.columns if c.startswith("final_") and c not in first)
    rest = [c for c in out.columns if c not in first and c not in probe_cols]
    return out.select(first + probe_cols + rest).sort("depth", "arm", "lr", "seed", "framework")


def twin_table(runs: Runs, framework: str) -> pl.DataFrame:
    """Other-framework runs beside their primary twin, with their largest val loss gap."""
    t = runs.table.select("run", "framework", "identity", "depth", "arm", "lr", "seed",
                          "status", "final_val_loss")
    base = t.filter(pl.col("framework") == framework).unique(subset="identity", keep="first",
                                                                maintain_order=True)
    other = t.filter(pl.col("framework") != framework)
    pairs = other.join(base.select("identity", twin_run="run", twin_status="status",
                                   twin_final_val_loss="final_val_loss"), on="identity")
    if pairs.is_empty():
        return pairs.drop("identity")
    val = runs.metrics.filter(pl.col("val_loss").is_not_null()).select("run", "step", "val_loss")
    curves = (pairs.lazy().select("run", "twin_run")
              .join(val, on="run")
              .join(val.rename({"run": "twin_run", "val_loss": "twin_val_loss"}),
                    on=["twin_run", "step"])
              .group_by("run").agg(common_eval_steps=pl.len(),
                                   max_abs_val_diff=(pl.col("val_loss")
                                                     - pl.col("twin_val_loss")).abs().max())
              .collect())
    return (pairs.join(curves, on="run", how="left")
            .with_columns(final_loss_diff=pl.col("final_val_loss") - pl.col("twin_final_val_loss"))
            .drop("identity").sort("depth", "arm", "lr", "seed"))


def load_study(path: str | os.PathLike, options: ReportOptions | M.Options | None = None
               ) -> Study:
    """The report's `Study` of every run under `path` (docs/analysis.md)."""
    if options is None:
        options = ReportOptions()
    elif isinstance(options, M.Options):
        options = ReportOptions(study=options)
    elif not isinstance(options, ReportOptions):
        raise UsageError(f"options must be analysis.study.ReportOptions or "
                         f"analysis.metrics.Options, not {type(options).__name__}")
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise UsageError(f"expected a runs folder path, got {path!r}")
    return analyse(load_runs(Path(path)), options)


def _design(study: Study) -> pl.LazyFrame:
    return study.points.select(*DESIGN).lazy()


def training_curves(study: Study) -> pl.DataFrame:
    """Train and val loss against step of the study's runs, with their design."""
    return (study.runs.metrics.select("run", "step", "tokens", "train_loss", "val_loss")
            .join(_design(study), on="run")
            .select(*DESIGN, "step", "tokens", "train_loss", "val_loss")
            .sort("depth", "arm", "lr", "seed", "step")
            .collect())


def probe_curves(study: Study, names: str | list[str] | None = None) -> pl.DataFrame:
    """Probe values (over layers) against step of the study's runs, with their design."""
    steps = study.probe_steps.lazy()
    if names is not None:
        steps = steps.filter(pl.col("name").is_in([names] if isinstance(names, str) else names))
    return (steps.join(_design(study), on="run")
            .select(*DESIGN, "name", "step", "value")
            .sort("name", "depth", "arm", "lr", "seed", "step")
            .collect())
