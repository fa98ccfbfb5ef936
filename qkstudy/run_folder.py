"""Every file the tool writes and reads back: the run folder, <runs_dir>/<sweep>/<run_id>/ (its
file names, lock, states, checkpoint, rows and checks) and the sweep folder around it."""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import os
import re
import traceback
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import forensics, locks, provenance
from .config import TrainConfig
from .data.load import data_change
from .errors import UsageError
from .files import (DamagedFile, atomic, load_object, now, read_json, read_tensor_metadata,
                    read_tensors, save_tensors, write_json, write_text)
from .summaries import FINISHED, is_whole, summary_problem


CONFIG, MANIFEST, SUMMARY, ARCHIVED = "config.json", "manifest.json", "summary.json", \
    "archived.json"
METRICS, PROBES, TRACEBACK, LOCK = "metrics", "probes", "traceback.txt", ".lock"
CHECKPOINT, FINAL = "checkpoint.safetensors", "final.safetensors"
COMPARISON = "comparison.json"  # a spot check's twin against the run it was made from
# the sweep folder <runs_dir>/<sweep>/: its plan (grid and axes), damaged run folders moved
# aside whole, slurm/<NNN>/: one submission each (its record, task list, array script and one
# log a task), and each machine's own records, named by its host so that sweep folders copied
# from several machines merge without replacing one another's: its log, its workers' logs, the
# pids of a jobs=K sweep's processes, the tokens/s calibrated at the sweep's start
PLAN, DAMAGED = "sweep.json", ".damaged"
SWEEP_LOG, WORKER_LOG = "sweep-{host}.log", "sweep-{host}-worker-{i}.log"
PROCESSES, SPEEDS = "sweep-{host}-processes.json", "sweep-{host}-speeds.json"
SLURM, SUBMISSION, TASKS, ARRAY, TASK_LOG = ("slurm", "submission.json", "tasks.txt",
                                             "array.sbatch", "task-{}.log")

METRICS_SCHEMA = pa.schema([
    ("step", pa.int64()), ("tokens", pa.int64()), ("lr", pa.float64()),
    ("train_loss", pa.float64()), ("grad_norm", pa.float64()),
    ("val_loss", pa.float64()), ("val_ppl", pa.float64()), ("elapsed_s", pa.float64()),
    ("z_loss", pa.float64()),  # the objective's z-loss term; null when z_loss is off
])
PROBES_SCHEMA = pa.schema([
    ("step", pa.int64()), ("layer", pa.int64()), ("name", pa.string()), ("value", pa.float64()),
    ("head", pa.int64()),  # a per-head probe's head; null for every other probe
])


class DamagedRun(UsageError):
    """A run file that fails its checks. The message names the file and how to repair it."""


# the rows: immutable Parquet parts, part-<first step>-<last step>.parquet
def write_part(folder: Path, rows: list[dict], schema: pa.Schema) -> Path | None:
    if not rows:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in rows]
    path = folder / f"part-{min(steps):08d}-{max(steps):08d}.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic(path, "wb") as f:
        pq.write_table(table, f)
    return path


PART = re.compile(r"part-(\d+)-(\d+)\.parquet")


def parts(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := PART.fullmatch(p.name))]
    return sorted(found)


def read_parts(folder: Path) -> pa.Table | None:
    found = parts(folder)
    if not found:
        return None
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


def coverage(folder: Path, expected: list[int], once: bool = True) -> str | None:
    """What is off unless the folder's rows hold exactly the steps `expected`, else None."""
    steps, why = part_steps(folder)
    return why or steps_cover(folder.name, steps, expected, once)


def steps_cover(name: str, steps: list[int], expected: list[int], once: bool = True):
    if not once:
        steps = sorted(set(steps))
    if sorted(steps) == expected:
        return None
    missing = sorted(set(expected) - set(steps))
    extra = sorted(set(steps) - set(expected)) or sorted({s for s in steps if steps.count(s) > 1})
    said = ([f"lacks step {missing[0]}"] if missing else []) + (
        [f"has extra rows at step {extra[0]}"] if extra else [])
    return f"{name}/ {' and '.join(said)} ({len(missing)} missing, {len(extra)} extra)"


def metrics_gap(run_dir: Path, steps: list[int] | None = None) -> str | None:
    """How the metric rows fail to cover steps 0..last (archived: every k-th), or None."""
    why = None
    if steps is None:
        steps, why = part_steps(run_dir / METRICS)
    every = 1
    if not why and (run_dir / ARCHIVED).exists():
        obj, why = load_object(run_dir / ARCHIVED)
        every = (obj or {}).get("metrics_every", 1)
        if why or not is_whole(every) or every < 1:
            why = (f"{ARCHIVED} {why or f'has metrics_every {every!r}, not a whole number >= 1'}"
                   "; restore the run from its archive again")
    if why or not steps:
        return why
    last = max(steps)
    required = set(range(0, last + 1, every)) | {last}
    return steps_cover(METRICS, steps, sorted(required | set(steps)))


def finished_problem(run_dir: Path, summary: dict) -> str | None:
    """Why a finished run's files are damaged, or None."""
    steps, why = part_steps(run_dir / METRICS)
    if why:
        return why
    last = max(steps, default=-1)
    if summary["status"] == "completed" and last != summary["steps"]:
        return f"metrics/ ends at step {last}, not at the run's last step {summary['steps']}"
    why = metrics_gap(run_dir, steps) or part_steps(run_dir / PROBES)[1]
    # an archived run keeps its logs, not its weights
    if why is None and summary.get("final_weights_sha256") and not (
            run_dir / ARCHIVED).exists():
        try:
            _, meta = read_tensors(run_dir / FINAL)
            if meta["sha256"] != summary["final_weights_sha256"]:
                why = f"{FINAL} is not the file its summary.json names"
        except DamagedFile as e:
            why = str(e)
    return why


def checkpoint_step(arrays: dict[str, np.ndarray]) -> int | None:
    """The updates applied; None unless every "opt.<...>.step" entry holds the same count."""
    steps = [v for k, v in arrays.items() if k.startswith("opt.") and k.endswith(".step")]
    if not steps or any(s.shape != () for s in steps) or len({int(s) for s in steps}) != 1:
        return None
    return int(steps[0])


class Outcome(Enum):
    """What a run's summary.json records: its status, or PENDING (no readable one yet)."""

    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"  # trained and raised: no outcome on stability; the next sweep retries it
    PENDING = "pending"

    stable = property(lambda self: {Outcome.COMPLETED: True, Outcome.DIVERGED: False}.get(self))
    finished = property(lambda self: self.value in FINISHED)


@dataclass(frozen=True)
class RunFolder:
    """One run's folder: its paths, lock, state and files. Whether it is finished is read at
    three depths, each on FINISHED: outcome() (the status recorded, unchecked: what a sweep plans
    by), finished() (the summary checked) and intact_summary() (its files checked too)."""

    path: Path

    @classmethod
    def of(cls, cfg: TrainConfig) -> RunFolder:
        return cls(Path(cfg.runs_dir) / cfg.sweep / cfg.run_id)

    def __str__(self) -> str:
        return str(self.path)

    name = property(lambda self: self.path.name)
    config_file = property(lambda self: self.path / CONFIG)
    manifest_file = property(lambda self: self.path / MANIFEST)
    summary_file = property(lambda self: self.path / SUMMARY)
    traceback_file = property(lambda self: self.path / TRACEBACK)
    metrics_dir = property(lambda self: self.path / METRICS)
    probes_dir = property(lambda self: self.path / PROBES)
    checkpoint_file = property(lambda self: self.path / CHECKPOINT)
    final_file = property(lambda self: self.path / FINAL)
    lock_file = property(lambda self: self.path / LOCK)
    comparison_file = property(lambda self: self.path / COMPARISON)

    def is_run(self) -> bool:
        return self.config_file.exists() or self.summary_file.exists()

    def read_config(self) -> dict | None:
        return read_json(self.config_file)

    def write_config(self, config: dict) -> None:
        write_json(self.config_file, config)

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.manifest_file, manifest)

    def write_summary(self, summary: dict) -> None:
        write_json(self.summary_file, summary)

    def read_manifest(self) -> dict | None:
        return read_json(self.manifest_file)

    def summary_record(self) -> dict:
        """summary.json's object unchecked ({} when missing or unreadable), for display."""
        return read_json(self.summary_file) or {}

    def outcome(self) -> Outcome:
        try:
            return Outcome(self.summary_record().get("status"))
        except ValueError:
            return Outcome.PENDING

    def finished(self) -> dict | None:
        """The checked summary if it says completed or diverged (files unchecked), else None."""
        summary, why = load_object(self.summary_file)
        if summary is None and why == "is missing":
            return None
        why = why or summary_problem(summary, self.path)
        if why:
            raise DamagedRun(f"{self.summary_file} {why}; remove it (rm {self.summary_file}) and "
                             "run again to resume or retrain the run")
        return summary if Outcome(summary["status"]).finished else None

    def intact_summary(self) -> dict | None:
        """The summary of a finished run with intact files, None if unfinished; DamagedRun."""
        done = self.finished()
        why = done and finished_problem(self.path, done)
        if why:
            raise DamagedRun(f"run {self.path} is {done['status']} but damaged: {why}; to "
                             "retrain it, keeping the damaged files aside: the same command "
                             "with repair=true (a sweep repairs it by itself)")
        return done

    def data_problem(self, identity: dict, data_dir: str) -> str | None:
        """Why the run was trained on other data than `identity` (data.load), or None."""
        recorded = (self.read_manifest() or {}).get("data")
        if not isinstance(recorded, dict):
            return None  # nothing trained yet (the manifest is written before the first step)
        change = data_change(recorded, identity)
        return change and (f"run {self.path} was trained on other data than {data_dir} "
                           f"holds now ({change}); prepare the data it was trained on again "
                           "at that path, or train on the new data under another sweep name "
                           "(name=...) or runs_dir=")

    def set_aside(self, why: str) -> Path:
        """Move a damaged run to <sweep>/.damaged/<run_id>-<UTC time>/ (the lock held)."""
        aside = self.path.parent / DAMAGED
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        try:
            aside.mkdir(exist_ok=True)
            for n in range(1000):  # two repairs of one run within a second get their own folders
                dest = aside / (f"{self.name}-{stamp}" + (f"-{n}" if n else ""))
                if not dest.exists():
                    break
            os.rename(self.path, dest)
        except OSError as e:
            raise DamagedRun(f"run {self.path} is damaged ({why}) and cannot be moved aside to "
                             f"{aside}: {e.strerror or e}") from None
        write_json(dest.with_name(dest.name + ".json"), {
            "run_id": self.name, "from": str(self.path), "moved_to": str(dest), "damage": why,
            "moved": now(), "pid": os.getpid()})
        return dest

    # the checkpoint: weights ("model.<name>") and optimizer state ("opt.<key>"); the update
    # count in "opt.<...>.step" is the whole data cursor (batches.py); its header holds that
    # count as "step" and the recorder's state, each value a Python literal
    def save_checkpoint(self, arrays: dict[str, np.ndarray], state: dict) -> int:
        step = checkpoint_step(arrays)
        save_tensors(self.checkpoint_file, arrays,
                     {"step": str(step), **{k: repr(v) for k, v in state.items()}})
        return step

    def read_checkpoint(self, spec: dict[str, tuple]) -> tuple[int, dict[str, np.ndarray], dict]:
        """(step, arrays, state), checked against its checksum and the engine's state spec."""
        path = self.checkpoint_file
        arrays, metadata = read_tensors(path)
        want = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in spec.items()}
        step = checkpoint_step(arrays)
        if {k: (v.shape, v.dtype) for k, v in arrays.items()} != want or step is None \
                or metadata.get("step") != str(step):
            raise DamagedFile(f"{path.name} does not match this run's model and step")
        try:
            state = {k: ast.literal_eval(v) for k, v in metadata.items()
                     if k not in ("step", "sha256")}
        except (ValueError, SyntaxError):
            raise DamagedFile(f"{path.name} has unreadable metadata") from None
        return step, arrays, state

    def checkpoint_progress(self) -> tuple[int, float] | None:
        """(step, seconds of training with evaluation and probes) from the checkpoint's header,
        unverified (for display), or None."""
        meta = read_tensor_metadata(self.checkpoint_file)
        try:
            return int(meta["step"]), sum(float(ast.literal_eval(meta.get(k, "0")))
                                          for k in ("train_seconds", "measure_seconds"))
        except (TypeError, KeyError, ValueError, SyntaxError):
            return None

    def lock(self) -> contextlib.AbstractContextManager[bool]:
        return locks.exclusive(self.lock_file)

    def trained_by(self) -> int | None:
        """The pid of the process that trained the run last (its manifest's), or None."""
        pid = (self.read_manifest() or {}).get("pid")
        return pid if is_whole(pid) else None

    def write_rows(self, metric_rows: list[dict], probe_rows: list[dict]) -> None:
        write_part(self.metrics_dir, metric_rows, METRICS_SCHEMA)
        write_part(self.probes_dir, probe_rows, PROBES_SCHEMA)

    def read_metrics(self) -> pa.Table | None:
        return read_parts(self.metrics_dir)

    def read_probes(self) -> pa.Table | None:
        return read_parts(self.probes_dir)

    def latest_row(self) -> tuple[int | None, float | None]:
        """(the last metric row's step, the latest train loss) of the last part, or None for
        what cannot be read (a part being replaced or damaged): for display."""
        found = parts(self.metrics_dir)
        try:
            rows = pq.read_table(found[-1][1], columns=["step", "train_loss"]).to_pydict()
        except Exception:  # noqa: BLE001 - no number, no crash
            return None, None
        losses = [x for x in rows["train_loss"] if x is not None]
        return (rows["step"][-1] if rows["step"] else None), (losses[-1] if losses else None)

    def drop_rows_from(self, step: int) -> None:
        """Remove the parts written after a checkpoint at `step` (they are redone)."""
        for first, part in parts(self.metrics_dir) + parts(self.probes_dir):
            if first >= step:
                part.unlink()

    def resume_problem(self, step: int, probe_every: int) -> str | None:
        return (coverage(self.metrics_dir, list(range(step)))
                or coverage(self.probes_dir, list(range(0, step, probe_every)), once=False))

    def tidy(self) -> None:
        folders = [self.path, self.metrics_dir, self.probes_dir]
        if not (self.lock_file.exists() or self.checkpoint_file.exists()
                or self.traceback_file.exists() or forensics.leftovers(folders)):
            return
        with self.lock() as acquired:
            if acquired and self.finished():
                forensics.clean_leftovers(folders)
                self.drop_finished_leftovers()

    def record_failure(self, summary_base: dict, error: BaseException, text: str | None = None,
                       **extra: Any) -> None:
        """A run that raised: keep its traceback and mark it failed (a sweep retries it)."""
        write_text(self.traceback_file, text if text is not None else "".join(
            traceback.format_exception(type(error), error, error.__traceback__)))
        self.write_summary({**summary_base, "status": "failed",
                            "error": f"{type(error).__name__}: {error}", **extra})

    def drop_finished_leftovers(self) -> None:
        for path in (self.checkpoint_file, self.traceback_file):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def find_runs(root: Path, nested: bool = True) -> list[RunFolder]:
    """The run folders (RunFolder.is_run) under `root`, hidden folders skipped, in path order:
    at any depth, `root` itself included, or with nested=False its children only."""
    root = Path(root)
    found = ({p.parent for name in (SUMMARY, CONFIG) for p in root.rglob(name)} if nested
             else {c for c in root.iterdir() if c.is_dir() and RunFolder(c).is_run()})
    return [RunFolder(f) for f in sorted(found)
            if not any(part.startswith(".") for part in f.relative_to(root).parts)]


def run_folders(sweep_dir: Path) -> list[RunFolder]:
    """A sweep folder's runs: its children that are run folders (find_runs)."""
    return find_runs(sweep_dir, nested=False)


@dataclass(frozen=True)
class SweepFolder:
    """A sweep's folder: its plan, Slurm submissions and damaged runs, and the records of the
    machine `host` (this one unless named): processes, logs, calibrated speeds."""

    path: Path
    host: str = ""

    machine = property(lambda self: self.host or provenance.host())
    plan_file = property(lambda self: self.path / PLAN)
    processes_file = property(lambda self: self.path / PROCESSES.format(host=self.machine))
    log_file = property(lambda self: self.path / SWEEP_LOG.format(host=self.machine))
    speeds_file = property(lambda self: self.path / SPEEDS.format(host=self.machine))

    def worker_log(self, i: int | str) -> Path:
        return self.path / WORKER_LOG.format(host=self.machine, i=i)

    def read_plan(self) -> dict:
        """sweep.json's object ({} when missing or unreadable)."""
        return load_object(self.plan_file)[0] or {}

    def write_speeds(self, speeds: dict[int, float]) -> None:
        write_json(self.speeds_file, {"host": self.machine, "measured": now(),
                                      "tokens_per_s": {str(d): v for d, v in speeds.items()}})

    def read_speeds(self) -> dict[int, float]:
        """{depth: tokens/s} this machine calibrated at the sweep's start ({} when none)."""
        stored = (load_object(self.speeds_file)[0] or {}).get("tokens_per_s")
        return {int(d): float(v) for d, v in (stored or {}).items() if str(d).isdigit()
                and type(v) in (int, float) and v > 0} if isinstance(stored, dict) else {}

    def is_sweep(self) -> bool:
        return self.plan_file.exists() or (self.path / SLURM).is_dir() or bool(
            run_folders(self.path))

    def submissions(self) -> list[tuple[Path, dict]]:
        """(folder, record) of each Slurm submission, oldest first."""
        found = sorted(p for p in (self.path / SLURM).glob("[0-9][0-9][0-9]*") if p.is_dir())
        return [(p, read_json(p / SUBMISSION) or {}) for p in found]

    def next_submission(self) -> Path:
        number = max((int(p.name) for p, _ in self.submissions()), default=0) + 1
        return self.path / SLURM / f"{number:03d}"

    def set_aside_records(self) -> list[dict]:
        """The records of the damaged runs moved aside, oldest first."""
        records = [read_json(p) for p in sorted((self.path / DAMAGED).glob("*.json"))]
        return sorted((r for r in records if r and isinstance(r.get("moved"), str)),
                      key=lambda r: r["moved"])

