"""Ctrl-C and SIGTERM stop a run at a safe point (`Deferred`, `check()`, `raising()`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM, raised where stopping is safe."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(error: KeyboardInterrupt) -> int:
    return 128 + getattr(error, "signum", signal.SIGINT)


def caused_by_interrupt(error: BaseException) -> KeyboardInterrupt | None:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


_pending: list[int] = []  # signals raised by `raising` and not yet seen by a Deferred block


def _raise(signum, frame):
    _pending.append(signum)
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def raising() -> Iterator[None]:
    previous = {s: signal.signal(s, _raise) for s in SIGNALS} if _main_thread() else {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending.clear()


class Deferred:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, object] = {}

    def _note(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> Deferred:
        if _main_thread():  # handlers live there only
            for s in SIGNALS:
                self.previous[s] = signal.signal(s, self._note)
        if _pending:  # raised earlier but swallowed before it could stop anything
            self.signum = _pending[0]
            _pending.clear()
        return self

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    def __exit__(self, exc_type, exc, tb) -> bool:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.signum is not None and (exc_type is None or not issubclass(exc_type,
                                                                          KeyboardInterrupt)):
            raise Interrupted(self.signum) from exc
        return False


def main_process(main: Callable[[], int]) -> NoReturn:
    """Run a command as the whole process, ended by os._exit so a late signal gives a code."""
    late: list[int] = []
    for s in SIGNALS:
        signal.signal(s, _raise)
    try:
        code = main()
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        code = exit_code(e)
    for s in SIGNALS:
        signal.signal(s, lambda signum, frame: late.append(signum))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if late and not code:
        with contextlib.suppress(Exception):
            os.write(2, b"interrupted\n")
        code = 128 + late[0]
    os._exit(int(code or 0))
