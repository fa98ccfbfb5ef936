"""One process per run: an advisory lock file in the run folder (released if the process dies)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class RunBusy(RuntimeError):
    """Another process holds this run's lock."""


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[bool]:
    """Yield True with the lock held, or False at once if another process holds it."""
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
