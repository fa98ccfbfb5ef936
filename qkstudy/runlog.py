"""The run folder's format: what both backends write and the analysis reads, through here.

runs/<sweep>/<run_id>/
  config.json      the run's identity (TrainConfig.identity(), + run_id, framework)
  manifest.json    provenance (provenance.py): git commit/dirty, library versions, platform,
                   chip, the backend's facts (BLAS, threads, precision), data sha
  metrics/part-<first>-<last>.parquet   scalar rows (step, tokens, lr, train_loss, grad_norm,
                                        val_loss, val_ppl, elapsed_s, z_loss)
  probes/part-<first>-<last>.parquet    long rows (step, layer, name, value)
  checkpoint.safetensors               weights and optimizer state (while running)
  final.safetensors                    final weights (once finished)
  summary.json     written last: its presence with status completed|diverged means finished

Files are written atomically and tensors carry a checksum (files.py); what a dead process left
is cleaned up by forensics.py. This module owns the rest: the schemas, the summary's checks,
the Parquet parts and their coverage of the steps, and damaged runs set aside. Every file is
read back as untrusted; a file that fails says so in one line with the way to repair it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UsageError
from .files import (  # noqa: F401  (the run format's file API, used through runlog)
    DamagedFile,
    atomic,
    disk_full,
    load_object,
    now,
    read_json,
    read_tensors,
    save_tensors,
    sha256_file,
    write_json,
    write_text,
)
from .forensics import clean_leftovers, fatal_signal_log, record_failure  # noqa: F401
from .provenance import manifest, provenance, versions  # noqa: F401

FINISHED = ("completed", "diverged")

METRICS_SCHEMA = pa.schema([
    ("step", pa.int64()), ("tokens", pa.int64()), ("lr", pa.float64()),
    ("train_loss", pa.float64()), ("grad_norm", pa.float64()),
    ("val_loss", pa.float64()), ("val_ppl", pa.float64()), ("elapsed_s", pa.float64()),
    ("z_loss", pa.float64()),  # the objective's z-loss term; null when z_loss is off
])
PROBES_SCHEMA = pa.schema([
    ("step", pa.int64()), ("layer", pa.int64()), ("name", pa.string()), ("value", pa.float64()),
])


class DamagedRun(UsageError):
    """A run file that fails its checks. The message names the file and how to repair it."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summary_problem(summary: dict, run_dir: Path) -> str | None:
    """What is wrong with a summary.json object, or None."""
    status = summary.get("status")
    if status not in (*FINISHED, "failed"):
        return f"has status {status!r}, not one of completed, diverged, failed"
    if "run_id" in summary and summary["run_id"] != run_dir.name:
        return f"belongs to run {summary['run_id']!r}, not to this folder"
    if status in FINISHED:
        if not _is_int(summary.get("steps")) or summary["steps"] < 0:
            return f"has steps={summary.get('steps')!r}, not a step count"
        for key in ("init_loss", "final_val_loss", "min_val_loss"):
            if summary.get(key) is not None and not _is_number(summary[key]):
                return f"has {key}={summary[key]!r}, not a number"
        if summary.get("diverged_step") is not None and not _is_int(summary["diverged_step"]):
            return f"has diverged_step={summary['diverged_step']!r}, not a step"
    return None


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary.json (None if there is none yet); DamagedRun if it fails its checks."""
    path = run_dir / "summary.json"
    summary, why = load_object(path)
    if summary is None and why == "is missing":
        return None
    why = why or summary_problem(summary, run_dir)
    if why:
        raise DamagedRun(f"{path} {why}; remove it (rm {path}) and run again to resume or "
                         f"retrain the run")
    return summary


def finished(run_dir: Path) -> dict | None:
    """The summary of a finished run (completed or diverged), else None (failed runs retry)."""
    summary = read_summary(run_dir)
    return summary if summary and summary["status"] in FINISHED else None


DAMAGED = ".damaged"  # <runs_dir>/<sweep>/.damaged/: damaged run folders moved aside, kept whole


def set_aside(run_dir: Path, why: str) -> Path:
    """Move a damaged run folder to <sweep>/.damaged/<run_id>-<UTC time>/ by one rename (no file
    is copied or deleted), and record why in <that folder>.json beside it. Returns where it went;
    DamagedRun if it cannot be moved. The caller holds the run's lock."""
    aside = run_dir.parent / DAMAGED
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    try:
        aside.mkdir(exist_ok=True)
        for n in range(1000):  # two repairs of one run within a second get their own folders
            dest = aside / (f"{run_dir.name}-{stamp}" + (f"-{n}" if n else ""))
            if not dest.exists():
                break
        os.rename(run_dir, dest)
    except OSError as e:
        raise DamagedRun(f"run {run_dir} is damaged ({why}) and cannot be moved aside to "
                         f"{aside}: {e.strerror or e}") from None
    write_json(dest.with_name(dest.name + ".json"), {
        "run_id": run_dir.name, "from": str(run_dir), "moved_to": str(dest), "damage": why,
        "moved": now(), "pid": os.getpid()})
    return dest


def set_aside_records(sweep_dir: Path) -> list[dict]:
    """The records of the damaged runs moved aside in this sweep folder, oldest first."""
    records = [read_json(p) for p in sorted((sweep_dir / DAMAGED).glob("*.json"))]
    return sorted((r for r in records if r and isinstance(r.get("moved"), str)),
                  key=lambda r: r["moved"])


def write_part(folder: Path, rows: list[dict], schema: pa.Schema) -> Path | None:
    """Write rows as one immutable part named by its step range; None if there are no rows."""
    if not rows:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in rows]
    path = folder / f"part-{min(steps):08d}-{max(steps):08d}.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic(path, "wb") as f:
        pq.write_table(table, f)
    return path


_PART = re.compile(r"part-(\d+)-(\d+)\.parquet")


def parts(folder: Path) -> list[tuple[int, Path]]:
    """(first step, path) of each part-<first>-<last>.parquet in `folder`, in step order."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _PART.fullmatch(p.name))]
    return sorted(found)


def drop_parts_from(folder: Path, step: int) -> None:
    """On resume from a checkpoint at `step`, remove parts written after it (they are redone)."""
    for first, part in parts(folder):
        if first >= step:
            part.unlink()


def read_parts(folder: Path) -> pa.Table | None:
    found = parts(folder)
    if not found:
        return None
    # parts written before a column was added lack it: it reads back as null there
    return pa.concat_tables((pq.read_table(p) for _, p in found), promote_options="default")


def part_steps(folder: Path) -> tuple[list[int], str | None]:
    """Every row's step in the folder's parts, or why a part cannot be read."""
    steps: list[int] = []
    for _, part in parts(folder):
        try:
            steps += pq.read_table(part, columns=["step"]).column("step").to_pylist()
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            return [], f"{folder.name}/{part.name} is unreadable ({type(e).__name__})"
    return steps, None


def _coverage(folder: Path, expected: list[int], once: bool = True) -> str | None:
    """None if the folder's rows hold exactly the steps `expected` (once each, or with
    `once=False` any number of rows per step, as probes/ has one row per layer and name), else
    what is off."""
    steps, why = part_steps(folder)
    if why:
        return why
    if not once:
        steps = sorted(set(steps))
    if sorted(steps) == expected:
        return None
    missing = sorted(set(expected) - set(steps))
    extra = sorted(set(steps) - set(expected)) or sorted({s for s in steps if steps.count(s) > 1})
    return (f"{folder.name}/ " + (f"lacks step {missing[0]}" if missing else "")
            + (" and " if missing and extra else "") + (f"has extra rows at step {extra[0]}"
                                                       if extra else "")
            + f" ({len(missing)} missing, {len(extra)} extra)")


def resume_problem(run_dir: Path, step: int, probe_every: int) -> str | None:
    """Why the rows on disk do not match a checkpoint at `step` (metrics rows 0..step-1 once
    each, probe rows at every probe step below it), or None."""
    return (_coverage(run_dir / "metrics", list(range(step)))
            or _coverage(run_dir / "probes", list(range(0, step, probe_every)), once=False))


def finished_problem(run_dir: Path, summary: dict) -> str | None:
    """Why a finished run's files are damaged (a gap or unreadable part, final weights that
    fail their checksum), or None."""
    steps, why = part_steps(run_dir / "metrics")
    if why:
        return why
    last = max(steps, default=-1)
    if summary["status"] == "completed" and last != summary["steps"]:
        return f"metrics/ ends at step {last}, not at the run's last step {summary['steps']}"
    why = _coverage(run_dir / "metrics", list(range(last + 1))) or part_steps(
        run_dir / "probes")[1]
    if why is None and summary.get("final_weights_sha256"):
        try:
            _, meta = read_tensors(run_dir / "final.safetensors")
            if meta["sha256"] != summary["final_weights_sha256"]:
                why = "final.safetensors is not the file its summary.json names"
        except DamagedFile as e:
            why = str(e)
    return why


