"""Files never half-written, tensors that carry their checksum; every read untrusted."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from .errors import UsageError


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class DamagedFile(Exception):
    """A tensor file that is truncated, unparsable or fails its checksum."""


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# what the storage can answer a write with, as opposed to a bug: one line, nothing lost
_IO_ERRNOS = {*_FULL, errno.EIO, errno.EROFS}


def io_failure(error: BaseException) -> bool:
    """Whether `error` is the storage refusing a read or write (full, failing, read-only)."""
    return isinstance(error, OSError) and (error.errno in _IO_ERRNOS
                                           or "No space left on device" in str(error))


def cannot_write(error: OSError, where: Path | str, then: str = "") -> UsageError:
    """'cannot write WHERE: No space left on device; free some space and run the same command
    again' + `then`."""
    return UsageError(f"cannot write {where}: {error.strerror or error}; {io_advice(error)} and "
                      f"run the same command again{then}")


def io_advice(error: OSError) -> str:
    if error.errno in _FULL or "No space left on device" in str(error):
        return "free some space"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "make the folder writable"
    if error.errno == errno.EIO:
        return "check the disk (an I/O error: dmesg names the device)"
    return "check the path"


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic(path: Path, mode: str = "w") -> Iterator[Any]:
    """A file object on a temporary beside `path`, renamed onto it once written and synced."""
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


def make_folder(path: Path, what: str) -> None:
    """mkdir -p, a failure named as `what` at `path` (a UsageError)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cannot_write(e, f"{what} {path}") from None


def swap_in(tmp: Path, out: Path) -> None:
    """Put the folder `tmp` at `out` by renames, the one there before restored on failure."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        if old.exists():
            os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether another process with this pid runs (our own pid counts as gone)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(out: Path) -> None:
    """Remove the siblings .<name>.tmp-<pid> and .<name>.old-<pid> of `out` of dead processes."""
    pattern = re.compile(re.escape(f".{out.name}.") + r"(tmp|old)-(\d+)")
    for path in out.parent.glob(f".{out.name}.*"):
        m = pattern.fullmatch(path.name)
        if m and not alive(int(m.group(2))):  # our own pid counts as gone
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """A new hidden folder beside `path` to fill, renamed onto `path` once the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.mkdir()
    try:
        yield tmp
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: Path, text: str) -> None:
    with atomic(path) as f:
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
    return load_object(path)[0]


def _digest(arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """sha256 of the tensors' bytes in name order, then of the metadata (its sha256 aside) as
    sorted JSON: the file's layout does not enter it."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8))
    h.update(json.dumps({k: v for k, v in metadata.items() if k != "sha256"},
                        sort_keys=True).encode())
    return h.hexdigest()


def save_tensors(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """Write a verified safetensors file whose metadata holds its sha256; returns the hash."""
    arrays = {name: np.asarray(a, order="C") for name, a in arrays.items()}
    digest = _digest(arrays, metadata)
    meta = {**{k: v for k, v in metadata.items() if k != "sha256"}, "sha256": digest}
    with atomic(path, "wb") as f:
        f.write(safetensors.numpy.save(arrays, meta))
        f.flush()
        read_tensors(_tmp(path))  # verify before it replaces the previous file
    return digest


def read_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays, metadata) of a file written by save_tensors, checked; else DamagedFile."""
    try:
        with safetensors.safe_open(path, framework="np") as f:
            meta = f.metadata()
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except OSError as e:
        raise DamagedFile(f"{path.name} is unreadable ({e.strerror or e})") from None
    except safetensors.SafetensorError as e:
        raise DamagedFile(f"{path.name} is not a whole safetensors file ({e})") from None
    if not meta or "sha256" not in meta:
        raise DamagedFile(f"{path.name} carries no checksum")
    if _digest(arrays, meta) != meta["sha256"]:
        raise DamagedFile(f"{path.name} fails its sha256 checksum (damaged bytes)")
    return arrays, meta


def read_tensor_metadata(path: Path) -> dict[str, str] | None:
    """A tensor file's header metadata, unverified (for display), or None."""
    try:
        with safetensors.safe_open(path, framework="np") as f:
            return f.metadata()
    except (OSError, safetensors.SafetensorError):
        return None


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
