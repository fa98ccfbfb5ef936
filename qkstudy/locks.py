"""One process per run: a flock'd lock file holding its pid, removed on release."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError
from .files import alive, cannot_write


class RunBusy(RuntimeError):
    """Another process holds this run's lock."""


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    for _ in range(100):  # its holder may remove the file between our open and our lock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise  # its folder is gone (moved aside by a repair): the caller decides
        except OSError as e:
            raise cannot_write(e, f"the run lock {path}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        if _same_file(fd, path):
            break
        os.close(fd)
    else:
        raise UsageError(f"cannot take the run lock {path}: it keeps being replaced")
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException as e:  # a full disk, or a signal: no lock file left either way
            with contextlib.suppress(OSError):
                os.unlink(path)
            if isinstance(e, OSError):
                raise cannot_write(e, f"the run lock {path}") from None
            raise
        try:
            yield True
        finally:
            # removed while still held: a process waiting on this file finds it gone and retries
            try:
                os.unlink(path)
            except OSError:  # gone already, or left with our pid: the next holder removes it
                pass
            except BaseException:  # a signal as it was removed: remove it all the same
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
    finally:
        os.close(fd)  # releases the lock


def flock_holders() -> dict[tuple[int, int, int], int] | None:
    """{(device major, minor, inode): pid} of every flock in /proc/locks, or None without it."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    held = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" marks a waiter, not a holder
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
        except ValueError:
            continue
    return held


def written_pid(path: Path) -> int | None:
    try:
        words = path.read_text().split()
    except OSError:
        return None
    return int(words[0]) if words and words[0].isdigit() else None


def holder(path: Path, held: dict | None) -> int | None:
    try:
        st = path.stat()
    except OSError:
        return None
    written = written_pid(path)
    if held is not None:
        return held.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    return written if written and alive(written) else None  # (never our own pid)
