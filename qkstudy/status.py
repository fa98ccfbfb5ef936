"""`python -m qkstudy status [RUNS_DIR | SWEEP_DIR] [--watch[=SECONDS]]`: a sweep at a glance.

One screen per sweep: every run with its state (completed, diverged at step N, failed with its
error, running with step, loss and tok/s, interrupted at a checkpoint, waiting), the process
that holds it, the Slurm task state beside it when the sweep was submitted with `--slurm`, and
the sweep's progress and ETA. It only reads files (and asks squeue/sacct): it never takes a run
lock, so it cannot make a sweep process pass over a run, and it never writes.

Where the numbers come from: summary.json (finished and failed runs); the run lock (`.lock`:
held or not, read from /proc/locks on Linux, else whether the pid written in it is alive);
checkpoint.safetensors' header (step and training seconds, so steps advance once per
checkpoint interval); the last metrics part (train loss); sweep.json (grid points with no
folder yet are waiting); slurm/<NNN>/submission.json (runs submitted to Slurm); .damaged/*.json (damaged runs moved
aside and trained again).
"""

from __future__ import annotations

import ast
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import files, run_folder
from .locks import flock_holders
from .run_folder import RunFolder, run_folders
from .arms import arm_of
from .progress import format_seconds
from .errors import UsageError

USAGE = """usage: python -m qkstudy status [RUNS_DIR | SWEEP_DIR] [--watch[=SECONDS]]

Every run of a sweep (or of every sweep under RUNS_DIR, default runs/): completed, diverged at
step N, failed (its error), running (step, loss, tok/s, the process holding it), interrupted at
a checkpoint, or waiting; the sweep's progress and ETA; Slurm task states for a sweep submitted
with --slurm. Reads files only. --watch redraws it every 5 s (or SECONDS) until Ctrl-C."""

STATES = ("completed", "diverged", "failed", "running", "interrupted", "waiting")


@dataclass
class Run:
    run_id: str
    depth: int | None = None
    lr: float | None = None
    arm: str = "?"  # none, rmsnorm, softcap50, ... (qkstudy/sweep/arms.py)
    seed: int | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    state: str = "waiting"
    step: int = 0  # updates applied (as of the last checkpoint for a running run)
    loss: float | None = None
    tok_s: float | None = None
    holder: int | None = None  # pid holding the run lock
    detail: str = ""
    slurm: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "diverged")

    @property
    def order(self) -> tuple:
        return (self.seed if self.seed is not None else 1 << 30, self.depth or 0, self.lr or 0.0,
                self.arm, self.run_id)


# --- reading one run ---------------------------------------------------------------------------


def checkpoint_clocks(folder: RunFolder) -> dict:
    """{step, train_seconds} from the checkpoint's header metadata, or {} without one; its
    train_seconds counts evaluation and probes too (measure_seconds), as a run's pace does."""
    meta = folder.checkpoint_metadata()
    try:
        return {"step": int(meta["step"]),
                "train_seconds": sum(float(ast.literal_eval(meta.get(k, "0")))
                                     for k in ("train_seconds", "measure_seconds"))}
    except (TypeError, KeyError, ValueError, SyntaxError):
        return {}


def last_row(folder: RunFolder) -> tuple[int | None, float | None]:
    """(step, train loss) of the last metrics row written, and the latest train loss in that
    part (an evaluation row at the end has none), or (None, None)."""
    import pyarrow.parquet as pq

    found = folder.metric_parts()
    if not found:
        return None, None
    try:
        table = pq.read_table(found[-1][1], columns=["step", "train_loss"])
    except Exception:  # noqa: BLE001 - a part being replaced or damaged: no number, no crash
        return None, None
    if table.num_rows == 0:
        return None, None
    losses = [x for x in table.column("train_loss").to_pylist() if x is not None]
    return int(table.column("step")[-1].as_py()), losses[-1] if losses else None


def read_run(run_dir: Path, held: dict | None) -> Run:
    folder = RunFolder(run_dir)
    config = folder.read_config() or {}
    summary = folder.summary_record()
    steps = summary.get("steps")
    if config.get("batch_size") and config.get("block_size"):
        tps = config["batch_size"] * config["block_size"]
        budget = config.get("budget_tokens") or 0
        steps = max(1, budget // tps) if budget > 0 else config.get("max_steps", steps)
    else:
        tps = None
    run = Run(run_dir.name, depth=config.get("depth", summary.get("depth")),
              lr=config.get("lr", summary.get("lr")),
              arm=arm_of(config),
              seed=config.get("seed", summary.get("seed")), steps=steps, tokens_per_step=tps)
    run.holder = folder.holder(held)
    status = summary.get("status")
    if status in ("completed", "diverged") and run.holder is None:
        run.state = status
        run.step = summary.get("steps") or run.steps or 0
        run.tok_s = summary.get("tokens_per_second")
        if status == "diverged":
            run.step = summary.get("diverged_step") or run.step
            run.detail = f"at step {run.step}"
        elif isinstance(summary.get("final_val_loss"), (int, float)):
            run.detail = f"val {summary['final_val_loss']:.4f}"
        run.loss = last_row(folder)[1]
        return run
    ckpt = checkpoint_clocks(folder)
    row_step, run.loss = last_row(folder)
    run.step = ckpt.get("step", row_step + 1 if row_step is not None else 0)
    if ckpt.get("train_seconds") and run.tokens_per_step:
        run.tok_s = run.step * run.tokens_per_step / ckpt["train_seconds"]
    if run.holder is not None:
        run.state = "running"
        run.detail = f"pid {run.holder}"
    elif status == "failed":
        run.state = "failed"
        run.detail = str(summary.get("error", "")).splitlines()[0] if summary.get("error") else ""
    elif ckpt:
        run.state = "interrupted"
        run.detail = f"checkpoint at step {run.step}; resumes"
    return run


# --- a sweep -----------------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return RunFolder(path).is_run()


def sweep_runs(sweep_dir: Path, held: dict | None) -> list[Run]:
    """Every run of the sweep: its run folders, the grid points of sweep.json without a folder
    and the runs submitted to Slurm without a folder (both waiting)."""
    runs = {p.name: read_run(p, held) for p in sorted(sweep_dir.iterdir())
            if p.is_dir() and is_run_dir(p)}
    for submission in sorted((sweep_dir / "slurm").glob("[0-9][0-9][0-9]*/submission.json")):
        for r in (files.read_json(submission) or {}).get("runs", []):
            if isinstance(r, dict) and r.get("run_id") and r["run_id"] not in runs:
                runs[r["run_id"]] = Run(r["run_id"], r.get("depth"), r.get("lr"),
                                        r.get("arm", "?"), r.get("seed"), r.get("steps"),
                                        r.get("tokens_per_step"))
    plan = files.read_json(sweep_dir / "sweep.json") or {}
    covered = {(r.depth, r.lr, r.arm, r.seed) for r in runs.values()}
    shapes = Counter((r.steps, r.tokens_per_step) for r in runs.values() if r.steps)
    steps, tps = shapes.most_common(1)[0][0] if shapes else (None, None)
    for seed in plan.get("seeds", []):
        for depth in plan.get("depths", []):
            for lr in plan.get("grid_lrs", []):
                for arm in plan.get("arms", []):
                    if (depth, lr, arm, seed) not in covered:
                        name = f"d{depth}-{arm}-lr{lr:.3g}-s{seed}"
                        runs[name] = Run(name, depth, lr, arm, seed, steps, tps,
                                         detail="(no folder yet)")
    return sorted(runs.values(), key=lambda r: r.order)


def slurm_tasks(sweep_dir: Path) -> dict[str, tuple[str | None, int, Path]]:
    """{run_id: (job id or None if not submitted, task index, submission folder)}, the latest
    submission of each run."""
    tasks = {}
    for folder in sorted(p for p in (sweep_dir / "slurm").glob("[0-9][0-9][0-9]*") if p.is_dir()):
        record = files.read_json(folder / "submission.json") or {}
        for i, r in enumerate(record.get("runs", [])):
            if isinstance(r, dict) and r.get("run_id"):
                tasks[r["run_id"]] = (record.get("job_id"), i, folder)
    return tasks


def add_slurm_states(sweep_dir: Path, runs: list[Run]) -> str | None:
    """Fill each submitted run's `slurm` column; returns where the states came from."""
    from .sweep import slurm

    tasks = slurm_tasks(sweep_dir)
    if not tasks:
        return None
    jobs = sorted({job for job, _, _ in tasks.values() if job})
    queued = slurm.queue_states(jobs)
    ended = slurm.accounting_states(jobs)
    for run in runs:
        if run.run_id.split()[0] not in tasks:
            continue
        job, i, folder = tasks[run.run_id.split()[0]]
        if job is None:
            run.slurm = f"not submitted ({folder.name})"
            continue
        state = (queued or {}).get((job, i)) or (ended or {}).get((job, i))
        if state is None:  # not in the queue (or no squeue): the task's log says if it ran
            log = (folder / f"task-{i}.log").exists()
            state = ("ended" if log else "not in queue") if queued is not None else (
                "log written" if log else "submitted")
        run.slurm = f"{job}_{i} {state}"
    return ("squeue" if queued is not None else "") + (
        (" + " if queued is not None else "") + "sacct" if ended is not None else "") or "files"


# --- progress and ETA --------------------------------------------------------------------------


def eta_seconds(remaining_tokens: float, rate: float) -> float | None:
    """Seconds left at `rate` tokens/s, None when nothing is being trained (rate 0)."""
    if rate <= 0:
        return None
    return max(0.0, remaining_tokens) / rate


def progress(runs: list[Run]) -> tuple[float, float, float, int]:
    """(tokens done, tokens planned, combined tok/s of the runs being trained, their number).

    A finished run counts in full (a diverged run stops early: nothing of it is left); a run in
    progress counts its checkpointed steps. A running run without a measured rate yet is
    counted at the mean rate of the sweep's finished runs."""
    done = total = 0.0
    for r in runs:
        if not (r.steps and r.tokens_per_step):
            continue
        total += r.steps * r.tokens_per_step
        done += r.steps * r.tokens_per_step if r.finished else min(r.step, r.steps) * r.tokens_per_step
    finished_rates = [r.tok_s for r in runs if r.finished and r.tok_s]
    typical = sum(finished_rates) / len(finished_rates) if finished_rates else 0.0
    running = [r for r in runs if r.state == "running"]
    rate = sum(r.tok_s or typical for r in running)
    return done, total, rate, len(running)


def extras_lines(runs: list[Run], sweep_json: dict) -> list[str]:
    """What the sweep added after its grid (sweep/adaptive.py): the refinement LRs off the grid
    and the adaptive seeds with the (depth, LR) cells they went to."""
    grid, seeds = sweep_json.get("grid_lrs"), sweep_json.get("seeds")
    out = []
    if isinstance(grid, list):
        off_grid = sorted({r.lr for r in runs if r.lr is not None
                           and all(abs(r.lr - g) > 1e-12 * g for g in grid if _is_number(g))})
        if off_grid:
            out.append("refinement LRs off the grid: " + ", ".join(f"{x:.3g}" for x in off_grid))
    if isinstance(seeds, list):
        added = [r for r in runs if r.seed is not None and r.seed not in seeds]
        if added:
            cells = sorted({(r.depth, r.lr) for r in added}, key=lambda c: (c[0] or 0, c[1] or 0))
            out.append(f"adaptive seeds: {len(added)} runs of seeds "
                       f"{', '.join(map(str, sorted({r.seed for r in added})))} in "
                       f"{len(cells)} open cells (depth, LR): "
                       + ", ".join(f"({d}, {lr:.3g})" for d, lr in cells))
    return out


def rates_by_depth(runs: list[Run], sweep_json: dict) -> tuple[dict, list[str]]:
    """({depth: tokens/s}, where they come from): the median rate of a depth's finished runs,
    else the rate the sweep calibrated for it at its start (sweep.json)."""
    rates, measured, calibrated = {}, [], []
    stored = sweep_json.get("calibrated_tokens_per_s")
    for depth in sorted({r.depth for r in runs if r.depth is not None}):
        done = sorted(r.tok_s for r in runs if r.depth == depth and r.finished and r.tok_s)
        if done:
            rates[depth] = statistics.median(done)
            measured.append(str(depth))
        elif isinstance(stored, dict) and _is_number(stored.get(str(depth))):
            rates[depth] = float(stored[str(depth)])
            calibrated.append(str(depth))
    sources = ([f"measured by its finished runs (depth {', '.join(measured)})"] if measured
               else []) + ([f"calibrated at its start (depth {', '.join(calibrated)})"]
                           if calibrated else [])
    return rates, sources


def time_left_line(runs: list[Run], sweep_json: dict) -> str:
    """The time the runs not yet finished take in one process, as the sweep's plan counts it."""
    from .sweep.estimate import time_text

    left = [r for r in runs if not r.finished and r.state != "failed"]
    if not left:
        return "time left: none (every run has a result" + (
            "; failed runs are retried by the sweep's command)" if any(
                r.state == "failed" for r in runs) else ")")
    rates, sources = rates_by_depth(runs, sweep_json)
    seconds, unknown = 0.0, 0
    for r in left:
        if r.depth in rates and r.steps and r.tokens_per_step:
            seconds += (r.steps - min(r.step, r.steps)) * r.tokens_per_step / rates[r.depth]
        else:
            unknown += 1
    if unknown == len(left):
        return (f"time left: not known for the {len(left)} runs left (no finished run and no "
                "calibration of their depths yet)")
    return (f"time left: ~{time_text(seconds)} for {len(left) - unknown} of the {len(left)} runs "
            f"left in one process (training only; tok/s {' and '.join(sources)})"
            + (f"; {unknown} runs of depths not yet timed not counted" if unknown else ""))


def report_line(sweep_dir: Path) -> str:
    """Where the sweep's report is (`just report`'s default folder), and whether runs have
    finished since it was built."""
    page = Path("reports") / sweep_dir.name / "report.html"
    if not page.exists():
        return f"report: none yet in {page.parent} (just report {sweep_dir})"
    built = page.stat().st_mtime
    newer = sum(1 for f in run_folders(sweep_dir)
                if f.summary_file.exists() and f.summary_file.stat().st_mtime > built)
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(built))
    return (f"report: {page} (built {stamp}"
            + (f"; {newer} runs ended since: just report {sweep_dir})" if newer else ")"))


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def render(sweep_dir: Path, now: float | None = None) -> str:
    held = flock_holders()
    runs = sweep_runs(sweep_dir, held)
    source = add_slurm_states(sweep_dir, runs)
    counts = Counter(r.state for r in runs)
    done, total, rate, n_running = progress(runs)
    eta = eta_seconds(total - done, rate)
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    lines = [f"sweep {sweep_dir.name}  ({sweep_dir})  at {stamp}",
             f"{len(runs)} runs: " + ", ".join(f"{counts[s]} {s}" for s in STATES)]
    share = f"{done / total:.0%} of {total:,.0f} planned tokens" if total else "no planned tokens"
    if eta is not None:
        lines.append(f"progress {share} | ETA {format_seconds(eta)} at {rate:,.0f} tok/s "
                     f"({n_running} run{'s' if n_running != 1 else ''} training)")
    else:
        lines.append(f"progress {share} | no run is being trained now"
                     + ("" if counts["running"] else "; resume with the sweep's command"
                        if counts["waiting"] + counts["interrupted"] + counts["failed"] else ""))
    sweep_json = files.read_json(sweep_dir / "sweep.json") or {}
    lines.append(time_left_line(runs, sweep_json))
    lines.append(report_line(sweep_dir))
    if sweep_json.get("refine"):
        lines.append("(boundary- and threshold-refinement runs and adaptive seeds join the plan "
                     "as the grid's results come in)")
    lines += extras_lines(runs, sweep_json)
    if source:
        lines.append(f"Slurm task states from {source}")
    for r in run_folder.set_aside_records(sweep_dir):  # damaged runs moved aside, then trained again
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


def sweep_dirs(path: Path) -> list[Path]:
    """The sweep folders at `path`: itself when it holds runs or sweep.json, else its children
    that do."""
    def is_sweep(p: Path) -> bool:
        return (p / "sweep.json").exists() or (p / "slurm").is_dir() or any(
            c.is_dir() and is_run_dir(c) for c in p.iterdir())

    if not path.is_dir():
        raise UsageError(f"{path} is not a folder (give a runs folder or a sweep folder)")
    if is_run_dir(path):
        raise UsageError(f"{path} is a run folder; give its sweep folder {path.parent}")
    if is_sweep(path):
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and is_sweep(p))
    if not found:
        raise UsageError(f"{path} holds no sweep (no run folders, no sweep.json)")
    return found


def cli(argv: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in argv):
        print(USAGE)
        return 0
    watch = None
    paths = []
    for a in argv:
        if a == "--watch" or a.startswith("--watch="):
            text = a.partition("=")[2] or "5"
            try:
                watch = float(text)
            except ValueError:
                raise UsageError(f"--watch={text}: not a number of seconds") from None
            if watch <= 0:
                raise UsageError(f"--watch={text}: must be > 0 seconds")
        elif a.startswith("-"):
            raise UsageError(f"unknown flag {a}; flags: --watch[=SECONDS]")
        else:
            paths.append(a)
    if len(paths) > 1:
        raise UsageError(f"give one folder, got {len(paths)}: {' '.join(paths)}")
    folders = sweep_dirs(Path(paths[0] if paths else "runs"))
    if watch is None:
        print("\n\n".join(render(f) for f in folders))
        return 0
    try:
        while True:
            screen = "\n\n".join(render(f) for f in folders)
            sys.stdout.write("\033[H\033[2J" + screen + f"\n\n(refreshing every {watch:g} s; "
                             "Ctrl-C stops)\n")
            sys.stdout.flush()
            time.sleep(watch)
    except KeyboardInterrupt:
        return 0
