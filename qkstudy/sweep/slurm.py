"""`python -m qkstudy sweep ... --slurm [--submit]`: the runs left as a Slurm job array."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import files, interrupts, trainer
from ..arms import arm_name
from ..config import apply_overrides, parse_train_config, split_key_values
from ..errors import UsageError
from ..locks import RunBusy
from ..run_folder import ARRAY, SUBMISSION, TASK_LOG, TASKS, RunFolder, SweepFolder
from .config import SweepConfig
from .plan import command_line, counted, declare_grid, remaining_runs
from .refine import run_outcome

# Slurm job states in which an array task still holds (or will soon hold) its run.
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}")  # sbatch --time: MM, MM:SS, H:M:S, D-H[:M[:S]]


@dataclass(frozen=True)
class SlurmOptions:
    """sbatch settings (sweep keys slurm_*; they never enter a run's config or run_id)."""

    partition: str = ""  # empty: the cluster's default partition
    time: str = ""  # --time per task; empty: the partition's default
    cpus: int = 1  # --cpus-per-task
    gpus: int = -1  # --gres=gpu:N per task; -1: by the runs' device (for_device)
    max_parallel: int = 0  # the %K of --array=0-N%K; 0: no limit
    extra: str = ""  # more sbatch options, e.g. "--account=lab --qos=normal"
    # SIGTERM this long before the time limit (0: none) for the step in flight and a checkpoint
    signal_seconds: int = 120
    requeue: bool = True  # --requeue: a preempted task goes back to the queue and resumes

    def validate(self) -> SlurmOptions:
        if self.time and not TIME.fullmatch(self.time):
            raise UsageError(f"slurm_time={self.time!r} is not a Slurm time (MM, HH:MM:SS, "
                             "D-HH:MM)")
        for key, value, least in (("slurm_cpus", self.cpus, 1), ("slurm_gpus", self.gpus, -1),
                                  ("slurm_max_parallel", self.max_parallel, 0),
                                  ("slurm_signal_seconds", self.signal_seconds, 0)):
            if value < least:
                raise UsageError(f"{key} must be >= {least}, got {value}")
        if re.search(r"\s", self.partition):
            raise UsageError(f"slurm_partition={self.partition!r} holds whitespace")
        try:
            words = shlex.split(self.extra)
        except ValueError as e:
            raise UsageError(f"slurm_extra cannot be split into words: {e}") from None
        bad = [w for w in words if not w.startswith("-")]
        if bad:
            raise UsageError(f"slurm_extra: {bad[0]!r} is not an sbatch option (write "
                             "--option=value)")
        return self

    def for_device(self, device: str, backend: str = "torch") -> tuple[SlurmOptions, str | None]:
        """(options with gpus=-1 resolved for the device, a warning on a mismatch or None)."""
        gpus = self.gpus if self.gpus >= 0 else int(device == "cuda")
        warning = None  # MLX picks its own device: its GPU request is the user's alone
        if backend == "torch" and device == "cuda" and gpus == 0:
            warning = ("device=cuda with slurm_gpus=0: a task gets no GPU unless its partition "
                       "gives one, and then stops at its start (device cuda is not available)")
        elif backend == "torch" and device == "auto" and gpus == 0:
            warning = ("device=auto requests no GPU (slurm_gpus=0): the tasks train on the CPU "
                       "unless their partition gives them a GPU; for GPU runs use device=cuda "
                       "(one GPU a task) or slurm_gpus=1")
        elif backend == "torch" and device in ("cpu", "mps") and gpus > 0:
            warning = f"device={device} with slurm_gpus={gpus}: the GPUs are requested, not used"
        return dataclasses.replace(self, gpus=gpus), warning

    def sbatch_lines(self) -> list[str]:
        lines = [f"--cpus-per-task={self.cpus}"]
        lines += [f"--partition={self.partition}"] if self.partition else []
        lines += [f"--time={self.time}"] if self.time else []
        lines += [f"--gres=gpu:{self.gpus}"] if self.gpus > 0 else []
        # B: the batch shell, which `exec`s the task: the trainer gets SIGTERM and checkpoints
        lines += [f"--signal=B:TERM@{self.signal_seconds}"] if self.signal_seconds else []
        # a requeued task appends to its log (what the stopped attempt said is kept)
        lines += ["--requeue", "--open-mode=append"] if self.requeue else []
        return lines + shlex.split(self.extra)


KEYS = {f"slurm_{f.name}": f.name for f in dataclasses.fields(SlurmOptions)}


def split_options(words: list[str], enabled: bool) -> tuple[list[str], SlurmOptions]:
    pairs = split_key_values(words)
    mine = {k: pairs.pop(k) for k in list(pairs) if k.startswith("slurm_")}
    unknown = sorted(set(mine) - set(KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r}; Slurm keys: {', '.join(KEYS)}")
    if mine and not enabled:
        raise UsageError(f"{min(mine)} is a Slurm setting; add --slurm")
    options = apply_overrides(SlurmOptions(), {KEYS[k]: v for k, v in mine.items()})
    return [f"{k}={v}" for k, v in pairs.items()], options.validate()


def task_states(job_ids: list[str], ended: bool = False) -> dict[tuple[str, int], str] | None:
    """{(array job id, task index): state} from squeue (sacct with `ended`), or None."""
    command = (["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)] if ended
               else ["squeue", "-h", "-r", "-o", "%F_%K|%T"])
    if not job_ids or shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        base, _, task = job.partition("_")
        if base in job_ids and task.isdigit():
            states[(base, int(task))] = state.split()[0] if state else "?"
    return states


def active_runs(sweep_dir: Path) -> tuple[set[str], list[str]]:
    """(run ids of earlier submissions' tasks still queued or running, their job ids)."""
    earlier = {str(s["job_id"]): s.get("runs", []) for _, s in SweepFolder(sweep_dir).submissions()
               if s.get("job_id")}
    active = {(job, earlier[job][task]["run_id"])
              for (job, task), state in (task_states(list(earlier)) or {}).items()
              if state in ACTIVE and task < len(earlier[job])}
    return {run for _, run in active}, sorted({job for job, _ in active})


def submit(sweep: SweepConfig, options: SlurmOptions, send: bool) -> int:
    if send and shutil.which("sbatch") is None:
        raise UsageError("--submit needs sbatch on PATH; without --submit the array script is "
                         "written for you to submit")
    sweep_dir = (Path(sweep.runs_dir) / sweep.name).absolute()
    if re.search(r"\s", str(sweep_dir)) or re.search(r"\s", str(Path.cwd())):
        raise UsageError(f"{sweep_dir} holds whitespace, which #SBATCH lines cannot hold")
    options, warning = options.for_device(sweep.train.device, sweep.train.backend)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    todo, refine = remaining_runs(sweep)
    active, jobs = active_runs(sweep_dir)
    runs = [c for c in todo + refine if c.run_id not in active]
    n_grid = sum(1 for c in todo if c.run_id not in active)
    held = (f"; {len(active)} more are still queued or running in job {', '.join(jobs)}"
            if active else "")
    if not runs:
        print(f"sweep {sweep.name}: nothing to submit: every run the results call for is finished"
              f"{held}", flush=True)
        return 0
    declare_grid(sweep)
    folder = SweepFolder(sweep_dir).next_submission()
    record = {"created": files.now(), "job_id": None, "sweep": sweep.name,
              "runs": [{"run_id": c.run_id, "depth": c.depth, "lr": c.lr, "arm": arm_name(c),
                        "seed": c.seed, "steps": c.steps, "tokens_per_step": c.tokens_per_step}
                       for c in runs]}
    script, tasks = folder / ARRAY, folder / TASKS
    limit = f"%{options.max_parallel}" if options.max_parallel else ""
    lines = ["#!/bin/bash", f"#SBATCH --job-name=qknorm-{sweep.name}",
             f"#SBATCH --array=0-{len(runs) - 1}{limit}", f"#SBATCH --output={folder / TASK_LOG.format('%a')}"]
    lines += [f"#SBATCH {option}" for option in options.sbatch_lines()]
    lines += [
        f"# Sweep {sweep.name}: array task i trains the run on line i+1 of {TASKS}. A run found",
        "# finished or held elsewhere exits 0; SIGTERM checkpoints it (the next submission "
        "resumes).",
        f"cd {shlex.quote(str(Path.cwd()))}",
        f"exec {shlex.quote(sys.executable)} -m qkstudy sweep --slurm-task "
        f"{shlex.quote(str(tasks))} \"$SLURM_ARRAY_TASK_ID\"", ""]
    with files.atomic_folder(folder) as tmp:
        files.write_text(tmp / TASKS, "".join(command_line(c) + "\n" for c in runs))
        files.write_json(tmp / SUBMISSION, record)
        files.write_text(tmp / script.name, "\n".join(lines))
    print(f"sweep {sweep.name}: {counted(len(runs), 'run')} to submit as one array: "
          f"{counted(n_grid, 'grid run')} not finished (interrupted ones resume from their "
          f"checkpoint), {counted(len(runs) - n_grid, 'boundary-refinement run')} the results so "
          f"far call for{held}.", flush=True)
    print(f"  task list {tasks}\n  logs      {folder / TASK_LOG.format('<i>')}")
    if send:
        sbatch(script, record)
    else:
        print(f"submit with:\n  sbatch {shlex.quote(str(script))}")
    print("Once the array ends, run the same command again: it submits only what is left "
          "(unfinished runs and the next round of boundary refinement). "
          f"Progress: python -m qkstudy status {sweep_dir}", flush=True)
    return 0


def sbatch(script: Path, record: dict) -> None:
    line = f"sbatch {shlex.quote(str(script))}"
    try:
        out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"{line} failed: {e}") from None
    if out.returncode != 0:
        raise UsageError(f"{line} failed: {(out.stderr or out.stdout).strip()}")
    job_id = out.stdout.strip().split(";")[0]
    files.write_json(script.parent / SUBMISSION, {**record, "job_id": job_id})
    print(f"{line}\nsubmitted job array {job_id} ({counted(len(record['runs']), 'task')})")


def run_task(args: list[str]) -> int:
    """`sweep --slurm-task TASKS_FILE INDEX`: train the run on line INDEX+1 of TASKS_FILE."""
    if len(args) != 2 or not args[1].isdigit():
        raise UsageError("usage: python -m qkstudy sweep --slurm-task TASKS_FILE INDEX")
    path, index = Path(args[0]), int(args[1])
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    if index >= len(lines):
        raise UsageError(f"{path} has {len(lines)} tasks; there is no task {index}")
    words = shlex.split(lines[index])
    cfg = parse_train_config(words[words.index("train") + 1:])
    label = f"task {index}: run {cfg.run_id}"
    print(f"{label} on {os.uname().nodename}, pid {os.getpid()}", flush=True)
    outcome = run_outcome(cfg)
    if outcome.finished:
        print(f"{label} is already {outcome.value}; nothing to do", flush=True)
        return 0
    try:
        summary = trainer.train(cfg, prefix=f"[task {index}] ")
    except RunBusy:
        print(f"{label} is held by another process (its lock); nothing to do", flush=True)
        return 0
    except KeyboardInterrupt as e:
        print(f"{label} stopped by {e or 'SIGINT'}; checkpointed, the next submission resumes it",
              flush=True)
        return interrupts.exit_code(e)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - train recorded it; the task says so and fails
        print(f"{label} failed: {type(e).__name__}: {e} (traceback in "
              f"{RunFolder.of(cfg).traceback_file})", flush=True)
        return 1
    print(f"{label} {summary['status']}", flush=True)
    return 0
