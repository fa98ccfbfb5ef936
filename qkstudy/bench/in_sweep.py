"""`python -m qkstudy bench-sweep [key=value ...]`: each engine's training speed inside a real
sweep against the bench's for the same shape and process count, at a low and a high LR.

Per backend, side by side in one run: the bench's step (qkstudy/bench/step.py: the engine's
compiled step on one random batch, `jobs` processes at once, median of `rounds`), then a real
sweep of the demo preset (both arms, 2 seeds, the given LRs, `jobs` processes, no refinement)
into a temporary folder. From each run's summary: its training loop's tokens/s (train_seconds:
the update steps, their data batches and the loss read-backs; evaluation and probes are
measure_seconds, checkpoints neither) and its whole-run tokens/s (wall_seconds: everything from
start to the final write). The table gives,
per LR, the median in-sweep tokens/s a process against the bench's, and where the rest of a
run's time went. Exit 1 when some LR's training loop is more than `tolerance` below the bench,
or when anything failed.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import files
from ..run_folder import run_folders
from ..cli import keys_usage
from ..config import apply_overrides, split_key_values
from ..errors import UsageError
from .plan import BACKENDS, LABEL, names_of, writable_folder
from .shapes import preset_base, preset_shape, shape_config
from .step import ROOT, Spec, StepFailed, measure_together


@dataclasses.dataclass(frozen=True)
class SweepBenchConfig:
    backends: str = "mlx,torch"
    lrs: str = "0.001,0.1"  # a low LR and a high one (the off arm saturates there)
    jobs: int = 2  # sweep processes, and the bench's processes at once
    rounds: int = 3  # the bench's rounds (median)
    seconds: float = 5.0  # the bench's timed window a round
    max_steps: int = 0  # > 0: shorter sweep runs than the demo's (a smoke test)
    tolerance: float = 0.15  # the largest shortfall of the training loop against the bench
    out: str = "reports"


USAGE = keys_usage(
    "python -m qkstudy bench-sweep [key=value ...]",
    "The training speed of a real demo sweep's runs against the bench's step, per engine and\n"
    "LR, measured side by side (qkstudy/bench/in_sweep.py). Writes <out>/in-sweep.md and\n"
    "<out>/in-sweep.json; exits 1 when a training loop is more than `tolerance` below the bench.",
    SweepBenchConfig)


def bench_tokens_per_s(backend: str, processes: int, rounds: int, seconds: float) -> list[float]:
    """The bench's tokens/s a process at the demo shape, one value per round."""
    shape = preset_shape("demo")
    cfg, _ = shape_config(shape, preset_base("demo"), backend=backend)
    spec = Spec(config=dataclasses.asdict(cfg), vocab=shape["vocab"], seconds=seconds)
    out = []
    for _ in range(rounds):
        results = measure_together(spec, processes)
        out.append(statistics.median(r["tokens_per_s"] for r in results))
    return out


def sweep_summaries(backend: str, lrs: list[float], jobs: int, max_steps: int,
                    folder: Path) -> tuple[list[dict], float]:
    """Every run summary of one demo sweep at `lrs`, and the sweep's wall seconds."""
    words = ["preset=demo", f"backend={backend}", f"lrs={','.join(map(repr, lrs))}",
             "seeds=0,1", f"jobs={jobs}", "refine=false", "threshold_steps=0", "max_seeds=0",
             f"runs_dir={folder}", "name=in-sweep"]
    if max_steps:
        words += [f"max_steps={max_steps}", f"eval_every={max_steps}",
                  f"probe_every={max_steps}", f"ckpt_every={max_steps}", "log_every=1",
                  f"warmup_steps={min(10, max_steps)}"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qkstudy", "sweep", *words], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StepFailed(f"the {backend} sweep exited {done.returncode}: {tail[0]}")
    summaries = [run.read_summary() for run in run_folders(folder / "in-sweep")]
    return [s for s in summaries if s and s.get("status") == "completed"], wall


def compare(summaries: list[dict], bench: list[float]) -> list[dict]:
    """Per LR: the runs' median training-loop and whole-run tokens/s, each against the bench's
    median a process, and the median shares of a run's wall time spent on evaluation and
    probes and on neither (rows and checkpoint writes, the final evaluation's set-up)."""
    reference = statistics.median(bench)
    rows = []
    for lr in sorted({s["lr"] for s in summaries}):
        mine = [s for s in summaries if s["lr"] == lr]
        train = statistics.median(s["tokens_per_second"] for s in mine)
        whole = statistics.median(s["tokens_seen"] / s["wall_seconds"] for s in mine)
        measuring = statistics.median(s.get("measure_seconds", 0.0) / s["wall_seconds"]
                                      for s in mine)
        other = statistics.median(
            1 - (s["train_seconds"] + s.get("measure_seconds", 0.0)) / s["wall_seconds"]
            for s in mine)
        rows.append({"lr": lr, "runs": len(mine), "train_tokens_per_s": train,
                     "run_tokens_per_s": whole, "bench_tokens_per_s": reference,
                     "train_ratio": train / reference, "run_ratio": whole / reference,
                     "measure_share": measuring, "other_share": other,
                     "train_range": [min(s["tokens_per_second"] for s in mine),
                                     max(s["tokens_per_second"] for s in mine)]})
    return rows


def markdown(report: dict) -> str:
    lines = [f"In-sweep speed against the bench ({report['jobs']} processes, demo shape, "
             f"tolerance {report['tolerance']:.0%}):", "",
             "| engine | LR | runs | bench tok/s a process (median of rounds) | training loop "
             "tok/s (median, range) | loop / bench | whole run tok/s | run / bench | a run's "
             "wall on eval + probes | on neither | sweep wall (outside any run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for backend, entry in report["engines"].items():
        if "error" in entry:
            lines.append(f"| {LABEL[backend]} | failed: {entry['error']} |" + " |" * 9)
            continue
        for r in entry["rows"]:
            lo, hi = r["train_range"]
            lines.append(
                f"| {LABEL[backend]} | {r['lr']:g} | {r['runs']} | "
                f"{r['bench_tokens_per_s']:,.0f} | {r['train_tokens_per_s']:,.0f} "
                f"({lo:,.0f}-{hi:,.0f}) | {r['train_ratio']:.2f} | {r['run_tokens_per_s']:,.0f} | "
                f"{r['run_ratio']:.2f} | {r['measure_share']:.0%} | {r['other_share']:.0%} | "
                f"{entry['sweep_wall_s']:.0f} s ({entry['outside_runs_share']:.0%}) |")
    return "\n".join(lines)


def run(cfg: SweepBenchConfig) -> dict:
    backends = names_of(cfg.backends, "backends", BACKENDS)
    try:
        lrs = [float(v) for v in cfg.lrs.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"lrs must be numbers, got {cfg.lrs!r}") from None
    if not lrs or cfg.jobs < 1 or cfg.rounds < 1 or not 0 < cfg.tolerance < 1:
        raise UsageError("bench-sweep needs lrs, jobs >= 1, rounds >= 1 and 0 < tolerance < 1")
    writable_folder(cfg.out)
    report: dict = {"jobs": cfg.jobs, "tolerance": cfg.tolerance, "lrs": lrs, "engines": {}}
    for backend in backends:
        print(f"{LABEL[backend]}: the bench's step, {cfg.jobs} process(es), {cfg.rounds} "
              "round(s) ...", flush=True)
        try:
            bench = bench_tokens_per_s(backend, cfg.jobs, cfg.rounds, cfg.seconds)
            print(f"{LABEL[backend]}: a demo sweep at LRs {', '.join(map(str, lrs))} ...",
                  flush=True)
            with tempfile.TemporaryDirectory(prefix="qkstudy-in-sweep-") as tmp:
                summaries, wall = sweep_summaries(backend, lrs, cfg.jobs, cfg.max_steps,
                                                  Path(tmp))
        except StepFailed as e:
            report["engines"][backend] = {"error": str(e)}
            continue
        runs_wall = sum(s["wall_seconds"] for s in summaries)
        report["engines"][backend] = {
            "bench_tokens_per_s": bench, "sweep_wall_s": wall, "rows": compare(summaries, bench),
            # the sweep's time outside any run: planning, process starts, imports, the report
            "outside_runs_share": max(0.0, 1 - runs_wall / (cfg.jobs * wall))}
    return report


def failures(report: dict) -> list[str]:
    """What makes the check fail: an engine that failed, a missing LR, a slow training loop."""
    out = []
    for backend, entry in report["engines"].items():
        if "error" in entry:
            out.append(f"{backend}: {entry['error']}")
            continue
        seen = {r["lr"] for r in entry["rows"]}
        out += [f"{backend}: no completed run at LR {lr:g}" for lr in report["lrs"]
                if lr not in seen]
        out += [f"{backend} at LR {r['lr']:g}: training loop {r['train_ratio']:.2f}x the bench"
                for r in entry["rows"] if r["train_ratio"] < 1 - report["tolerance"]]
    return out


def cli(argv: list[str]) -> int:
    cfg = apply_overrides(SweepBenchConfig(), split_key_values(argv))
    report = run(cfg)
    text = markdown(report)
    print(text)
    out = Path(cfg.out)
    files.write_json(out / "in-sweep.json", report)
    files.write_text(out / "in-sweep.md", text + "\n")
    bad = failures(report)
    for line in bad:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if bad else 0
