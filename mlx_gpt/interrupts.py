"""Ctrl-C and SIGTERM stop a run at a safe point, never inside a step and its bookkeeping.

Inside `with Deferred() as guard:` SIGINT and SIGTERM only note that they arrived;
`guard.check()` raises `Interrupted` at the points the caller marks safe (the top of a training
step, where the optimizer's step, the rows written and the probes taken all agree). Leaving the
block raises it too if a signal arrived and was never raised, so a run that finishes while the
user presses Ctrl-C still stops the sweep around it. Outside such a block `terminate_as_interrupt`
makes SIGTERM raise like Ctrl-C (Slurm and other schedulers send SIGTERM before they kill).
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM, raised where stopping is safe. Exit code 128 + the signal number."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(error: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (the shell's 128 + signal number)."""
    return 128 + getattr(error, "signum", signal.SIGINT)


def _raise(signum, frame):
    raise Interrupted(signum)


def terminate_as_interrupt() -> None:
    """SIGTERM raises Interrupted like Ctrl-C raises KeyboardInterrupt (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)


class Deferred:
    """Hold SIGINT and SIGTERM until `check()`; see the module docstring."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, object] = {}

    def _note(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> Deferred:
        if threading.current_thread() is threading.main_thread():  # handlers live there only
            for s in SIGNALS:
                self.previous[s] = signal.signal(s, self._note)
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
