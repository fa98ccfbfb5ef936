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
Every file is also read back as untrusted: JSON must be an object of the expected shape,
tensor files carry a sha256 of their bytes (checked on load), and the Parquet parts must cover
their steps without gaps; a file that fails says so in one line with the way to repair it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import faulthandler
import hashlib
import json
import os
import platform
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UsageError

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


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class DamagedRun(UsageError):
    """A run file that fails its checks. The message names the file and how to repair it."""


class DamagedFile(Exception):
    """A tensor file that is truncated, unparsable or fails its checksum."""


def disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and (error.errno == errno.ENOSPC
                                           or "No space left on device" in str(error))


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def _atomic(path: Path, mode: str = "w") -> Iterator[Any]:
    """A file object on a temporary beside `path`; renamed onto it once written and synced,
    removed if writing fails."""
    tmp = _tmp(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    with _atomic(path) as f:
        f.write(text)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def load_object(path: Path) -> tuple[dict | None, str | None]:
    """(the JSON object in `path`, None) or (None, why it is missing or not an object)."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None, "is missing"
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        return None, f"is not valid JSON ({type(e).__name__})"
    if not isinstance(obj, dict):
        return None, f"holds a JSON {type(obj).__name__}, not an object"
    return obj, None


def read_json(path: Path) -> dict | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not an object."""
    return load_object(path)[0]


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


# --- tensor files: safetensors with a sha256 of their bytes -----------------------------------

_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int32": "I32", "int64": "I64",
           "uint32": "U32", "uint64": "U64", "uint8": "U8", "int8": "I8", "bool": "BOOL"}
_NUMPY = {v: k for k, v in _DTYPES.items()}


def _digest(chunks, metadata: dict[str, str]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    h.update(json.dumps(metadata, sort_keys=True).encode())
    return h.hexdigest()


def save_tensors(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """Write a safetensors file atomically with metadata["sha256"] = a hash of its tensor bytes
    and metadata; it is read back and verified before it replaces `path`. Returns the hash.
    (Python writes it, so a full disk raises instead of leaving a short file.)"""
    names = sorted(arrays)
    flat = [np.ascontiguousarray(arrays[n]).reshape(-1).view(np.uint8) for n in names]
    header: dict[str, Any] = {}
    offset = 0
    for name, raw in zip(names, flat):
        header[name] = {"dtype": _DTYPES[arrays[name].dtype.name],
                        "shape": list(np.shape(arrays[name])),
                        "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    meta = {k: v for k, v in metadata.items() if k != "sha256"}
    header["__metadata__"] = {**meta, "sha256": _digest(flat, meta)}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = _tmp(path)
    with _atomic(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in flat:
            f.write(raw)
        f.flush()
        read_tensors(tmp)  # verify before it replaces the previous file
    return header["__metadata__"]["sha256"]


def read_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays, metadata) of a file written by save_tensors; DamagedFile if it is truncated,
    unparsable, has no checksum or fails it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DamagedFile(f"{path.name} is unreadable ({e.strerror or e})") from None
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else -1
    if n < 0 or 8 + n > len(data):
        raise DamagedFile(f"{path.name} is truncated ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
        meta = header.pop("__metadata__")
        body = memoryview(data)[8 + n:]
        specs = [(name, _NUMPY[h["dtype"]], tuple(h["shape"]), *h["data_offsets"])
                 for name, h in header.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DamagedFile(f"{path.name} has an unparsable header") from None
    if not isinstance(meta, dict) or "sha256" not in meta:
        raise DamagedFile(f"{path.name} carries no checksum")
    if max((end for *_, end in specs), default=0) != len(body):
        raise DamagedFile(f"{path.name} is truncated or has trailing bytes")
    expected = meta["sha256"]
    if _digest([body], {k: v for k, v in meta.items() if k != "sha256"}) != expected:
        raise DamagedFile(f"{path.name} fails its sha256 checksum (damaged bytes)")
    try:
        arrays = {name: np.frombuffer(body[b:e], dtype=dtype).reshape(shape)
                  for name, dtype, shape, b, e in specs}
    except ValueError:
        raise DamagedFile(f"{path.name} has tensors that do not match their shapes") from None
    return arrays, meta


def write_part(folder: Path, rows: list[dict], schema: pa.Schema) -> Path | None:
    """Write rows as one immutable part named by its step range; None if there are no rows."""
    if not rows:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in rows]
    path = folder / f"part-{min(steps):08d}-{max(steps):08d}.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    with _atomic(path, "wb") as f:
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


# --- leftovers of a process that died ------------------------------------------------------------

_OWNED = re.compile(r"\..+\.tmp-(\d+)")
FATAL_PREFIX = ".fatal-"


def _alive(pid: int) -> bool:
    """Whether another live process has this id (our own id counts as gone: we hold the lock)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(run_dir: Path) -> list[str]:
    """Remove temporary files whose writer is gone (call with the run's lock held). Returns the
    text of any fatal-signal log such a process left (see `fatal_signal_log`)."""
    fatal = []
    for folder in (run_dir, run_dir / "metrics", run_dir / "probes"):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*"):
            owned = _OWNED.fullmatch(path.name)
            if path.name.startswith(FATAL_PREFIX):
                pid = path.name[len(FATAL_PREFIX):]
                if pid.isdigit() and _alive(int(pid)):
                    continue
                text = path.read_text(errors="replace").strip()
                fatal += [text] if text else []
            elif not ((owned and not _alive(int(owned.group(1))))
                      or path.name == ".checkpoint.tmp.safetensors"):  # written by older versions
                continue
            path.unlink(missing_ok=True)
    return fatal


@contextlib.contextmanager
def fatal_signal_log(run_dir: Path) -> Iterator[None]:
    """While training, a fatal signal (segfault, abort) writes Python's traceback to
    <run_dir>/.fatal-<pid>; the next attempt finds it and records the run as failed."""
    path = run_dir / f"{FATAL_PREFIX}{os.getpid()}"
    was_enabled = faulthandler.is_enabled()
    with open(path, "w") as f:
        faulthandler.enable(file=f, all_threads=True)
        try:
            yield
        finally:
            faulthandler.disable()
            path.unlink(missing_ok=True)  # only a fatal signal leaves it behind
            if was_enabled and sys.__stderr__ is not None:
                with contextlib.suppress(ValueError, OSError, AttributeError):
                    faulthandler.enable(file=sys.__stderr__)


def record_failure(run_dir: Path, summary_base: dict, error: BaseException,
                   text: str | None = None, **extra: Any) -> None:
    """A run that raised: keep its traceback and mark it failed (a sweep retries it)."""
    import traceback

    write_text(run_dir / "traceback.txt", text if text is not None else "".join(
        traceback.format_exception(type(error), error, error.__traceback__)))
    write_json(run_dir / "summary.json", {
        **summary_base, "status": "failed", "error": f"{type(error).__name__}: {error}", **extra})


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


def provenance() -> dict:
    """Where a file came from: the code's git commit and whether it had local changes, and the
    versions of the libraries that compute (both the run manifests and the report use it)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"),
            "git_dirty": bool(status) if status is not None else None,
            "versions": versions("mlx", "numpy", "tiktoken", "pyarrow", "torch")}


def manifest(data_dir: str, framework: str, device: str, extra: dict | None = None) -> dict:
    """manifest.json: provenance, the machine, the data; `extra` holds the backend's own facts
    (BLAS library, threads, precision)."""
    meta = Path(data_dir) / "meta.json"
    return {
        "framework": framework,
        "device": device,
        **provenance(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "chip": chip(),
        "cpu_count": os.cpu_count(),
        "data_dir": str(data_dir),
        "data_meta_sha256": sha256_file(meta) if meta.exists() else None,
        "started": now(),
        **(extra or {}),
    }
