"""The report's output folder: written in full into a temporary sibling, then swapped in, so a
reader sees the old report or the new one and a failed build leaves the old one as it was."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from qkstudy.errors import UsageError
from qkstudy.files import remove_stale, swap_in


def check_writable(out: Path) -> None:
    """UsageError unless the report folder can be made and written to; leaves nothing behind.
    (A full disk shows when the report is written, as one line too.)"""
    made = [p for p in [out, *out.parents] if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    finally:
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def check_replaceable(out: Path) -> None:
    """Refuse to replace anything but an earlier report (or an empty folder)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / "report.html").exists())):
        raise UsageError(f"{out} exists and is not a report folder; choose another out=DIR")


@contextlib.contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """A fresh temporary sibling of `out` to write into; on success it replaces `out` in one
    rename, on any error (Ctrl-C included) it is removed and `out` is left as it was."""
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)  # what a killed report build left
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        swap_in(tmp, out)  # the earlier report stays if this fails
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
