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
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

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
    """Write a verified safetensors file whose metadata holds its sha256; returns the hash."""
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
    with atomic(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in flat:
            f.write(raw)
        f.flush()
        read_tensors(tmp)  # verify before it replaces the previous file
    return header["__metadata__"]["sha256"]


def read_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays, metadata) of a file written by save_tensors, checked; else DamagedFile."""
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


def read_tensor_metadata(path: Path) -> dict[str, str] | None:
    """A tensor file's header metadata, unverified (for display), or None."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            meta = json.loads(f.read(n))["__metadata__"] if n < 1 << 24 else None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return meta if isinstance(meta, dict) else None


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
