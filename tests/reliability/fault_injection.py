"""Failing the Nth file operation on purpose, as SQLite's I/O-error tests do (faults.py).

A command run with `environment(fault, root)` loads this module at its start (inject/
sitecustomize.py, on its PYTHONPATH), as does every Python process it starts; then every file
operation it makes under QKSTUDY_FAULT_ROOT is numbered from 1 in the order it happens:

  QKSTUDY_FAULT=count:FILE     append "<n> <operation> <path>" to FILE for each operation
  QKSTUDY_FAULT=N:ENOSPC       operation N fails with "No space left on device" (N:EIO: with an
                               I/O error); N:KILL, N:SIGINT, N:SIGTERM: the process gets that
                               signal just before operation N (which then goes ahead)
  QKSTUDY_FAULT=OP@TEXT:KIND   the first operation OP (open, write, ...) on a path holding TEXT
                               (write@.lock:ENOSPC: a full disk as a run's lock is written)

The operations: opening a file for writing, each write to it (a file object's write, os.write),
fsync, rename/replace, mkdir, unlink, rmdir and the removal of a whole tree (one operation). The
Parquet and safetensors writers write through Python file objects, so their writes count too.
Reads are never failed.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import signal
import subprocess
from pathlib import Path

ENV, ROOT_ENV = "QKSTUDY_FAULT", "QKSTUDY_FAULT_ROOT"
# an error the operation fails with, or a signal the process gets just before it
KINDS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "KILL": signal.SIGKILL,
         "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
SIGNALS = ("KILL", "SIGINT", "SIGTERM")

INJECT = Path(__file__).resolve().parent / "inject"  # holds the sitecustomize.py that installs it
_real = {"open": builtins.open, "os.open": os.open, "os.write": os.write, "os.fsync": os.fsync,
         "os.replace": os.replace, "os.rename": os.rename, "os.mkdir": os.mkdir,
         "os.unlink": os.unlink, "os.remove": os.remove, "os.rmdir": os.rmdir,
         "shutil.rmtree": shutil.rmtree}


class _Injector:
    def __init__(self, root: Path, target: int | tuple[str, str] | None, kind: str | None,
                 log: str | None):
        self.root, self.target, self.kind = str(root), target, kind
        self.count = 0
        self.depth = 0  # inside a composite operation (a tree removal): its parts do not count
        self.fds: dict[int, str] = {}  # descriptors of files under root opened for writing
        self.log = _real["os.open"](log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
            if log else None

    def mine(self, path) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(self.root)
        except TypeError:  # a descriptor, not a path
            return False

    def op(self, name: str, path) -> None:
        """Count one operation; fail it if it is the one asked for."""
        if self.depth:
            return
        self.count += 1
        if self.log is not None:
            _real["os.write"](self.log, f"{self.count} {name} {path}\n".encode())
        if isinstance(self.target, tuple):  # (operation, text in its path): the first such
            if (name, True) != (self.target[0], self.target[1] in str(path)):
                return
            self.target = self.count
        if self.count != self.target:
            return
        if self.kind in SIGNALS:  # the operation itself goes ahead
            os.kill(os.getpid(), KINDS[self.kind])
            return
        code = KINDS[self.kind]
        raise OSError(code, os.strerror(code), os.fspath(path) if not isinstance(path, int)
                      else None)


_injector: _Injector | None = None


class _File:
    """A file object whose writes count as operations (the rest is the real file's)."""

    def __init__(self, f, path):
        self._f, self._path = f, path

    def write(self, data):
        _injector.op("write", self._path)
        return self._f.write(data)

    def writelines(self, lines):
        _injector.op("write", self._path)
        return self._f.writelines(lines)

    def close(self):
        if not self._f.closed:
            _injector.fds.pop(self._f.fileno(), None)
        return self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _writing(mode: str) -> bool:
    return any(c in mode for c in "wax+")


def _open(file, mode="r", *args, **kwargs):
    if not isinstance(file, int) and _writing(mode) and _injector.mine(file):
        _injector.op("open", file)
        f = _real["open"](file, mode, *args, **kwargs)
        _injector.fds[f.fileno()] = os.fspath(file)  # its fsync counts
        return _File(f, file)
    return _real["open"](file, mode, *args, **kwargs)


def _os_open(path, flags, *args, **kwargs):
    writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
    if writing and kwargs.get("dir_fd") is None and _injector.mine(path):
        _injector.op("open", path)
        fd = _real["os.open"](path, flags, *args, **kwargs)
        _injector.fds[fd] = os.fspath(path)
        return fd
    return _real["os.open"](path, flags, *args, **kwargs)


def _fd_op(name: str):
    real = _real[f"os.{name}"]

    def wrapped(fd, *args):
        if fd in _injector.fds:
            _injector.op(name, _injector.fds[fd])
        return real(fd, *args)
    return wrapped


def _path_op(name: str, real):
    def wrapped(path, *args, **kwargs):
        if kwargs.get("dir_fd") is None and _injector.mine(path):
            _injector.op(name, path)
        return real(path, *args, **kwargs)
    return wrapped


def _rmtree(path, ignore_errors=False, *args, **kwargs):
    if _injector.mine(path):
        try:
            _injector.op("rmtree", path)
        except OSError:
            if ignore_errors:  # the caller ignores a failed removal: the tree stays
                return None
            raise
    _injector.depth += 1
    try:
        return _real["shutil.rmtree"](path, ignore_errors, *args, **kwargs)
    finally:
        _injector.depth -= 1


def environment(fault: str | None, root: Path) -> dict[str, str]:
    """os.environ for a command run in `root` with `fault` (QKSTUDY_FAULT's value; None: none)."""
    env = {**os.environ, ROOT_ENV: str(root)}
    env.pop(ENV, None)
    if fault:
        env[ENV] = fault
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INJECT), env.get("PYTHONPATH")]))
    return env


def faulted(command: list[str], fault: str, root: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run `command` with one injected fault under `root`."""
    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=environment(fault, root), **kwargs)


def install_from_env() -> None:
    """Install the injector if QKSTUDY_FAULT asks for it (see the module docstring)."""
    global _injector
    spec = os.environ.get(ENV)
    if not spec or _injector is not None:
        return
    root = Path(os.environ.get(ROOT_ENV) or os.getcwd()).resolve()
    first, _, rest = spec.partition(":")
    if first == "count":
        _injector = _Injector(root, None, None, rest)
    else:
        first, _, rest = spec.rpartition(":")
        op, at, text = first.partition("@")
        if rest not in KINDS or not (first.isdigit() or (at and op and text)):
            raise SystemExit(f"{ENV}={spec}: expected count:FILE, N:KIND or OP@TEXT:KIND "
                             f"(KIND: {'|'.join(KINDS)})")
        _injector = _Injector(root, int(first) if first.isdigit() else (op, text), rest, None)
    builtins.open = io.open = _open
    os.open = _os_open
    os.write, os.fsync = _fd_op("write"), _fd_op("fsync")
    for name in ("replace", "rename", "mkdir", "unlink", "remove", "rmdir"):
        setattr(os, name, _path_op(name, _real[f"os.{name}"]))
    shutil.rmtree = _rmtree
    _close = os.close

    def close(fd):
        _injector.fds.pop(fd, None)
        return _close(fd)
    os.close = close
