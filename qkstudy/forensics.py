"""What a dead process leaves in a run folder."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from .files import alive

_OWNED = re.compile(r"\..+\.tmp-(\d+)")
FATAL_PREFIX = ".fatal-"


def leftovers(folders: list[Path]) -> bool:
    return any(_OWNED.fullmatch(p.name) or p.name.startswith(FATAL_PREFIX)
               for folder in folders for p in folder.glob(".*"))


def clean_leftovers(folders: list[Path]) -> list[str]:
    """Remove dead writers' temporaries (lock held); the text of their fatal-signal logs."""
    fatal = []
    for path in [p for folder in folders for p in folder.glob(".*")]:
        owned = _OWNED.fullmatch(path.name)
        if path.name.startswith(FATAL_PREFIX):
            pid = path.name[len(FATAL_PREFIX):]
            if pid.isdigit() and alive(int(pid)):
                continue
            text = path.read_text(errors="replace").strip()
            fatal += [text] if text else []
        elif not ((owned and not alive(int(owned.group(1))))
                  or path.name == ".checkpoint.tmp.safetensors"):  # written by older versions
            continue
        path.unlink(missing_ok=True)
    return fatal


@contextlib.contextmanager
def fatal_signal_log(run_dir: Path) -> Iterator[None]:
    """A fatal signal here writes the traceback to <run_dir>/.fatal-<pid> for the next attempt."""
    path = run_dir / f"{FATAL_PREFIX}{os.getpid()}"
    was_enabled = faulthandler.is_enabled()
    with open(path, "w") as f:
        faulthandler.enable(file=f, all_threads=True)
        try:
            yield
        finally:
            faulthandler.disable()
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            if was_enabled and sys.__stderr__ is not None:
                with contextlib.suppress(ValueError, OSError, AttributeError):
                    faulthandler.enable(file=sys.__stderr__)
