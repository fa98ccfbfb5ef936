"""`python -m qkstudy status`: a sweep at a glance; it only reads, never locks or writes."""

from __future__ import annotations

import itertools
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import locks, provenance, run_folder
from .arms import arm_of
from .config import split_flags
from .errors import UsageError
from .forecast import time_left_line
from .locks import flock_holders
from .progress import format_seconds
from .run_folder import RunFolder, SweepFolder, run_folders
from .sweep import slurm

USAGE = """usage: python -m qkstudy status [RUNS_DIR | SWEEP_DIR] [--watch[=SECONDS]]

Every run of a sweep (or of every sweep under RUNS_DIR, default runs/): completed, diverged at
step N, failed (its error), running (step, loss, tok/s, the process holding it), interrupted at
a checkpoint, or waiting; the sweep's progress, ETA and time left on this machine; Slurm task
states for a sweep submitted with --slurm. Reads files only. --watch redraws it in place every
5 s (or SECONDS) until Ctrl-C, which exits 0."""
WATCH_SECONDS = 5.0
CLEAR = "\033[H\033[2J"  # ANSI: cursor home, erase the screen (any terminal, no `watch`)

STATES = ("completed", "diverged", "failed", "running", "interrupted", "waiting")


@dataclass
class Run:
    run_id: str
    depth: int | None = None
    lr: float | None = None
    arm: str = "?"  # none, rmsnorm, softcap50, ... (qkstudy/arms.py)
    seed: int | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    state: str = "waiting"
    step: int = 0  # updates applied (as of the last checkpoint for a running run)
    loss: float | None = None
    tok_s: float | None = None
    holder: int | None = None  # pid holding the run lock
    machine: str | None = None  # where a finished run was trained; None: on this machine
    detail: str = ""
    slurm: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "diverged")


def read_run(run_dir: Path, held: dict | None) -> Run:
    folder = RunFolder(run_dir)
    config, summary = folder.read_config() or {}, folder.summary_record()
    steps, tps = summary.get("steps"), None
    if config.get("batch_size") and config.get("block_size"):
        tps = config["batch_size"] * config["block_size"]
        budget = config.get("budget_tokens") or 0
        steps = max(1, budget // tps) if budget > 0 else config.get("max_steps", steps)
    run = Run(run_dir.name, config.get("depth", summary.get("depth")),
              config.get("lr", summary.get("lr")), arm_of(config),
              config.get("seed", summary.get("seed")), steps, tps,
              holder=locks.holder(folder.lock_file, held))
    row_step, run.loss = folder.latest_row()
    status = summary.get("status")
    if status in ("completed", "diverged") and run.holder is None:
        run.state, run.tok_s = status, summary.get("tokens_per_second")
        run.machine = provenance.trained_on(folder.read_manifest() or {})
        run.step = summary.get("steps") or run.steps or 0
        if status == "diverged":
            run.step = summary.get("diverged_step") or run.step
            run.detail = f"at step {run.step}"
        elif isinstance(summary.get("final_val_loss"), (int, float)):
            run.detail = f"val {summary['final_val_loss']:.4f}"
        return run
    ckpt = folder.checkpoint_progress()  # its seconds count evaluation and probes, as a pace does
    run.step = ckpt[0] if ckpt else row_step + 1 if row_step is not None else 0
    if ckpt and ckpt[1] and run.tokens_per_step:
        run.tok_s = run.step * run.tokens_per_step / ckpt[1]
    if run.holder is not None:
        run.state, run.detail = "running", f"pid {run.holder}"
    elif status == "failed":
        run.state, run.detail = "failed", str(summary.get("error") or "").split("\n")[0]
    elif ckpt:
        run.state, run.detail = "interrupted", f"checkpoint at step {run.step}; resumes"
    return run


def sweep_runs(sweep_dir: Path, held: dict | None) -> list[Run]:
    """The sweep's run folders, and, waiting, its Slurm runs and grid points without a folder."""
    runs = {f.path.name: read_run(f.path, held) for f in run_folders(sweep_dir)}
    for _, record in SweepFolder(sweep_dir).submissions():
        for r in record.get("runs", []):
            if isinstance(r, dict) and r.get("run_id") and r["run_id"] not in runs:
                runs[r["run_id"]] = Run(r["run_id"], r.get("depth"), r.get("lr"),
                                        r.get("arm", "?"), r.get("seed"), r.get("steps"),
                                        r.get("tokens_per_step"))
    plan = SweepFolder(sweep_dir).read_plan()
    covered = {(r.depth, r.lr, r.arm, r.seed) for r in runs.values()}
    shapes = Counter((r.steps, r.tokens_per_step) for r in runs.values() if r.steps)
    steps, tps = shapes.most_common(1)[0][0] if shapes else (None, None)
    axes = (plan.get(k, []) for k in ("seeds", "depths", "grid_lrs", "arms"))
    for seed, depth, lr, arm in itertools.product(*axes):
        if (depth, lr, arm, seed) not in covered:
            name = f"d{depth}-{arm}-lr{lr:.3g}-s{seed}"
            runs[name] = Run(name, depth, lr, arm, seed, steps, tps, detail="(no folder yet)")
    return sorted(runs.values(), key=lambda r: (r.seed if r.seed is not None else 1 << 30,
                                                r.depth or 0, r.lr or 0.0, r.arm, r.run_id))


def add_slurm_states(sweep_dir: Path, runs: list[Run]) -> str | None:
    """Fill each submitted run's `slurm` column; where the states came from, or None."""
    tasks = {r["run_id"]: (record.get("job_id"), i, folder)
             for folder, record in SweepFolder(sweep_dir).submissions()
             for i, r in enumerate(record.get("runs", []))
             if isinstance(r, dict) and r.get("run_id")}
    if not tasks:
        return None
    jobs = sorted({job for job, _, _ in tasks.values() if job})
    queued, ended = slurm.task_states(jobs), slurm.task_states(jobs, ended=True)
    for run in runs:
        if run.run_id not in tasks:
            continue
        job, i, folder = tasks[run.run_id]
        if job is None:
            run.slurm = f"not submitted ({folder.name})"
            continue
        state = (queued or {}).get((job, i)) or (ended or {}).get((job, i))
        if state is None:  # not in the queue (or no squeue): the task's log says if it ran
            log = (folder / run_folder.TASK_LOG.format(i)).exists()
            state = ("ended" if log else "not in queue") if queued is not None else (
                "log written" if log else "submitted")
        run.slurm = f"{job}_{i} {state}"
    sources = ["squeue"] * (queued is not None) + ["sacct"] * (ended is not None)
    return " + ".join(sources) or "files"


def progress(runs: list[Run]) -> tuple[float, float, float, int]:
    """(tokens done, tokens planned, tok/s of the runs training, their number)."""
    done = total = 0.0
    for r in runs:
        if r.steps and r.tokens_per_step:
            total += r.steps * r.tokens_per_step
            done += (r.steps if r.finished else min(r.step, r.steps)) * r.tokens_per_step
    done_runs = [r for r in runs if r.finished and r.tok_s]  # this machine's first
    rates = [r.tok_s for r in done_runs if r.machine is None] or [r.tok_s for r in done_runs]
    typical = sum(rates) / len(rates) if rates else 0.0  # for a running run without a rate yet
    running = [r for r in runs if r.state == "running"]
    return done, total, sum(r.tok_s or typical for r in running), len(running)


def render(sweep_dir: Path) -> str:
    runs = sweep_runs(sweep_dir, flock_holders())
    source = add_slurm_states(sweep_dir, runs)
    counts = Counter(r.state for r in runs)
    done, total, rate, n_running = progress(runs)
    eta = max(0.0, total - done) / rate if rate > 0 else None  # None: nothing is training
    share = f"{done / total:.0%} of {total:,.0f} planned tokens" if total else "no planned tokens"
    if eta is not None:
        line = (f"progress {share} | ETA {format_seconds(eta)} at {rate:,.0f} tok/s "
                f"({n_running} run{'s' if n_running != 1 else ''} training)")
    else:
        line = f"progress {share} | no run is being trained now" + (
            "; resume with the sweep's command" if not counts["running"] and counts["waiting"]
            + counts["interrupted"] + counts["failed"] else "")
    sweep_json = SweepFolder(sweep_dir).read_plan()
    page = Path("reports") / sweep_dir.name / "report.html"
    lines = [f"sweep {sweep_dir.name}  ({sweep_dir})  at {time.strftime('%H:%M:%S')}",
             f"{len(runs)} runs: " + ", ".join(f"{counts[s]} {s}" for s in STATES), line,
             time_left_line(runs, SweepFolder(sweep_dir).read_speeds()),
             f"report: none yet in {page.parent} (just report {sweep_dir})"]
    if page.exists():  # and whether runs have finished since it was built
        built = page.stat().st_mtime
        newer = sum(1 for f in run_folders(sweep_dir)
                    if f.summary_file.exists() and f.summary_file.stat().st_mtime > built)
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(built))
        lines[-1] = (f"report: {page} (built {stamp}"
                     + (f"; {newer} runs ended since: just report {sweep_dir})" if newer else ")"))
    if sweep_json.get("refine"):
        lines.append("(boundary bisection, the bisection of the seed-mean crossing and adaptive "
                     "seeds join the plan as the grid's results come in)")
    if source:
        lines.append(f"Slurm task states from {source}")
    for r in SweepFolder(sweep_dir).set_aside_records():  # damaged runs moved aside, trained again
        lines.append(f"repaired {r['moved']}: {r.get('run_id')} ({r.get('damage')}); the damaged "
                     f"files are kept in {r.get('moved_to')}")
    width = max([len(r.run_id) for r in runs] + [3])
    head = f"{'run':<{width}}  {'state':<34} {'step':>13} {'loss':>8} {'tok/s':>9}"
    lines += ["", head + ("  slurm" if source else "")]
    for r in runs:
        state = f"{r.state} {r.detail}".strip()
        state = state if len(state) <= 34 else state[:33] + "~"
        step = f"{r.step:,}/{r.steps:,}" if r.steps and r.state != "waiting" else "-"
        loss = f"{r.loss:.4f}" if r.loss is not None else "-"
        tok_s = f"{r.tok_s:,.0f}" if r.tok_s else "-"
        lines.append(f"{r.run_id:<{width}}  {state:<34} {step:>13} {loss:>8} {tok_s:>9}"
                     + (f"  {r.slurm}" if source else ""))
    return "\n".join(lines)


def sweep_folders(path: Path) -> list[Path]:
    """The sweep folder `path`, or the sweeps in a folder of sweeps; UsageError for neither."""
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder (give a runs folder or a sweep folder)")
    if RunFolder(path).is_run():
        raise UsageError(f"{path} is a run folder; give its sweep folder {path.parent}")
    folders = [path] if SweepFolder(path).is_sweep() else sorted(
        p for p in path.iterdir() if p.is_dir() and SweepFolder(p).is_sweep())
    if not folders:
        raise UsageError(f"{path} holds no sweep (no run folders, no {run_folder.PLAN})")
    return folders


def screen(path: Path) -> str:
    return "\n\n".join(render(f) for f in sweep_folders(path))


def watch_seconds(flags: dict[str, str]) -> float | None:
    if "--watch" not in flags:
        return None
    text = flags["--watch"] or str(WATCH_SECONDS)
    try:
        seconds = float(text)
    except ValueError:
        raise UsageError(f"--watch={text}: not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"--watch={text}: give a number of seconds > 0")
    return seconds


def follow(path: Path, seconds: float) -> int:
    """Redraw the screen every `seconds` until Ctrl-C (exit 0): each frame is read whole, then
    drawn over the last one on a terminal (appended, without escape codes, to a file or pipe)."""
    clear = CLEAR if sys.stdout.isatty() else "\n"
    try:
        while True:
            frame = screen(path)  # sweeps that appear under a runs folder join the next frame
            sys.stdout.write(f"{clear}{frame}\n\n(every {seconds:g} s; Ctrl-C stops)\n")
            sys.stdout.flush()
            time.sleep(seconds)
    except KeyboardInterrupt as e:
        if getattr(e, "signum", signal.SIGINT) != signal.SIGINT:
            raise  # SIGTERM stops it as it stops every command
        print()
        return 0


def cli(argv: list[str]) -> int:
    paths, flags = split_flags(argv, ("--watch",), "--watch[=SECONDS]")
    if len(paths) > 1:
        raise UsageError(f"give one folder, got {len(paths)}: {' '.join(paths)}")
    path = Path(paths[0] if paths else "runs")  # a sweep folder, or a folder of sweeps
    seconds = watch_seconds(flags)
    if seconds is not None:
        return follow(path, seconds)
    print(screen(path))
    return 0
