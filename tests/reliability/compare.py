"""What two runs of the same command must share: run folders compared row by row (the wall
clock aside), the report's tables, and a failed command's one error line. The storm test
(chaos.py) and the I/O-error tests (faults.py) judge by these."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from qkstudy import files, run_folder
from qkstudy.run_folder import RunFolder

from .fault_injection import faulted

WALL_CLOCK = ("wall_seconds", "train_seconds", "measure_seconds", "tokens_per_second")  # summary keys left out
PER_RUN_OTHER = (*WALL_CLOCK, "run_dir")  # per_run columns that differ between two trees
TABLES = ("arms", "sensitivity_per_seed", "usable_per_seed", "gaps", "thresholds", "spikes",
          "verdicts", "best_gaps", "h2_tests", "h3_tests", "loss_thresholds", "per_run")


def comparable(rows: list[dict]) -> list[dict]:
    """Rows with each NaN spelled "nan", so that two NaNs compare equal."""
    return [{k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            for row in rows]


def metric_rows(folder: Path) -> list[dict]:
    """A run's metric rows without the wall clock (elapsed_s)."""
    return comparable(RunFolder(folder).read_metrics().drop(["elapsed_s"]).to_pylist())


def probe_rows(folder: Path) -> list[dict]:
    return comparable(RunFolder(folder).read_probes().to_pylist())


def run_folders(sweep_dir: Path) -> list[str]:
    """The run folders of a sweep folder (dot-folders such as .damaged/ are not runs)."""
    return [f.name for f in run_folder.run_folders(sweep_dir)]


def compare_run(ref: Path, got: Path) -> list[str]:
    """What differs between two folders of one run (empty: identical)."""
    out = []
    ref, got = RunFolder(ref), RunFolder(got)
    try:
        checks = [("metrics rows", lambda f: metric_rows(f.path)),
                  ("probe rows", lambda f: probe_rows(f.path)),
                  ("config", RunFolder.read_config),
                  ("summary", lambda f: {k: v for k, v in f.summary_record().items()
                                         if k not in WALL_CLOCK}),
                  ("files", lambda f: sorted(p.name for p in f.path.iterdir()
                                             if p != f.lock_file))]
        for what, read in checks:
            if read(ref) != read(got):
                out.append(f"{got.name}: {what} differ")
        want, _ = files.read_tensors(ref.final_file)
        have, _ = files.read_tensors(got.final_file)
        if want.keys() != have.keys() or any(
                want[k].dtype != have[k].dtype or not np.array_equal(want[k], have[k])
                for k in want):
            out.append(f"{got.name}: final weights differ")
    except Exception as e:  # noqa: BLE001 - a file that cannot be read is a difference too
        out.append(f"{got.name}: unreadable ({type(e).__name__}: {e})")
    return out


def report_tables(sweep_dir: Path) -> dict:
    """The report's tables (analysis.study.analyse), wall-clock and path columns left out."""
    from analysis.load import load_runs
    from analysis.study import analyse

    study = analyse(load_runs(sweep_dir))
    tables = {name: getattr(study, name) for name in TABLES}
    tables["per_run"] = tables["per_run"].drop(PER_RUN_OTHER, strict=False)
    return {**tables, "notes": study.notes}


def compare_trees(ref: Path, got: Path) -> list[str]:
    """Every difference between two sweep folders: run folders, then the report's tables."""
    want, have = run_folders(ref), run_folders(got)
    out = [f"run folder {r} missing" for r in sorted(set(want) - set(have))]
    out += [f"run folder {r} not in the undisturbed sweep" for r in sorted(set(have) - set(want))]
    for run in sorted(set(want) & set(have)):
        out += compare_run(ref / run, got / run)
    try:
        a, b = report_tables(ref), report_tables(got)
    except Exception as e:  # noqa: BLE001
        return out + [f"report tables: {type(e).__name__}: {e}"]
    for name in a:
        same = a[name] == b[name] if name == "notes" else a[name].equals(b[name])
        if not same:
            out.append(f"report table {name} differs")
    return out


def one_error_line(out: subprocess.CompletedProcess) -> str | None:
    """Why the failed command's output is not one clean error line, or None."""
    if out.returncode != 2:
        return f"exit code {out.returncode}" + (f": {out.stderr.strip()[-300:]}"
                                                if out.stderr.strip() else "")
    if "Traceback" in out.stderr + out.stdout:
        return "a traceback"
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    if len(errors) != 1:
        return f"{len(errors)} error lines"
    if not re.search(r"; .*(again|space|disk|writable)", errors[0]):
        return f"the error line says nothing of what to do: {errors[0]}"
    return None


def full_disk_report(sweep_dir: Path, out: Path) -> list[str]:
    """Build the report of `sweep_dir` into `out`, then again onto a full disk (the first table
    written fails): one error line, exit 2, the first report byte-identical, nothing left."""
    command = [sys.executable, "-m", "analysis", "report", str(sweep_dir), f"out={out}"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if first.returncode:
        return [f"full_disk_report: the report exited {first.returncode}"]
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    again = faulted(command, "open@tables/:ENOSPC", out.parent)
    why = one_error_line(again)
    left = [p.name for p in out.parent.glob(f".{out.name}.*")]
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return ([f"full_disk_report: {why}"] if why else []) + (
        [f"full_disk_report: left {left}"] if left else []) + (
        ["full_disk_report: the earlier report changed"] if after != before else [])
