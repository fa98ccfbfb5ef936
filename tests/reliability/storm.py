"""One storm's processes and the faults it injects into them (chaos.py drives it): each fault
kind is a method of Storm that returns whether it found something to hit."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from qkstudy import files, locks, run_folder

from .compare import one_error_line
from .fault_injection import faulted


def processes() -> list[tuple[int, int, str]]:
    """(pid, process group, command line) of every live process (ps; zombies left out)."""
    text = subprocess.run(["ps", "-A", "-o", "pid=,pgid=,stat=,args="], capture_output=True,
                          text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        pid, pgid, stat, *args = line.split(None, 3)
        if not stat.startswith("Z"):
            out.append((int(pid), int(pgid), args[0] if args else ""))
    return out


@dataclass
class Storm:
    """One storm's settings, state and counts."""

    command: list[str]
    sweep_dir: Path
    rng: random.Random
    spread: float  # seconds: a fault "anywhere" lands up to this long after the one before
    run_seconds: float  # the undisturbed sweep's mean wall time a run (jobs=2 at once)
    tmpfs: bool
    log: Path
    run_ids: list[str] = field(default_factory=list)  # the undisturbed sweep's run folders
    groups: list[int] = field(default_factory=list)  # one process group per invocation
    main: subprocess.Popen | None = None
    injected: Counter = field(default_factory=Counter)
    mid_run: Counter = field(default_factory=Counter)  # a run was being trained at that moment
    no_target: Counter = field(default_factory=Counter)  # nothing there to hit
    exits: Counter = field(default_factory=Counter)  # exit codes of the invocations
    problems: list[str] = field(default_factory=list)  # a fault not met with one clean line
    invocations: int = 0
    counted: bool = True  # the current invocation's exit code is in `exits`

    def start(self) -> None:
        with open(self.log, "a") as log:
            log.write(f"\n--- invocation {self.invocations + 1} at {files.now()}\n")
            log.flush()
            self.main = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.groups.append(self.main.pid)
        self.invocations += 1
        self.counted = False

    def wait_main(self, seconds: float) -> bool:
        """Whether the current invocation has ended (within `seconds`); its exit code is
        counted once."""
        try:
            code = self.main.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        if not self.counted:
            self.exits[code] += 1
            self.counted = True
        return True

    def wait_training(self, timeout: float) -> None:
        """Until a run is being trained, the invocation has ended, or `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (not self.training() and self.main.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.1)

    def ours(self, workers_only: bool = False) -> list[int]:
        """Live processes of every invocation (orphaned workers included)."""
        groups = set(self.groups)
        return [pid for pid, pgid, args in processes() if pgid in groups
                and (not workers_only or "--worker" in args)]

    def training(self) -> bool:
        """Whether some process holds a run's lock now (read from /proc/locks, like status)."""
        from qkstudy.locks import flock_holders

        held = flock_holders()
        return held is not None and any(
            locks.holder(f.lock_file, held) for f in run_folder.run_folders(self.sweep_dir))

    def inject(self, kind: str) -> None:
        self.injected[kind] += 1
        self.mid_run[kind] += self.training()
        hit = getattr(self, kind)()
        self.no_target[kind] += not hit
        with open(self.log, "a") as log:
            log.write(f"--- fault {kind} at {files.now()}{'' if hit else ' (no target)'}\n")

    def _signal_group(self, signum: int) -> bool:
        if self.main.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.main.pid, signum)
        return True

    def kill9_main(self) -> bool:
        if self.main.poll() is not None:
            return False
        self.main.kill()
        return True

    def kill9_worker(self) -> bool:
        workers = self.ours(workers_only=True)
        if not workers:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.rng.choice(workers), signal.SIGKILL)
        return True

    def sigint(self) -> bool:
        return self._signal_group(signal.SIGINT)

    def sigterm(self) -> bool:
        return self._signal_group(signal.SIGTERM)

    def disk_full(self) -> bool:
        """Fill the tmpfs under the runs folder, hold it full a few seconds, free it."""
        filler = self.sweep_dir.parent / ".filler"
        try:
            # unbuffered: a buffered file's close would flush what did not fit, and raise
            with open(filler, "wb", buffering=0) as f:
                with contextlib.suppress(OSError):
                    while f.write(b"\0" * (1 << 20)):
                        pass
                with contextlib.suppress(OSError):  # the last pages a smaller write still fits
                    while f.write(b"\0" * 4096):
                        pass
            time.sleep(self.rng.uniform(1.0, 4.0))
        finally:
            filler.unlink(missing_ok=True)
        return True

    def truncate_part(self) -> bool:
        parts = sorted(p for f in run_folder.run_folders(self.sweep_dir)
                       for _, p in run_folder.parts(f.metrics_dir))
        if not parts:
            return False
        part = self.rng.choice(parts)
        try:
            with open(part, "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                f.truncate(self.rng.randrange(size) if size else 0)
        except FileNotFoundError:  # replaced or dropped by a run meanwhile
            return False
        return True

    def stale_lock(self) -> bool:
        """A run's lock file left by a process killed (kill -9) while it held the lock, unless a
        live process holds it: a process takes the run's lock and kills itself."""
        folder = self.sweep_dir / self.rng.choice(self.run_ids)
        folder.mkdir(parents=True, exist_ok=True)
        code = ("import os, signal, sys; from pathlib import Path; "
                "from qkstudy.run_folder import RunFolder\n"
                "with RunFolder(Path(sys.argv[1])).lock() as held:\n"
                "    if held:\n        os.kill(os.getpid(), signal.SIGKILL)\n")
        done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True)
        return done.returncode == -signal.SIGKILL

    def full_disk_lock(self) -> bool:
        """Another invocation of the sweep (jobs=1) whose first write of a run's lock meets a
        full disk; no target if it wrote no lock (every run finished or held)."""
        command = [w if not w.startswith("jobs=") else "jobs=1" for w in self.command]
        out = faulted(command, f"write@{run_folder.LOCK}:ENOSPC", self.sweep_dir.parent)
        if out.returncode == 0:
            return False
        why = one_error_line(out)
        lock = re.search(r"run lock (\S+):", out.stderr)
        if why is None and (lock is None or Path(lock.group(1)).exists()
                            and not locks.holder(Path(lock.group(1)), None)):
            why = "its lock file is left behind"
        if why:
            self.problems.append(f"full_disk_lock: {why}")
        return True

    def wait_all(self, seconds: float) -> None:
        """Until no process of any invocation is left (orphaned workers finish their queue)."""
        deadline = time.monotonic() + seconds
        while self.ours():
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {self.ours()} still running after {seconds:.0f} s")
            time.sleep(0.5)

    def kill_all(self) -> None:
        """SIGKILL every process the storm started that is still there (cleanup)."""
        for pid in self.ours():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.main is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.main.wait(timeout=10)
