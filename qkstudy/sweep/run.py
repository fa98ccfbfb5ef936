"""Running a sweep: its runs one after another, the workers of jobs=K, the report."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import backends, files, forecast, locks, run_folder, trainer
from ..arms import arm_name
from ..config import TrainConfig, load_config
from ..data.load import DataChanged, data_change
from ..errors import UsageError
from ..locks import RunBusy
from ..progress import format_seconds
from ..run_folder import RunFolder, SweepFolder, run_folders
from .adaptive import extra_runs
from .config import SweepConfig, grid, groups, run_config
from .plan import counted
from .refine import Outcome, boundary, group_state, run_outcome


@dataclass
class Tally:
    total: int
    trained: int = 0
    skipped: int = 0
    status: dict[str, int] = field(default_factory=lambda: {"completed": 0, "diverged": 0,
                                                            "failed": 0})
    busy: list[TrainConfig] = field(default_factory=list)  # held by another process
    siblings: set[str] = field(default_factory=set)  # runs seen held by the sweep's own processes
    damaged: list[str] = field(default_factory=list)  # a line per damaged run not repaired
    data_changed: list[str] = field(default_factory=list)  # runs made of other data: untouched
    repaired: list[tuple[str, str, Path]] = field(default_factory=list)  # (run, damage, old files)
    processes: int = 1  # sweep processes sharing the queue (jobs=K)
    data: dict | None = None  # the data's identity when the sweep started
    planned: float = 0.0  # calibrated seconds of the runs trained, after this process's first
    seconds: float = 0.0  # their wall time (the first run pays the cold kernel compile)

    @property
    def done(self) -> int:
        return sum(self.status.values())


def run_one(cfg: TrainConfig, tally: Tally, attempted: set[str], speed: float, queue_left: float
            ) -> None:
    """Train one run (or skip it) into the tally; `speed`, `queue_left`: calibrated figures."""
    attempted.add(cfg.run_id)
    if passed_by(cfg, tally):
        return
    planned = forecast.run_cost_tokens(cfg) / speed if speed > 0 else 0.0
    eta = format_seconds(forecast.queue_eta(queue_left, planned, tally.planned, tally.seconds,
                                            tally.processes))
    position = f"{tally.done + len(tally.busy) + 1}/{tally.total}"
    sibling = sibling_name(cfg, holder(cfg))

    def announce(by: str | None = None) -> None:  # the run's one progress line
        counts = ", ".join(f"{n} {s}" for s, n in tally.status.items())
        busy = ("with its other processes" if tally.processes > 1 or by
                else "passed over (held elsewhere)")
        print(f"[sweep {position}: {counts}, {len(tally.busy)} {busy} | ETA {eta}] "
              f"lr {cfg.lr:.3g} arm {arm_name(cfg)} depth {cfg.depth} seed {cfg.seed}"
              + (f": trained by {by}" if by else ""), flush=True)

    if sibling:  # one line for the run, whichever of the sweep's processes trains it
        if cfg.run_id not in tally.siblings:  # else looked at again: its line is printed
            announce(sibling)
        tally.busy.append(cfg)
        tally.siblings.add(cfg.run_id)
        return
    start = time.perf_counter()
    summary = train_guarded(cfg, tally, position, announce)
    if summary is None:
        return
    tally.trained += 1
    if tally.trained > 1 and planned > 0:  # the first run pays the cold compile: not a rate
        tally.seconds += time.perf_counter() - start
        tally.planned += planned * min(1.0, (summary.get("steps") or 0) / cfg.steps)
    tally.status[summary["status"] if summary["status"] in tally.status else "failed"] += 1


def passed_by(cfg: TrainConfig, tally: Tally) -> bool:
    """Whether the run is not to be trained (other data, finished intact, killed its process)."""
    now, changed = trainer.data_check(cfg)
    change = tally.data and now and data_change(tally.data, now)
    if change:  # one sweep, one data: its runs are compared with each other
        raise UsageError(f"{cfg.data} was prepared again while this sweep ran ({change}); the "
                         "runs it trained so far used the earlier data. Prepare that data again "
                         "at this path, or run the sweep on the new data under another name=")
    if changed:  # neither skipped as finished nor resumed nor repaired
        tally.data_changed.append(changed)
        print(f"data changed: {changed}", flush=True)
        return True
    folder, v = RunFolder.of(cfg), run_outcome(cfg)
    if v.finished:
        try:
            folder.intact_summary()
        except run_folder.DamagedRun:
            return False  # trained again; train moves the damaged folder aside first
        folder.tidy()  # what a process killed in the run's last writes left
        tally.skipped += 1
        tally.status[v.value] += 1
        sibling = sibling_name(cfg, folder.trained_by())
        if sibling and cfg.run_id not in tally.siblings:  # it ended meanwhile
            tally.siblings.add(cfg.run_id)
            print(f"[sweep {tally.done + len(tally.busy)}/{tally.total}] lr {cfg.lr:.3g} "
                  f"arm {arm_name(cfg)} depth {cfg.depth} seed {cfg.seed}: {v.value}, "
                  f"trained by {sibling}", flush=True)
        return True
    summary = folder.summary_record()
    if v is Outcome.FAILED and summary.get("fatal_signal"):  # it would take the sweep down again
        tally.status["failed"] += 1
        print(f"{cfg.run_id} killed its process before ({summary.get('error')}); not retried. "
              f"Remove {folder.summary_file} to retry it", flush=True)
        return True
    return False


def train_guarded(cfg: TrainConfig, tally: Tally, position: str, announce: Callable) -> dict | None:
    """trainer.train's summary, or None when the run was held, damaged, of other data or failed."""
    def repaired(moved_to: Path, why: str) -> None:
        tally.repaired.append((cfg.run_id, why, moved_to))
        print(f"[{position}] repair: {why}; its files are kept in {moved_to}; training it again",
              flush=True)

    try:
        return trainer.train(cfg, prefix=f"[{position}] ", repair=repaired, started=announce)
    except RunBusy:
        tally.busy.append(cfg)
        pid = holder(cfg)
        if not sibling_name(cfg, pid):  # a sibling took it meanwhile: its own
            print(f"[{position}] {cfg.run_id} is held by a process outside this sweep"
                  + (f" (pid {pid})" if pid else "") + "; passing over", flush=True)
    except run_folder.DamagedRun as e:
        tally.damaged.append(str(e))
        print(f"[{position}] damaged: {e}", flush=True)
    except DataChanged as e:  # the data was prepared again while the sweep ran
        tally.data_changed.append(str(e))
        print(f"[{position}] data changed: {e}", flush=True)
    except (KeyboardInterrupt, UsageError):
        raise
    except Exception as e:  # noqa: BLE001 - one failed run must not stop the sweep
        tally.status["failed"] += 1
        tally.trained += 1
        print(f"[{position}] {cfg.run_id} failed: {type(e).__name__}: {e} (traceback in "
              f"{RunFolder.of(cfg).traceback_file})", flush=True)
    return None


def locked(folder: RunFolder) -> bool:
    if not folder.path.is_dir():
        return False
    with folder.lock() as acquired:
        return not acquired


def holder(cfg: TrainConfig) -> int | None:
    folder = RunFolder.of(cfg)
    return locks.written_pid(folder.lock_file) if locked(folder) else None


def sibling_name(cfg: TrainConfig, pid: int | None) -> str | None:
    """'sweep process 2 (its log: ...)' when `pid` is one of this sweep's own, else None."""
    if pid is None or pid == os.getpid():
        return None
    folder = SweepFolder(RunFolder.of(cfg).path.parent)
    pids = (files.read_json(folder.processes_file) or {}).get("pids")
    if not isinstance(pids, list) or pid not in pids:
        return None
    i = pids.index(pid)
    return ("the sweep's first process (its console)" if i == 0
            else f"sweep process {i + 1} (its log: {folder.worker_log(i)})")


def _held_elsewhere(cfg: TrainConfig) -> bool:
    return not run_outcome(cfg).finished and locked(RunFolder.of(cfg))


def execute(sweep: SweepConfig, speeds: Mapping[int, float]) -> Tally:
    """Train the grid, then what its results call for; runs held elsewhere are retried."""
    runs = grid(sweep)
    tally = Tally(total=len(runs), processes=sweep.jobs, data=trainer.data_check(sweep.train)[0])
    attempted: set[str] = set()
    counted = {c.run_id for c in runs}  # the runs in tally.total

    def train_all(cfgs: list[TrainConfig]) -> None:
        for i, cfg in enumerate(cfgs):
            run_one(cfg, tally, attempted, speeds.get(cfg.depth, 0.0),
                    forecast.run_seconds(cfgs[i:], speeds))

    finished = [c for c in runs if run_outcome(c).finished]
    for cfg in finished:  # skipped silently; a damaged one is repaired (and says so)
        train_all([cfg])
    if tally.skipped:
        print(f"{tally.skipped} of {len(runs)} grid runs already finished; skipping them",
              flush=True)
    # runs after the grid are read by the replay from their summary alone: check their files
    # too, and tidy them as a finished grid run is
    for cfg in finished_after_grid(sweep, runs):
        try:
            RunFolder.of(cfg).intact_summary()
        except run_folder.DamagedRun:
            tally.total += 1
            train_all([cfg])
        else:
            RunFolder.of(cfg).tidy()
    train_all([c for c in runs if c.run_id not in attempted])
    for cfg in list(tally.busy):  # finished by now (skipped), still busy, or free (trained)
        tally.busy.remove(cfg)
        train_all([cfg])
    while True:  # one round = at most one new point per curve, cell or threshold, together
        # a grid run another process still trains comes first: the next round is planned from
        # the whole grid, so this process waits for it, then trains its share of that round
        wanted = [c for c in runs if _held_elsewhere(c)] or extra_runs(sweep, groups(sweep))
        new = [cfg for cfg in wanted if cfg.run_id not in attempted]
        if new:  # a run retried after waiting on another process is counted once
            tally.total += len({c.run_id for c in new} - counted)
            counted.update(c.run_id for c in new)
            train_all(new)
            continue
        # the next round waits on runs another process holds: wait with it for them
        held = [cfg for cfg in wanted if _held_elsewhere(cfg)]
        if not held:
            return tally
        time.sleep(5.0)
        for cfg in held:
            attempted.discard(cfg.run_id)
            tally.busy = [c for c in tally.busy if c.run_id != cfg.run_id]


def added_runs(sweep: SweepConfig, known: set[str]) -> list[TrainConfig]:
    out = []
    for folder in run_folders(Path(sweep.runs_dir) / sweep.name):
        if folder.name in known:
            continue
        try:
            cfg = load_config(str(folder.config_file))
        except UsageError:
            continue  # not this sweep's run (or damaged): the status and report name it
        arm = arm_name(cfg)
        mine = run_config(sweep, cfg.depth, cfg.lr, arm, cfg.seed)
        if arm in sweep.arms and mine.run_id == folder.name == cfg.run_id:
            out.append(mine)
    return out


def finished_after_grid(sweep: SweepConfig, grid_runs: list[TrainConfig]) -> list[TrainConfig]:
    return [c for c in added_runs(sweep, {c.run_id for c in grid_runs}) if run_outcome(c).finished]


def report(sweep: SweepConfig, tally: Tally, seconds: float) -> None:
    """What the runs/ tree now holds for this sweep (whoever trained it), and each boundary."""
    folder, on_grid = Path(sweep.runs_dir) / sweep.name, set(sweep.grid_lrs())
    curves = {g: group_state(sweep, g)[0] for g in groups(sweep)}
    runs = grid(sweep) + [run_config(sweep, depth, lr, arm, seed) for (depth, arm, seed), results
                          in curves.items() for lr in results if lr not in on_grid]
    runs += added_runs(sweep, {c.run_id for c in runs})
    counts = Counter(run_outcome(cfg).value for cfg in runs)
    print(f"sweep {sweep.name}: {len(runs) - counts['pending']} of {counted(len(runs), 'run')} "
          f"have a result ({counts['completed']} completed, {counts['diverged']} diverged, "
          f"{counts['failed']} failed); {tally.trained} trained by this process; sweep wall "
          f"time {format_seconds(seconds)} (plan and calibration included); results in {folder}"
          + (f"; {counted(len(tally.repaired), 'damaged run')} repaired, the damaged files kept "
             f"in {folder / run_folder.DAMAGED}" if tally.repaired else ""))
    for run_id, why, moved_to in tally.repaired:
        print(f"  repaired: {run_id} ({why}); trained again, the damaged files kept in {moved_to}")
    if tally.busy:
        print(f"  {counted(len(tally.busy), 'run is', 'runs are')} held by another process: "
              f"{', '.join(c.run_id for c in tally.busy)}. "
              "Run the sweep again once it ends to finish any refinement that waits on them.")
    if counts["failed"]:
        print("  failed runs keep a traceback in their folder; the next sweep retries them "
              "(except runs that killed their process by a fatal signal).")
    for line in tally.damaged:
        print(f"  damaged: {line}")
    if tally.data_changed:
        print(f"  {counted(len(tally.data_changed), 'run was', 'runs were')} trained on other "
              "data than the data folder holds now; left untouched:")
    for line in tally.data_changed:
        print(f"  data changed: {line}")
    print("  stability boundary per curve (largest stable LR < smallest diverged LR):")
    width = max(len(a) for a in sweep.arms)
    for (depth, arm, seed), results in curves.items():
        lo, hi = boundary(results)
        print(f"    depth {depth} arm {arm:<{width}} seed {seed}:  "
              f"{'-' if lo is None else f'{lo:.3g}'} < "
              f"{'none diverged' if hi is None else f'{hi:.3g}'}"
              + ("" if len(results) >= len(on_grid) else "  (grid incomplete)"))


def gpu_share(sweep: SweepConfig, slot: int) -> dict[str, str]:
    """Sweep process `slot`'s environment: on N GPUs it trains on cuda:(slot mod N)."""
    return {backends.RUNS_PER_DEVICE: str(sweep.jobs), backends.DEVICE_SLOT: str(slot)}
