"""The storm test: a whole small sweep with jobs=2, once undisturbed and once under random
faults, must end with every run folder and the report's tables identical.

    python -m reliability chaos [faults=30] [seed=N] [work=DIR] [keep=true] [sweep key=value ...]

Faults (kinds drawn in turn, moments at random from a seeded RNG, the seed printed):
  kill9_main    SIGKILL to the main sweep process (its worker goes on alone, an orphan)
  kill9_worker  SIGKILL to a worker sweep process (of this or an earlier invocation)
  sigint        SIGINT to the sweep's process group, as Ctrl-C in a terminal
  sigterm       SIGTERM to the sweep's process group, as systemd or docker stop
  disk_full     the runs folder (a small tmpfs) filled to the last byte for a few seconds
  truncate_part a metrics part of a finished or running run cut short
  stale_lock    a run's .lock left holding the pid of a process that is gone
  full_disk_lock  another invocation (jobs=1) whose first write of a run's lock finds the disk
                full (qkstudy/fault_injection.py): one error line, exit 2, no lock file left
  full_disk_report  once, after the storm: the report of the storm's tree written onto a full
                disk: one error line, exit 2, the earlier report byte-identical

After a fault the harness waits a moment: if the invocation has ended, the same sweep command
is started again; if it is still running, it takes the next fault. After the last fault, once
every process the storm started has ended, the same command runs undisturbed to the end.
Every run folder is then compared with the undisturbed sweep's (metrics and probe rows without
the wall clock, final weights, summary without timings, config), and so are the tables
analysis.report.analyse computes from both trees. Exit 1 on any difference.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkstudy import files, run_folder
from qkstudy.run_folder import RunFolder
from qkstudy.config import split_key_values
from qkstudy.errors import UsageError

KINDS = ("kill9_main", "kill9_worker", "sigint", "sigterm", "disk_full", "truncate_part",
         "stale_lock", "full_disk_lock", "full_disk_report")
# full_disk_report is injected once, after the storm, into the report of the storm's tree
AFTER_THE_STORM = ("full_disk_report",)
ENDS_THE_INVOCATION = {"kill9_main", "sigint", "sigterm"}  # the harness waits for it to end

# mini-shaped (d_model 64, 2 heads, block 64, batch 16) and tiny: 8 grid runs + 4 refinement runs
SWEEP = ("preset=mini depth=2 lrs=0.01,1 seeds=0,1 max_steps=40 warmup_steps=5 eval_every=10 "
         "probe_every=10 log_every=5 ckpt_every=10 divergence_window=10 max_seeds=2 "
         "threshold_steps=0").split()
NAME = "chaos"
WALL_CLOCK = ("wall_seconds", "train_seconds", "measure_seconds", "tokens_per_second")  # summary keys left out
PER_RUN_OTHER = (*WALL_CLOCK, "run_dir")  # per_run columns that differ between two trees
TABLES = ("arms", "sensitivity_per_seed", "usable_per_seed", "gaps", "thresholds", "spikes",
          "verdicts", "best_gaps", "h2_tests", "h3_tests", "loss_thresholds", "per_run")

USAGE = "usage: " + __doc__.split("\n\n")[1].strip() + """

keys: faults=30 (at least one of each kind from 7 on)  seed= (default: drawn, printed)
      work= (a folder for the data and both trees; default a temporary one, removed on success)
      keep=false (keep work even on success)  data= (a prepared corpus; default: synthetic bytes)
      any other key=value is a sweep key and replaces the default's
      (default sweep: """ + " ".join(SWEEP) + ")"


# --- what is compared --------------------------------------------------------------------------

def metric_rows(folder: Path) -> list[dict]:
    """A run's metric rows without the wall clock (elapsed_s)."""
    return RunFolder(folder).read_metrics().drop(["elapsed_s"]).to_pylist()


def probe_rows(folder: Path) -> list[dict]:
    return RunFolder(folder).read_probes().to_pylist()


def run_folders(sweep_dir: Path) -> list[str]:
    """The run folders of a sweep folder (dot-folders such as .damaged/ are not runs)."""
    return [f.name for f in run_folder.run_folders(sweep_dir)]


def compare_run(ref: Path, got: Path) -> list[str]:
    """What differs between two folders of one run (empty: identical)."""
    out = []
    ref, got = RunFolder(ref), RunFolder(got)
    try:
        checks = [("metrics rows", lambda f: metric_rows(f.path)),
                  ("probe rows", lambda f: probe_rows(f.path)),
                  ("config", RunFolder.read_config),
                  ("summary", lambda f: {k: v for k, v in f.summary_record().items()
                                         if k not in WALL_CLOCK}),
                  ("files", lambda f: sorted(p.name for p in f.path.iterdir()
                                             if p != f.lock_file))]
        for what, read in checks:
            if read(ref) != read(got):
                out.append(f"{got.name}: {what} differ")
        want, _ = files.read_tensors(ref.final_file)
        have, _ = files.read_tensors(got.final_file)
        if want.keys() != have.keys() or any(
                want[k].dtype != have[k].dtype or not np.array_equal(want[k], have[k])
                for k in want):
            out.append(f"{got.name}: final weights differ")
    except Exception as e:  # noqa: BLE001 - a file that cannot be read is a difference too
        out.append(f"{got.name}: unreadable ({type(e).__name__}: {e})")
    return out


def report_tables(sweep_dir: Path) -> dict:
    """The report's tables (analysis.study.analyse), wall-clock and path columns left out."""
    from analysis.load import load_runs
    from analysis.study import analyse

    study = analyse(load_runs(sweep_dir))
    tables = {name: getattr(study, name) for name in TABLES}
    tables["per_run"] = tables["per_run"].drop(PER_RUN_OTHER, strict=False)
    return {**tables, "notes": study.notes}


def compare_trees(ref: Path, got: Path) -> list[str]:
    """Every difference between two sweep folders: run folders, then the report's tables."""
    want, have = run_folders(ref), run_folders(got)
    out = [f"run folder {r} missing" for r in sorted(set(want) - set(have))]
    out += [f"run folder {r} not in the undisturbed sweep" for r in sorted(set(have) - set(want))]
    for run in sorted(set(want) & set(have)):
        out += compare_run(ref / run, got / run)
    try:
        a, b = report_tables(ref), report_tables(got)
    except Exception as e:  # noqa: BLE001
        return out + [f"report tables: {type(e).__name__}: {e}"]
    for name in a:
        same = a[name] == b[name] if name == "notes" else a[name].equals(b[name])
        if not same:
            out.append(f"report table {name} differs")
    return out


# --- processes ---------------------------------------------------------------------------------

def one_error_line(out: subprocess.CompletedProcess) -> str | None:
    """Why the failed command's output is not one clean error line, or None."""
    if out.returncode != 2:
        return f"exit code {out.returncode}" + (f": {out.stderr.strip()[-300:]}"
                                                if out.stderr.strip() else "")
    if "Traceback" in out.stderr + out.stdout:
        return "a traceback"
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    if len(errors) != 1:
        return f"{len(errors)} error lines"
    if not re.search(r"; .*(again|space|disk|writable)", errors[0]):
        return f"the error line says nothing of what to do: {errors[0]}"
    return None


def faulted(command: list[str], fault: str, root: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run `command` with one injected fault (qkstudy/fault_injection.py) under `root`."""
    from qkstudy.fault_injection import ENV, ROOT_ENV

    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, ENV: fault, ROOT_ENV: str(root)}, **kwargs)



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
            f.holder(held) for f in run_folder.run_folders(self.sweep_dir))

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
                       for _, p in f.metric_parts())
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
                            and not RunFolder(Path(lock.group(1)).parent).holder(None)):
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


def schedule(rng: random.Random, n: int, kinds: list[str]) -> list[str]:
    """n fault kinds: every kind in turn (each floor(n / k) times or more), in random order."""
    out = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(out)
    return out


# --- the storm ---------------------------------------------------------------------------------

@dataclass
class Result:
    seed: int
    differences: list[str]
    injected: Counter
    mid_run: Counter
    no_target: Counter
    skipped: dict[str, str]  # kind -> why it could not run here
    exits: Counter
    invocations: int
    final_invocations: int
    repaired: int  # run folders moved to .damaged/ by the sweep
    compared: int  # run folders compared with the undisturbed sweep's
    reference_seconds: float
    storm_seconds: float

    @property
    def ok(self) -> bool:
        return not self.differences

    def table(self) -> str:
        w = max(map(len, KINDS)) + 2
        lines = [f"{'fault':<{w}}{'injected':>9}{'mid-run':>9}{'no target':>10}{'survived':>9}"]
        for kind in KINDS:
            if kind in self.skipped:
                lines.append(f"{kind:<{w}}  skipped: {self.skipped[kind]}")
                continue
            n = self.injected[kind]
            lines.append(f"{kind:<{w}}{n:>9}{self.mid_run[kind]:>9}{self.no_target[kind]:>10}"
                         f"{n if self.ok else 0:>9}")
        total = sum(self.injected.values())
        lines.append(f"{'total':<{w}}{total:>9}{sum(self.mid_run.values()):>9}"
                     f"{sum(self.no_target.values()):>10}{total if self.ok else 0:>9}")
        return "\n".join(lines)


def full_disk_report(sweep_dir: Path, out: Path) -> list[str]:
    """Build the report of `sweep_dir` into `out`, then again onto a full disk (the first table
    written fails): one error line, exit 2, the first report byte-identical, nothing left."""
    command = [sys.executable, "-m", "analysis", "report", str(sweep_dir), f"out={out}"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if first.returncode:
        return [f"full_disk_report: the report exited {first.returncode}"]
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    again = faulted(command, "open@tables/:ENOSPC", out.parent)
    why = one_error_line(again)
    left = [p.name for p in out.parent.glob(f".{out.name}.*")]
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return ([f"full_disk_report: {why}"] if why else []) + (
        [f"full_disk_report: left {left}"] if left else []) + (
        ["full_disk_report: the earlier report changed"] if after != before else [])


def mount_tmpfs(folder: Path, megabytes: int) -> str | None:
    """Mount a tmpfs of this size on `folder`; None, or why it cannot be done here."""
    if not sys.platform.startswith("linux"):
        return "tmpfs mounts are for Linux"
    if os.geteuid() != 0:
        return "not running as root (mounting a tmpfs needs it)"
    if not shutil.which("mount"):
        return "no mount command"
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                          str(folder)], capture_output=True, text=True)
    if out.returncode:
        return f"mount -t tmpfs failed: {(out.stderr or out.stdout).strip()[:200]}"
    return None


def storm(faults: int, seed: int, work: Path, sweep_words: list[str], data: str | None = None,
          say=print) -> Result:
    """Run the undisturbed sweep and the storm under `work`, compare them; see the module doc."""
    work.mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-m", "qkstudy"]
    if data is None:
        data = str(work / "data")
        if not (Path(data) / "meta.json").exists():
            subprocess.run([*python, "prepare", "synthetic", "tokenizer=bytes", "size_mb=1",
                            f"out={data}"], check=True, capture_output=True)

    def command(runs_dir: Path) -> list[str]:
        return [*python, "sweep", *sweep_words, f"data={data}", f"runs_dir={runs_dir}",
                f"name={NAME}", "jobs=2", "--no-notify"]

    reference = work / "reference"
    say(f"undisturbed sweep into {reference} ...")
    t0 = time.monotonic()
    with open(work / "reference.log", "w") as log:
        rc = subprocess.run(command(reference), stdout=log, stderr=subprocess.STDOUT).returncode
    reference_seconds = time.monotonic() - t0
    if rc:
        raise RuntimeError(f"the undisturbed sweep exited {rc}; see {work / 'reference.log'}")
    run_ids = run_folders(reference / NAME)
    say(f"  {len(run_ids)} runs in {reference_seconds:.0f} s")

    root = work / "storm"
    root.mkdir(exist_ok=True)
    size = sum(p.stat().st_size for p in reference.rglob("*") if p.is_file())
    why = mount_tmpfs(root, max(64, math.ceil(8 * size / 2**20)))
    skipped = {"disk_full": why} if why else {}
    if why:
        say(f"disk_full faults skipped: {why}")
    kinds = [k for k in KINDS if k not in skipped]
    rng = random.Random(seed)
    s = Storm(command(root), root / NAME, rng, spread=max(3.0, 2 * reference_seconds / faults),
              run_seconds=2 * reference_seconds / len(run_ids), tmpfs=not why,
              log=work / "storm.log", run_ids=run_ids)
    t0 = time.monotonic()
    try:
        plan = schedule(rng, faults, [k for k in kinds if k not in AFTER_THE_STORM])
        say(f"storm of {faults} faults (seed {seed}) into {root} ...")
        for i, kind in enumerate(plan):
            if s.main is None or s.wait_main(0):
                s.start()
            if rng.random() < 1 / 3:  # anywhere: start-up, calibration, between runs, the end
                time.sleep(rng.uniform(0, s.spread))
            else:  # somewhere in a run being trained, if the sweep gets to one
                s.wait_training(timeout=4 * s.spread)
                time.sleep(rng.uniform(0, s.run_seconds))
            s.inject(kind)
            if kind in ENDS_THE_INVOCATION:
                if not s.wait_main(600):
                    raise RuntimeError(f"the sweep did not end within 600 s of {kind}")
            else:
                s.wait_main(rng.uniform(0, s.run_seconds))
            say(f"  fault {i + 1}/{faults}: {kind}"
                + ("" if s.main.poll() is None else f" (sweep exited {s.main.returncode})"))
        s.wait_main(600)
        # the same command to the end, undisturbed, with no earlier process left; again if a
        # run it passed over (held by a process of its own) still has no result
        final = 0
        while True:
            s.wait_all(1800)
            s.start()
            final += 1
            s.wait_main(3600)
            if set(run_folders(root / NAME)) >= set(run_ids) or final == 3:
                break
        s.wait_all(1800)
        storm_seconds = time.monotonic() - t0
        say(f"compared: {len(run_ids)} run folders and the report's tables")
        differences = compare_trees(reference / NAME, root / NAME) + s.problems
        if "full_disk_report" in kinds:
            differences += full_disk_report(root / NAME, work / "report")
            s.injected["full_disk_report"] += 1
        damaged = root / NAME / run_folder.DAMAGED
        repaired = len([p for p in damaged.iterdir() if p.is_dir()]) if damaged.exists() else 0
    finally:
        s.kill_all()
        if not why:
            # the storm's tree is kept for inspection on disk, out of the tmpfs
            with contextlib.suppress(OSError):
                shutil.copytree(root, work / "storm-tree", dirs_exist_ok=True)
            subprocess.run(["umount", str(root)], check=False, capture_output=True)
    return Result(seed=seed, differences=differences, injected=s.injected, mid_run=s.mid_run,
                  no_target=s.no_target, skipped=skipped, exits=s.exits,
                  invocations=s.invocations, final_invocations=final, repaired=repaired,
                  compared=len(run_ids),
                  reference_seconds=reference_seconds, storm_seconds=storm_seconds)


def cli(argv: list[str]) -> int:
    options = split_key_values(argv)
    own = {k: options.pop(k) for k in ("faults", "seed", "work", "keep", "data") if k in options}
    try:
        faults = int(own.get("faults", 30))
        seed = int(own["seed"]) if "seed" in own else random.SystemRandom().randrange(10**6)
    except ValueError:
        raise UsageError("faults and seed must be integers") from None
    if faults < 1:
        raise UsageError(f"faults must be >= 1, got {faults}")
    if own.get("keep", "false") not in ("true", "false"):
        raise UsageError(f"keep must be true or false, got {own['keep']!r}")
    for key in ("runs_dir", "name", "jobs"):
        if key in options:
            raise UsageError(f"{key} is set by the storm (two trees, name={NAME}, jobs=2)")
    defaults = split_key_values(SWEEP)
    words = [f"{k}={v}" for k, v in {**defaults, **options}.items()]
    work = Path(own["work"]) if "work" in own else Path(tempfile.mkdtemp(prefix="mlx-gpt-chaos-"))
    print(f"storm test: seed {seed}, {faults} faults, work folder {work}", flush=True)
    t0 = time.monotonic()
    result = storm(faults, seed, work, words, own.get("data"),
                   say=lambda line: print(line, flush=True))
    print(result.table())
    exits = ", ".join(f"{code}: {n}" for code, n in sorted(result.exits.items()))
    print(f"{result.invocations} invocations of the sweep ({result.final_invocations} undisturbed "
          f"at the end); exit codes {exits}; {result.compared} run folders compared; "
          f"{result.repaired} damaged runs repaired (moved to "
          f"{NAME}/{run_folder.DAMAGED}/, not compared); undisturbed sweep "
          f"{result.reference_seconds:.0f} s, storm {result.storm_seconds:.0f} s, "
          f"all {time.monotonic() - t0:.0f} s; seed {seed}")
    if result.differences:
        print(f"FAILED: {len(result.differences)} differences (trees kept in {work}):")
        for line in result.differences:
            print(f"  {line}")
        return 1
    print("identical: every run folder and every report table")
    if own.get("keep") != "true" and "work" not in own:
        shutil.rmtree(work, ignore_errors=True)
    return 0
