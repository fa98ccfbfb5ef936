"""What the report's drill-down shows for a clicked point: each run's loss and max-logit curves
(binned to a few dozen points) and its config, embedded in the page as JSON (the page's
script draws them; analysis/templates/report.html.j2)."""

from __future__ import annotations

from pathlib import Path
import polars as pl

from qkstudy.run_folder import RunFolder

from . import charts as C
from . import metrics as M
from .study import Study


MAX_POINTS = 40  # per run and curve: enough for a curve's shape, small for a 300-run page
SHOWN = ("run", "depth", "lr", "seed", "status", "final_val_loss", "diverged_step", "framework")


def _binned(frame: pl.DataFrame, value: str) -> dict[str, list[list[float]]]:
    """{run: [[step, value], ...]}: at most MAX_POINTS per run (bin means; the last step kept)."""
    if frame.is_empty():
        return {}
    last = frame.group_by("run").agg(last=pl.col("step").max())
    binned = (frame.join(last, on="run")
              .with_columns(bin=pl.col("step") // (pl.col("last") // MAX_POINTS + 1))
              .group_by("run", "bin").agg(step=pl.col("step").max(), v=pl.col(value).mean())
              .filter(pl.col("v").is_finite()).sort("run", "step"))
    out: dict[str, list[list[float]]] = {}
    for run, step, v in binned.select("run", "step", "v").iter_rows():
        out.setdefault(run, []).append([step, round(v, 5)])
    return out


def run_details(study: Study) -> dict:
    """{"runs": {run: its row, curves and the config keys that vary}, "common": the config keys
    every run shares}, for the runs in the study and their other-framework twins."""
    shown = pl.concat([study.points, study.others], how="diagonal_relaxed")
    table = M.with_arm(study.runs.table.join(shown.select("run"), on="run"))
    names = table["run"].to_list()
    metrics = study.runs.metrics.filter(pl.col("run").is_in(names))
    train = _binned(metrics.filter(pl.col("train_loss").is_not_null())
                    .select("run", "step", "train_loss").collect(), "train_loss")
    val = _binned(metrics.filter(pl.col("val_loss").is_not_null())
                  .select("run", "step", "val_loss").collect(), "val_loss")
    logit = _binned(study.probe_steps.filter((pl.col("name") == "max_attention_logit")
                                             & pl.col("run").is_in(names))
                    .select("run", "step", "value"), "value")
    configs = {}
    for row in table.iter_rows(named=True):
        run_dir = row.get("run_dir")
        config = RunFolder(Path(run_dir)).read_config() if run_dir else None
        configs[row["run"]] = config if isinstance(config, dict) else {}
    keys = sorted({k for c in configs.values() for k in c})
    common = {k: configs[names[0]].get(k) for k in keys
              if names and len({repr(c.get(k)) for c in configs.values()}) == 1}
    runs = {}
    for row in table.iter_rows(named=True):
        run = row["run"]
        runs[run] = {**{k: row.get(k) for k in SHOWN}, "arm": C.arm_label(row[M.ARM]),
                     "config": {k: v for k, v in configs[run].items() if k not in common},
                     "train": train.get(run, []), "val": val.get(run, []),
                     "logit": logit.get(run, [])}
    return {"runs": runs, "common": common}
