"""`load_study(path)`: a runs folder's study tables as Polars frames, for notebooks and scripts.

The numbers are the report's own: `load_study` is `analyse(load_runs(path), options)`, so a
table read here matches the one in reports/<sweep>/tables/. See docs/analysis.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from qkstudy.errors import UsageError

from . import metrics as M
from .load import load_runs
from .report import ReportOptions, Study, analyse

__all__ = ["Study", "load_study", "training_curves", "probe_curves", "DESIGN"]

# The columns that place a run in the study design, joined onto its curves.
DESIGN = ("run", "depth", "arm", "lr", "seed", "status")


def load_study(path: str | os.PathLike, options: ReportOptions | M.Options | None = None
               ) -> Study:
    """Load every run under `path` (a runs tree, a sweep folder or one run) and compute the
    study: the same `Study` the report is built from.

    Its tables are Polars DataFrames: `verdicts`, `gaps` (off minus on per depth and LR, with
    ci_lo/ci_hi and decision), `thresholds`, `arms`, `per_run`, `best_gaps`, `h2_tests`,
    `h3_tests`, `spikes`, `probe_steps`; the raw logs are the LazyFrames `runs.metrics` and
    `runs.probes` (keyed by `run`), and `runs.warnings` / `notes` say what was skipped or how
    runs were chosen. `options` is a `ReportOptions`, or a `metrics.Options` (alpha, min_gap,
    ...) for the study metrics alone; None gives the report's defaults.

    Bad input (no such folder, no runs, no finished run, an options object of another type)
    raises `qkstudy.errors.UsageError` with a one-line message.
    """
    if options is None:
        options = ReportOptions()
    elif isinstance(options, M.Options):
        options = ReportOptions(study=options)
    elif not isinstance(options, ReportOptions):
        raise UsageError(f"options must be analysis.report.ReportOptions or "
                         f"analysis.metrics.Options, not {type(options).__name__}")
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise UsageError(f"expected a runs folder path, got {path!r}")
    return analyse(load_runs(Path(path)), options)


def _design(study: Study) -> pl.LazyFrame:
    return study.points.select(*DESIGN).lazy()


def training_curves(study: Study) -> pl.DataFrame:
    """Train and val loss against step for each run in the study metrics, with its design
    columns (depth, arm, lr, seed, status); val_loss is null between evaluations."""
    # the logs' own `lr` is the scheduled LR at each step, not the run's: leave it out
    return (study.runs.metrics.select("run", "step", "tokens", "train_loss", "val_loss")
            .join(_design(study), on="run")
            .select(*DESIGN, "step", "tokens", "train_loss", "val_loss")
            .sort("depth", "arm", "lr", "seed", "step")
            .collect())


def probe_curves(study: Study, names: str | list[str] | None = None) -> pl.DataFrame:
    """Probe values against step (reduced over layers as in the report's charts) for each run in
    the study metrics, with its design columns; `names` keeps only those probes."""
    steps = study.probe_steps.lazy()
    if names is not None:
        steps = steps.filter(pl.col("name").is_in([names] if isinstance(names, str) else names))
    return (steps.join(_design(study), on="run")
            .select(*DESIGN, "name", "step", "value")
            .sort("name", "depth", "arm", "lr", "seed", "step")
            .collect())
