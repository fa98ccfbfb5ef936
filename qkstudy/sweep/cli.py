"""`python -m qkstudy sweep ...`: parse, print the plan or the commands, run, report."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import files, interrupts, trainer
from ..config import split_flags
from ..errors import UsageError
from ..run_folder import SweepFolder
from ..variants import CHOICES
from . import slurm
from .config import SweepConfig, grid, parse_sweep_config
from .plan import command_line, counted, declare_grid, describe, remaining_runs
from .refine import Outcome, run_outcome
from .run import Tally, execute, gpu_share, report

USAGE = f"""usage: python -m qkstudy sweep [key=value ...] [--dry-run [--calibrate]]
                                [--emit-commands] [--slurm [--submit] [slurm_key=value ...]]

Trains arms x LR grid x seeds (x depths) as independent, resumable runs, then refines each
curve's stability boundary and each depth's LR bracket where the seed-mean gap crosses min_gap,
and adds seeds to the cells still undecided. Presets: preset=study (default), mini,
mini-coupled-wd or demo.
sweep keys: depth=6 or depth=2,4,8  lrs=1e-3,3e-3 (explicit)  lr_min= lr_max= points_per_decade=
            seeds=0,1,2  arms=none,rmsnorm  refine=true  refine_steps=  refine_factor=
            threshold_steps=2  max_seeds=6  min_gap=0.1
            (arms: {", ".join(CHOICES)}, softcap<C>, zloss<W>)
            name= (folder under runs_dir)  runs_dir=runs  jobs=1
any other TrainConfig key (d_model=, budget_tokens=, warmup_steps=, ...) goes into every run.
  --dry-run        print the plan, its device and estimated time, and stop (--calibrate times
                   every depth; else the bench's stored figure or a short timing is used)
  --emit-commands  print each remaining run as one `python -m qkstudy train ...` line
  --no-notify      no terminal bell and desktop notification when the sweep ends
  --slurm          write a Slurm job array of the runs left (one run per task) under
                   <runs_dir>/<name>/slurm/ and print its sbatch line; --submit also submits it.
                   slurm_partition= slurm_time= slurm_cpus=1 slurm_max_parallel=K
                   slurm_gpus= (one GPU a task with device=cuda, else none)
                   slurm_signal_seconds=120 slurm_requeue=true
                   slurm_extra="--account=... --qos=..." (none of them changes a run)"""

FLAGS = ("--dry-run", "--calibrate", "--emit-commands", "--slurm", "--submit", "--no-notify",
         "--worker")


def cli(argv: list[str]) -> int:
    stdout = sys.stdout
    try:
        return _cli(argv)
    finally:
        if isinstance(sys.stdout, _Tee):
            sys.stdout.file.close()
        sys.stdout = stdout


def _cli(argv: list[str]) -> int:
    if argv[:1] == ["--slurm-task"]:  # one task of a job array written by --slurm
        return slurm.run_task(argv[1:])
    words, flags = split_flags(argv, FLAGS, ", ".join(FLAGS[:5]))
    words, slurm_options = slurm.split_options(words, "--slurm" in flags)
    if "--submit" in flags and "--slurm" not in flags:
        raise UsageError("--submit goes with --slurm")
    if "--slurm" in flags and flags.keys() & {"--dry-run", "--calibrate", "--emit-commands"}:
        raise UsageError("--slurm writes the job array; give it without --dry-run, --calibrate "
                         "or --emit-commands")
    sweep = parse_sweep_config(words)
    runs = [c.validate() for c in grid(sweep)]  # every run's config is checked before anything runs
    if "--emit-commands" in flags:
        todo, refine = remaining_runs(sweep)
        print("".join(command_line(cfg) + "\n" for cfg in todo + refine), end="")
        print(f"# {len(todo)} of {len(runs)} grid runs left, {len(refine)} refinement runs called "
              "for by the results so far" + (" (run --emit-commands again once these finish and "
                                             "their folders are merged)" if sweep.refine else ""),
              file=sys.stderr)
        return 0
    worker, dry = "--worker" in flags, "--dry-run" in flags
    start = time.perf_counter()
    if not dry and not worker:
        trainer.load_data(sweep.train)  # the data must exist before anything is written
        if "--slurm" in flags:
            return slurm.submit(sweep, slurm_options, send="--submit" in flags)
        folder = SweepFolder(Path(sweep.runs_dir) / sweep.name)
        files.make_folder(folder.path, "sweep folder")
        sys.stdout = _Tee(sys.stdout, folder.log_file)  # everything printed, appended
        print(f"--- sweep started {files.now()} by process {os.getpid()}: {' '.join(sys.argv)}")
    speeds = {} if worker else describe(sweep, runs, not dry or "--calibrate" in flags)
    if dry:
        return 0
    if not worker:
        declare_grid(sweep, speeds)
    tally = run_with_workers(sweep, words, speeds)  # a worker has jobs=1: no workers of its own
    if isinstance(tally, int) or worker:  # interrupted: its exit code
        return tally if isinstance(tally, int) else 0
    report(sweep, tally, time.perf_counter() - start)
    if "--no-notify" not in flags:
        failed = tally.status["failed"]
        notify(f"sweep {sweep.name} finished", f"{tally.done} runs have a result"
               + (f", {failed} failed" if failed else ""))
    return 0


def run_with_workers(sweep: SweepConfig, words: list[str], speeds: dict[int, float]) -> Tally | int:
    """Train beside jobs - 1 workers: the tally, or an interrupt's exit code."""
    workers, folder = [], SweepFolder(Path(sweep.runs_dir) / sweep.name)
    os.environ.update(gpu_share(sweep, 0) if sweep.jobs > 1 else {})  # the first of K processes
    for i in range(1, sweep.jobs):  # K-1 more on the same tree (run locks share the work)
        # appended, never truncated: a worker of an earlier, interrupted sweep may still write
        log = open(folder.worker_log(i), "a")  # noqa: SIM115 - the child writes it
        print(f"--- sweep worker {i} started {files.now()} by process {os.getpid()}", file=log,
              flush=True)
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "qkstudy", "sweep",
             *[w for w in words if not w.startswith("jobs=")], "jobs=1", "--worker"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **gpu_share(sweep, i)}))
        log.close()
    if workers:
        pids = [os.getpid(), *(w.pid for w in workers)]  # the main process first
        files.write_json(folder.processes_file, {"pids": pids})
        print(f"started {counted(len(workers), 'more sweep process', 'more sweep processes')} "
              f"(logs in {folder.worker_log('*')})", flush=True)
    try:
        tally = execute(sweep, speeds)
    except KeyboardInterrupt as e:
        stop_workers(workers)
        print(f"\nsweep {sweep.name} interrupted; the current run is checkpointed. Run the same "
              f"command again to resume: python -m qkstudy sweep {shlex.join(words)}",
              file=sys.stderr, flush=True)
        return interrupts.exit_code(e)
    finally:
        for w in workers:
            if w.wait() < 0 and -w.returncode not in interrupts.SIGNALS:
                print(f"sweep worker {w.pid} died by signal {signal.Signals(-w.returncode).name};"
                      " the run it held resumes from its checkpoint (or, after a fatal signal, is "
                      "recorded as failed) when the sweep runs again", file=sys.stderr, flush=True)
    if workers:  # the other processes may have finished runs this one passed over
        tally.busy = [c for c in tally.busy if run_outcome(c) is Outcome.PENDING]
    return tally


class _Tee:
    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, text: str) -> int:
        self.file.write(text.replace("\r\033[K", "\n"))
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()


def stop_workers(workers: list, grace: float = 10.0) -> None:
    """SIGINT to a worker still running `grace` seconds after this process was interrupted."""
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            w.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.send_signal(signal.SIGINT)


def notify(title: str, message: str) -> None:
    if sys.stdout.isatty():
        print("\a", end="", flush=True)
    if sys.platform == "darwin" and shutil.which("osascript"):
        command = ["osascript", "-e", f"display notification {json.dumps(message)} "
                                      f"with title {json.dumps(title)}"]
    elif shutil.which("notify-send"):
        command = ["notify-send", title, message]
    else:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(command, timeout=10, check=False, capture_output=True)
