"""The plan of a sweep: its runs in training order, the curves refined on their own, the
printed plan with calibrated time estimates, standalone commands and sweep.json."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from .. import backends, files, memory, trainer
from ..bench.shapes import random_batch
from ..errors import UsageError
from ..config import TrainConfig, model_args
from ..parameters import count_params
from ..progress import format_seconds
from .adaptive import compared_arms, extra_runs, extra_seeds
from . import estimate
from .config import SweepConfig, grid, groups, run_config
from .refine import run_outcome

# --- plan printing, calibration -----------------------------------------------------------------

VOCAB_BY_SUFFIX = {"gpt2": 50257, "bytes": 257}


def vocab_size(data: str) -> tuple[int | None, str]:
    """The data's vocabulary size and where it came from (meta.json, or the folder's name)."""
    meta = files.read_json(Path(data) / "meta.json")
    if meta and "vocab_size" in meta:
        return int(meta["vocab_size"]), "meta.json"
    suffix = Path(data).name.rsplit("-", 1)[-1]
    if suffix in VOCAB_BY_SUFFIX:
        return VOCAB_BY_SUFFIX[suffix], f"assumed from the name; {data} is not prepared yet"
    return None, f"{data} is not prepared yet"


def param_counts(cfg: TrainConfig, vocab: int) -> dict[str, int]:
    return count_params(model_args(cfg, vocab))


def step_speed(cfg: TrainConfig, vocab: int, steps: int = 3, max_seconds: float = 10.0
                ) -> tuple[float, int]:
    """(tokens/s, steps timed) of the run's own train step (its backend's Engine) at this exact
    shape, on a random batch, after one warm-up step (which compiles); up to `steps` of them,
    fewer once `max_seconds` have passed. The benchmarks time the same step longer
    (qkstudy/bench/step.py)."""
    x, y = random_batch(cfg, vocab, 0)
    engine = backends.load(cfg.backend).Engine(cfg, vocab, [], random_batch(cfg, vocab, 1))
    engine.read([engine.step(x, y)])
    start, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - start < max_seconds):
        engine.read([engine.step(x, y)])
        timed += 1
    return timed * cfg.tokens_per_step / (time.perf_counter() - start), timed


def run_cost_tokens(cfg: TrainConfig) -> float:
    """Train tokens plus evaluation, counted as train-step equivalents (a forward ~ 1/3 step)."""
    evals = cfg.steps // cfg.eval_every + 1
    return cfg.tokens_per_step * (cfg.steps + evals * cfg.eval_batches / 3)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 seed', '3 seeds', '1 process', '2 processes'."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def lr_text(lrs: Sequence[float]) -> str:
    return " ".join(f"{lr:.3g}" for lr in lrs)


def extras_text(sweep: SweepConfig) -> str:
    """What the sweep may add once the grid is done, with upper bounds (sweep/adaptive.py)."""
    compared = len(compared_arms(sweep)) * len(sweep.depth)
    threshold = compared * sweep.threshold_steps * len(sweep.seeds) * 2 if sweep.refine else 0
    cells = compared * (len(sweep.grid_lrs()) + (sweep.threshold_steps if sweep.refine else 0))
    seeds = cells * len(extra_seeds(sweep)) * 2
    parts = [f"threshold bisection: up to {counted(threshold, 'run')} "
             f"({sweep.threshold_steps} steps per depth, every seed, both arms)" if threshold
             else "no threshold bisection",
             f"adaptive seeds: up to {counted(seeds, 'run')} (seeds "
             f"{', '.join(map(str, extra_seeds(sweep)))}, only for (depth, LR) cells still "
             f"undecided, up to max_seeds={sweep.max_seeds})" if seeds else "no adaptive seeds"]
    return "; ".join(parts)


def describe(sweep: SweepConfig, runs: list[TrainConfig], calibrate_speed: bool) -> dict[int, float]:
    """Print the plan; returns the calibrated tokens/s per depth (empty if not calibrated)."""
    t = sweep.train
    vocab, vocab_from = vocab_size(t.data)
    memory_needs = plan_memory(sweep, vocab)  # refuses the whole plan before anything is printed
    unfinished = [c for c in runs if not run_outcome(c).finished]
    n_groups = len(groups(sweep))
    refine_max = n_groups * sweep.refine_steps if sweep.refine else 0
    print(f"sweep {sweep.name} (preset {sweep.preset}): {counted(len(runs), 'grid run')} = "
          f"{counted(len(sweep.grid_lrs()), 'LR')} x {counted(len(sweep.arms), 'arm')} x "
          f"{counted(len(sweep.seeds), 'seed')} x {counted(len(sweep.depth), 'depth')}"
          + (f", + up to {counted(refine_max, 'refinement run')} "
                                       f"({sweep.refine_steps} per curve, to within x{sweep.refine_factor:g})"
                                       if refine_max else ", no refinement"))
    print(f"  folder      {Path(sweep.runs_dir) / sweep.name}  ({len(runs) - len(unfinished)} of "
          f"{len(runs)} grid runs already finished)")
    print(f"  LRs         {lr_text(sweep.grid_lrs())}")
    print(f"  after grid  {extras_text(sweep)}")
    print(f"  arms        {', '.join(sweep.arms)};  seeds {', '.join(map(str, sweep.seeds))}")
    print(f"  backend     {estimate.device_text(t)}"
          + (f" (backend=auto: {sweep.backend_why})" if sweep.backend_why else ""))
    print(f"  model       d_model {t.d_model}, {t.n_heads} heads (head_dim {t.head_dim}), "
          f"block {t.block_size}, bias {t.bias}, data {t.data} (vocab "
          f"{vocab if vocab else '?'}, {vocab_from})")
    print(f"  run         {t.steps:,} steps x {t.tokens_per_step:,} tokens = "
          f"{t.steps * t.tokens_per_step:,} tokens; warmup {t.warmup_steps}, eval every "
          f"{t.eval_every}, probes every {t.probe_every}, checkpoint every {t.ckpt_every}")
    speeds: dict[int, float] = {}
    cfgs = {depth: run_config(sweep, depth, t.lr, sweep.arms[-1], 0) for depth in sweep.depth}
    for depth, cfg in cfgs.items():
        line = f"  depth {depth:<5} "
        if vocab:
            p = param_counts(cfg, vocab)
            line += f"{p['total'] / 1e6:.2f}M parameters ({p['non_embedding'] / 1e6:.2f}M non-embedding)"
            line += f"; memory ~{memory.format_bytes(memory_needs[depth])} a run"
        if calibrate_speed and vocab:
            print(line + "; calibrating (compile, then up to 10 s of steps) ...", end="",
                  flush=True)
            speeds[depth], timed = step_speed(cfg, vocab)
            print("\r\033[K" if sys.stdout.isatty() else "\n", end="")
            line += (f"; {speeds[depth]:,.0f} tok/s ({counted(timed, 'timed step')}); "
                     f"{format_seconds(run_cost_tokens(cfg) / speeds[depth])} a run")
        print(line, flush=True)
    source = "tok/s timed here for every depth (--calibrate)"
    if not vocab:
        print(f"  time        not estimated: {vocab_from}")
        return speeds
    if not speeds:
        found, why = estimate.from_bench(cfgs, vocab)
        if why:
            print(f"  note        {why}")
        if not found:
            done = "\r\033[K" if sys.stdout.isatty() else "\n"
            print(f"  time        timing depth {sweep.depth[0]} here (compile, then a step or "
                  "two) ...", end="", flush=True)
            try:
                found = estimate.from_short_timing(cfgs, vocab, step_speed)
            except UsageError as e:  # the backend is not installed here
                print(f"{done}  time        not estimated: {e}")
                return speeds
            print(done, end="")
        plan_speeds, source = found.per_depth, found.source
    else:
        plan_speeds = speeds
    total = sum(run_cost_tokens(c) / plan_speeds[c.depth] for c in unfinished)
    per_refine = sum(run_cost_tokens(run_config(sweep, d, 1.0, "none", 0)) / plan_speeds[d]
                     for d in sweep.depth) / len(sweep.depth)
    print(f"  time        ~{estimate.time_text(total)} for the "
          f"{counted(len(unfinished), 'unfinished grid run')} in one process"
          + (f" (jobs={sweep.jobs} shares them out; what that gains depends on the machine: "
             "docs/performance.md)" if sweep.jobs > 1 else "")
          + (f", + up to {estimate.time_text(refine_max * per_refine)} "
                          f"of refinement" if refine_max else "")
          + " (training and evaluation; diverged runs stop early; probes and checkpoints "
          f"not counted); {source}"
          + (estimate.busy_note() if "bench's stored figure" not in source else ""), flush=True)
    alarm = estimate.warning(total, t, sweep.preset)
    if alarm:
        print(f"  warning     {alarm}", flush=True)
    return speeds
    return speeds


def plan_memory(sweep: SweepConfig, vocab: int | None) -> dict[int, float]:
    """Each depth's estimated peak bytes a run (qkstudy/memory.py); UsageError, before the first
    run and before calibration, when `jobs` runs of a depth at once would not fit."""
    if not vocab:  # the data is not prepared: the sweep stops on that before training anyway
        return {}
    # on a GPU each run is checked against its share of it (the most shared GPU's), else the
    # `jobs` runs at once against the machine's memory
    gpu = trainer.device_memory(sweep.train, runs=sweep.jobs) \
        if sweep.train.backend == "torch" and sweep.train.device in ("auto", "cuda") else None
    limit, at_once = (gpu, 1) if gpu else (memory.available(), sweep.jobs)
    return {depth: memory.check(run_config(sweep, depth, sweep.train.lr, sweep.arms[-1], 0),
                                vocab, runs_at_once=at_once, limit=limit,
                                prefix=f"sweep {sweep.name}, depth {depth}: ").total
            for depth in sweep.depth}


def value_text(value: object) -> str:
    """A value as `parse_train_config` reads it back exactly (repr round-trips floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def command_line(cfg: TrainConfig) -> str:
    """A standalone `train` command for this run with this environment's interpreter: the keys
    that differ from TrainConfig's defaults, which rebuild exactly this config and run_id."""
    default = TrainConfig()  # backend always written: auto may choose otherwise where it runs
    words = [shlex.quote(f"{f.name}={value_text(getattr(cfg, f.name))}") for f in fields(cfg)
             if getattr(cfg, f.name) != getattr(default, f.name) or f.name == "backend"]
    return f"{shlex.quote(sys.executable)} -m qkstudy train " + " ".join(words)


def remaining_runs(sweep: SweepConfig) -> tuple[list[TrainConfig], list[TrainConfig]]:
    """(grid runs without a finished result, the runs the results on disk now call for once the
    grid is done: boundary or threshold refinement, adaptive seeds; sweep/adaptive.py)."""
    todo = [c for c in grid(sweep) if not run_outcome(c).finished]
    return todo, extra_runs(sweep, groups(sweep)) if not todo else []


def declare_grid(sweep: SweepConfig, speeds: dict[int, float] | None = None) -> None:
    """Write <runs_dir>/<name>/sweep.json: the base LR grid (so the analysis can tell grid runs
    from refinement runs) and the sweep's axes. Grids of earlier sweeps into the same folder
    are kept (union). `speeds`: the tokens/s per depth calibrated at the start (`just status`
    estimates the time left from them until runs of a depth finish)."""
    folder = Path(sweep.runs_dir) / sweep.name
    trainer.make_folder(folder, "sweep folder")
    earlier = files.read_json(folder / "sweep.json") or {}
    files.write_json(folder / "sweep.json", {
        "grid_lrs": sorted(set(earlier.get("grid_lrs", [])) | set(sweep.grid_lrs())),
        "preset": sweep.preset, "depths": sorted(set(earlier.get("depths", [])) | set(sweep.depth)),
        "seeds": sorted(set(earlier.get("seeds", [])) | set(sweep.seeds)),
        "arms": sorted(set(earlier.get("arms", [])) | set(sweep.arms)),
        "refine": sweep.refine, "refine_steps": sweep.refine_steps, "refine_factor": sweep.refine_factor,
        "threshold_steps": sweep.threshold_steps, "max_seeds": sweep.max_seeds,
        "min_gap": sweep.min_gap,
        "calibrated_tokens_per_s": {str(d): v for d, v in (speeds or {}).items()}
        or earlier.get("calibrated_tokens_per_s", {}),
    })
