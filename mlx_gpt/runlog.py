"""The run folder: atomic JSON, immutable Parquet parts, provenance, checkpoints.

runs/<sweep>/<run_id>/
  config.json      resolved TrainConfig (+ run_id, framework)
  manifest.json    provenance: git commit/dirty, library versions, platform, chip, BLAS, data sha
  metrics/part-<first>-<last>.parquet   scalar rows (step, tokens, lr, train_loss, grad_norm,
                                        val_loss, val_ppl, elapsed_s)
  probes/part-<first>-<last>.parquet    long rows (step, layer, name, value)
  checkpoint.safetensors               weights, optimizer state, step, RNG (while running)
  final.safetensors                    final weights (once finished)
  summary.json     written last: its presence with status completed|diverged means finished

Every file appears by os.replace of a complete temporary file, so no reader sees half a file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FINISHED = ("completed", "diverged")

METRICS_SCHEMA = pa.schema([
    ("step", pa.int64()), ("tokens", pa.int64()), ("lr", pa.float64()),
    ("train_loss", pa.float64()), ("grad_norm", pa.float64()),
    ("val_loss", pa.float64()), ("val_ppl", pa.float64()), ("elapsed_s", pa.float64()),
])
PROBES_SCHEMA = pa.schema([
    ("step", pa.int64()), ("layer", pa.int64()), ("name", pa.string()), ("value", pa.float64()),
])


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_json(path: Path, obj: Any) -> None:
    tmp = _tmp(path)
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def finished(run_dir: Path) -> dict | None:
    """The summary of a finished run (completed or diverged), else None (failed runs retry)."""
    summary = read_json(run_dir / "summary.json")
    return summary if summary and summary.get("status") in FINISHED else None


def write_part(folder: Path, rows: list[dict], schema: pa.Schema) -> Path | None:
    """Write rows as one immutable part named by its step range; None if there are no rows."""
    if not rows:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in rows]
    path = folder / f"part-{min(steps):08d}-{max(steps):08d}.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    tmp = _tmp(path)
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def drop_parts_from(folder: Path, step: int) -> None:
    """On resume from a checkpoint at `step`, remove parts written after it (they are redone)."""
    if not folder.is_dir():
        return
    for part in folder.glob("part-*.parquet"):
        first = int(part.stem.split("-")[1])
        if first >= step:
            part.unlink()


def read_parts(folder: Path) -> pa.Table | None:
    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        return None
    return pa.concat_tables(pq.read_table(p) for p in parts)


def record_failure(run_dir: Path, summary_base: dict, error: BaseException) -> None:
    """A run that raised: keep its traceback and mark it failed (a sweep retries it)."""
    import traceback

    (run_dir / "traceback.txt").write_text(
        "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    write_json(run_dir / "summary.json", {
        **summary_base, "status": "failed", "error": f"{type(error).__name__}: {error}"})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def chip() -> str:
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                  capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(*modules: str) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in modules:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def manifest(data_dir: str, framework: str, device: str, extra: dict | None = None) -> dict:
    from .blas import loaded as blas

    status = _git("status", "--porcelain", "--untracked-files=no")
    meta = Path(data_dir) / "meta.json"
    return {
        "framework": framework,
        "device": device,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "versions": versions("mlx", "numpy", "tiktoken", "pyarrow", "torch"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "chip": chip(),
        "cpu_count": os.cpu_count(),
        "blas": blas,
        "data_dir": str(data_dir),
        "data_meta_sha256": sha256_file(meta) if meta.exists() else None,
        "started": now(),
        **(extra or {}),
    }
