"""Find and validate run folders (qkstudy/run_folder.py) under a runs tree; expose their logs as
Polars frames. A folder that is unfinished, incomplete or in a foreign schema is skipped with a
warning naming it; the good runs are still analysed."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from qkstudy.arms import arm_of
from qkstudy.config import ENGINE_KEYS, FOLDER_KEYS, framework_label
from qkstudy.errors import UsageError
from qkstudy.files import load_object
from qkstudy.run_folder import RunFolder, SweepFolder, find_runs, metrics_gap
from qkstudy.summaries import STATUSES, SUMMARY_FIELDS

# the columns and types the analysis relies on (run_folder.METRICS_SCHEMA and PROBES_SCHEMA)
METRICS_COLUMNS = {"step": pl.Int64, "tokens": pl.Int64, "lr": pl.Float64,
                   "train_loss": pl.Float64, "grad_norm": pl.Float64, "val_loss": pl.Float64,
                   "val_ppl": pl.Float64, "elapsed_s": pl.Float64}
PROBES_COLUMNS = {"step": pl.Int64, "layer": pl.Int64, "name": pl.String, "value": pl.Float64}
# probe columns added after parts were written: null where a part lacks them
PROBES_OPTIONAL = {"head": pl.Int64}
# the summary's keys the analysis needs, each with whether its value is usable (init_loss may
# be missing from a failed run's)
SUMMARY_SCHEMA = {"status": lambda v: v in STATUSES,
                  "lr": lambda v: (_number(v) or 0) > 0,
                  "depth": lambda v: _number(v) is not None,
                  "seed": lambda v: _number(v) is not None,
                  "qk_norm": lambda v: isinstance(v, str), "init_loss": lambda v: True}
# identity fields that place a run in the study design rather than its setting
DESIGN_KEYS = ("lr", "qk_norm", "attn_softcap", "z_loss", "seed", "data_seed", "depth")
# keys in which twins (one run trained by two engines, or copied to two folders) may differ:
# left out of the identity the analysis matches runs by
TWIN_KEYS = (*FOLDER_KEYS, *ENGINE_KEYS)


@dataclass
class Runs:
    """One row per run in `table`, their logs as lazy frames keyed by `run`."""

    root: Path
    table: pl.DataFrame
    metrics: pl.LazyFrame
    probes: pl.LazyFrame
    manifests: dict[str, dict]
    warnings: list[str] = field(default_factory=list)


def lr_key(lr: float) -> float:
    """LRs written by different code paths differ in the last bits: compare at 6 digits."""
    return float(f"{lr:.6g}")


def _read_json(path: Path) -> tuple[dict | None, str | None]:
    obj, why = load_object(path)
    return obj, (f"{path.name} {why}" if why else None)


def _check_parts(folder: Path, columns: dict[str, pl.DataType]) -> tuple[list[Path], str | None]:
    """The folder's Parquet parts, or why they cannot be used: each must hold `columns`, of
    their type or one the scan widens to it (_scan)."""
    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        return [], f"{folder.name}/ has no part-*.parquet files"
    for part in parts:
        try:
            schema = pl.read_parquet_schema(part)
        except (pl.exceptions.PolarsError, OSError) as e:  # truncated or not Parquet at all
            return [], f"{folder.name}/{part.name} is unreadable ({type(e).__name__})"
        wrong = [f"{c}: {schema[c]}" if c in schema else f"no column {c}"
                 for c, t in columns.items() if c not in schema or not (
                     schema[c] == t or (t.is_float() and schema[c].is_numeric())
                     or (t.is_integer() and schema[c].is_signed_integer()))]
        if wrong:
            return [], f"{folder.name}/{part.name} has a foreign schema ({', '.join(wrong)})"
    return parts, None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


@functools.cache
def _sweep_design(sweep_folder: Path) -> tuple[frozenset[float] | None, frozenset[int] | None]:
    """The base LR grid and seeds a sweep folder's sweep.json declares (None: not)."""
    obj = SweepFolder(sweep_folder).read_plan()
    lrs, seeds = obj.get("grid_lrs"), obj.get("seeds")
    grid = (frozenset(lr_key(float(x)) for x in lrs)
            if isinstance(lrs, list) and all(_number(x) for x in lrs) else None)
    base = (frozenset(seeds) if isinstance(seeds, list)
            and all(isinstance(x, int) for x in seeds) else None)
    return grid, base


class _Skipped(Exception):
    """Why a run folder is left out of the analysis (one line)."""


def _load_one(folder: Path, name: str) -> tuple[dict, list, list, dict, list[str]]:
    """(row, metric parts, probe parts, manifest, warnings about it); raises _Skipped."""
    warnings: list[str] = []
    run = RunFolder(folder)
    summary, why = _read_json(run.summary_file)
    if summary is None:
        raise _Skipped(f"{why} (unfinished or still running)" if why.endswith("missing") else why)
    status = summary.get("status")
    wrong = [f"{k}: {summary[k]!r}" if k in summary else f"no {k}"
             for k, ok in SUMMARY_SCHEMA.items()
             if not (ok(summary[k]) if k in summary else k == "init_loss" and status == "failed")]
    if wrong:
        raise _Skipped(f"{run.summary_file.name} has a foreign schema ({', '.join(wrong)})")
    if status == "failed":
        warnings.append(f"failed ({summary.get('error', 'no error recorded')}); listed, left "
                        "out of the study metrics")
    metric_parts, why = _check_parts(run.metrics_dir, METRICS_COLUMNS)
    if why and status != "failed":
        raise _Skipped(why)
    gap = metrics_gap(folder) if status != "failed" else None
    if gap:
        warnings.append(f"{gap}; retrain it (rm -r {folder} and run the same command again)")
    probe_parts, why = _check_parts(run.probes_dir, PROBES_COLUMNS)
    if why and status != "failed":
        warnings.append(f"{why}; its probe columns are empty")
    config, why = _read_json(run.config_file)
    if config is None and status != "failed":
        warnings.append(f"{why}; identity taken from {run.summary_file.name}")
    manifest, why = _read_json(run.manifest_file)
    if manifest is None and status != "failed":
        warnings.append(f"{why}; provenance unknown")
    return _row(name, folder, summary, config), metric_parts, probe_parts, manifest or {}, warnings


def _row(name: str, folder: Path, summary: dict, config: dict | None) -> dict:
    lr, depth, seed = _number(summary["lr"]), int(summary["depth"]), int(summary["seed"])
    framework = framework_label(str(summary.get("framework") or (config or {}).get("framework")
                                    or "mlx"), (config or {}).get("precision"))
    identity = summary.get("config")  # the run's identity, else its config or summary
    if not isinstance(identity, dict):
        identity = config if config is not None else {k: summary.get(k)
                                                      for k in (*DESIGN_KEYS, "d_model")}
    identity = {k: v for k, v in identity.items() if k not in TWIN_KEYS}
    setting = {k: v for k, v in identity.items() if k not in DESIGN_KEYS}
    refine = summary.get("refine", (config or {}).get("refine"))
    grid, base = _sweep_design(folder.parent)
    if not isinstance(refine, bool) and grid is not None:
        refine = lr_key(lr) not in grid
    params = summary.get("params") if isinstance(summary.get("params"), dict) else {}
    return {
        "run": name,
        "sweep": str(summary.get("sweep") or folder.parent.name),
        "run_id": str(summary.get("run_id") or folder.name),
        "framework": str(framework), "depth": depth, "qk_norm": summary["qk_norm"],
        "arm": arm_of({**identity, "qk_norm": summary["qk_norm"]}), "lr": lr_key(lr),
        "seed": seed, "data_seed": int(_number(summary.get("data_seed")) or 0),
        "status": summary["status"],
        **{key: read(summary.get(key)) for key, (read, _) in _COPIED.items()},
        "params_total": _number(params.get("total")),
        "refine": refine if isinstance(refine, bool) else None,
        "added_seed": None if base is None else seed not in base,
        "identity": json.dumps(identity, sort_keys=True, default=str),
        "setting": json.dumps(setting, sort_keys=True, default=str),
        "run_dir": str(folder),
    }


# the summary's fields copied as they are (summaries.SUMMARY_FIELDS), by kind
_INTEGER = (_integer, pl.Int64)
_KINDS = {"number": (_number, pl.Float64), "text": (lambda v: v, pl.String), "step": _INTEGER,
          "count": _INTEGER, "step count": _INTEGER}
_COPIED = {key: _KINDS[f.kind] for key, f in SUMMARY_FIELDS.items() if f.column}
RUN_SCHEMA = {
    "run": pl.String, "sweep": pl.String, "run_id": pl.String, "framework": pl.String,
    "depth": pl.Int64, "qk_norm": pl.String, "arm": pl.String, "lr": pl.Float64,
    "seed": pl.Int64, "data_seed": pl.Int64, "status": pl.String,
    **{key: dtype for key, (_, dtype) in _COPIED.items()},
    "params_total": pl.Float64, "refine": pl.Boolean, "added_seed": pl.Boolean,
    "identity": pl.String, "setting": pl.String, "run_dir": pl.String}


def _scan(parts_by_run: dict[str, list[Path]], columns: dict[str, pl.DataType],
          optional: dict[str, pl.DataType] | None = None) -> pl.LazyFrame:
    """One lazy frame over every run's parts, with `run`: each column read as its type (widened
    where a part stores a narrower one), an optional one null where a part lacks it."""
    columns = {**columns, **(optional or {})}
    paths = [str(p) for parts in parts_by_run.values() for p in parts]
    if not paths:
        return pl.LazyFrame(schema={**columns, "run": pl.String})
    runs = pl.LazyFrame({"_part": paths, "run": [run for run, parts in parts_by_run.items()
                                                 for _ in parts]})
    widen = pl.ScanCastOptions(integer_cast=["upcast", "allow-float"],
                               float_cast=["upcast", "downcast"])
    return (pl.scan_parquet(paths, glob=False, hive_partitioning=False, schema=columns,
                            missing_columns="insert", extra_columns="ignore", cast_options=widen,
                            include_file_paths="_part")
            .join(runs, on="_part").select(*columns, "run"))


def load_runs(root: str | Path) -> Runs:
    """Load every run under `root` (a runs tree, one sweep folder, or one run folder)."""
    root = Path(root)
    if not root.exists():
        raise UsageError(f"runs folder {root} does not exist")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    _sweep_design.cache_clear()  # sweep.json may have changed since an earlier load
    folders = [f.path for f in find_runs(root)]
    if not folders:
        raise UsageError(f"no runs under {root} (expected <sweep>/<run_id>/"
                         f"{RunFolder(root).summary_file.name})")
    rows, warnings, manifests = [], [], {}
    metric_parts: dict[str, list[Path]] = {}
    probe_parts: dict[str, list[Path]] = {}
    for folder in folders:
        name = folder.relative_to(root).as_posix() if folder != root else folder.name
        try:
            row, metrics, probes, manifest, notes = _load_one(folder, name)
        except _Skipped as e:
            warnings.append(f"run {name}: {e}; skipped")
            continue
        warnings += [f"run {name}: {note}" for note in notes]
        rows.append(row)
        metric_parts[row["run"]], probe_parts[row["run"]] = metrics, probes
        manifests[row["run"]] = manifest
    if not rows:
        raise UsageError(f"no usable runs under {root}: "
                         + "; ".join(w.removeprefix("run ") for w in warnings[:3])
                         + (f"; and {len(warnings) - 3} more" if len(warnings) > 3 else ""))
    table = pl.DataFrame(rows, schema=RUN_SCHEMA).sort("depth", "arm", "lr", "seed", "framework")
    return Runs(root=root, table=table, metrics=_scan(metric_parts, METRICS_COLUMNS),
                probes=_scan(probe_parts, PROBES_COLUMNS, PROBES_OPTIONAL), manifests=manifests,
                warnings=warnings)
