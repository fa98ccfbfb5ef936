"""A sweep's plan: the printed plan, the runs left, standalone commands, the plan file."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import fields
from pathlib import Path

from .. import backends, files, forecast, interrupts, memory, provenance
from ..bench.step import Spec, StepFailed, measure_together
from ..config import TrainConfig, model_args
from ..data.tokenizer import VOCAB_BY_TOKENIZER
from ..errors import UsageError
from ..parameters import count_params, flops_per_token
from ..progress import format_seconds
from ..run_folder import SweepFolder
from .adaptive import compared_arms, extra_runs, extra_seeds
from .config import SweepConfig, grid, groups, run_config
from .refine import run_outcome

def step_speed(cfg: TrainConfig, vocab: int, jobs: int = 1) -> tuple[float, int]:
    """(tokens/s of each, steps timed) of `jobs` runs of the engine trained at once, as a
    sweep's processes train them: each in a fresh process at its share of the machine, two
    warm-up steps (compilation, first allocations), then 3 s of steps (at least 10)."""
    backends.load(cfg.backend)  # here first: a missing engine is named before any process
    spec = Spec(config=dataclasses.asdict(cfg), vocab=vocab, seconds=3.0, min_steps=10)
    try:
        results = measure_together(spec, processes=jobs, timeout=600)
    except StepFailed as e:
        raise UsageError(f"timing a run here failed: {e}") from None
    return (sum(r["tokens_per_s"] for r in results) / len(results),
            min(r["steps"] for r in results))


def timed(label: str, cfg: TrainConfig, vocab: int, **limits) -> tuple[float, int]:
    print(label + " ...", end="", flush=True)
    try:
        return step_speed(cfg, vocab, **limits)
    finally:
        print("\r\033[K" if sys.stdout.isatty() else "\n", end="")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 seed', '3 seeds', '1 process', '2 processes'."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def extras_text(sweep: SweepConfig) -> str:
    compared = len(compared_arms(sweep)) * len(sweep.depth)
    crossing = compared * sweep.threshold_steps * len(sweep.seeds) * 2 if sweep.refine else 0
    cells = compared * (len(sweep.grid_lrs()) + (sweep.threshold_steps if sweep.refine else 0))
    seeds = cells * len(extra_seeds(sweep)) * 2
    return "; ".join([
        f"bisection of the seed-mean crossing: up to {counted(crossing, 'run')} "
        f"({sweep.threshold_steps} steps per depth, every seed, both arms)" if crossing
        else "no bisection of the seed-mean crossing",
        f"adaptive seeds: up to {counted(seeds, 'run')} (seeds "
        f"{', '.join(map(str, extra_seeds(sweep)))}, only for (depth, LR) cells still undecided, "
        f"up to max_seeds={sweep.max_seeds})" if seeds else "no adaptive seeds"])


def device_text(t: TrainConfig) -> str:
    """The backend and the device a run of `t` trains on here, or why it cannot train here."""
    try:  # UsageError: not installed here, or no such device
        device = backends.load(t.backend).device(t)
    except UsageError as e:
        return f"{t.backend}: {e}"
    where = f"{device} ({provenance.chip()}, {os.cpu_count()} cores)" if device == "cpu" else device
    if t.backend == "torch":
        return f"torch on {where}, {t.precision}" + (", compiled" if t.compile else "")
    return f"mlx on {where}"


def describe(sweep: SweepConfig, runs: list[TrainConfig], calibrate_speed: bool
             ) -> dict[int, float]:
    data, meta = sweep.train.data, files.read_json(Path(sweep.train.data) / "meta.json") or {}
    vocab = int(meta["vocab_size"]) if "vocab_size" in meta else VOCAB_BY_TOKENIZER.get(
        Path(data).name.rsplit("-", 1)[-1])  # else assumed from the folder's name
    vocab_from = ("meta.json" if "vocab_size" in meta else f"assumed from the name; {data} is "
                  "not prepared yet" if vocab else f"{data} is not prepared yet")
    needs = plan_memory(sweep, vocab)  # refuses the whole plan before anything is printed
    unfinished = [c for c in runs if not run_outcome(c).finished]
    refine_max = len(groups(sweep)) * sweep.refine_steps if sweep.refine else 0
    t = sweep.train
    print(f"sweep {sweep.name} (preset {sweep.preset}): {counted(len(runs), 'grid run')} = "
          f"{counted(len(sweep.grid_lrs()), 'LR')} x {counted(len(sweep.arms), 'arm')} x "
          f"{counted(len(sweep.seeds), 'seed')} x {counted(len(sweep.depth), 'depth')}"
          + (f", + up to {counted(refine_max, 'refinement run')} ({sweep.refine_steps} per "
             f"curve, to within x{sweep.refine_factor:g})" if refine_max else ", no refinement"))
    print(f"  folder      {Path(sweep.runs_dir) / sweep.name}  ({len(runs) - len(unfinished)} of "
          f"{len(runs)} grid runs already finished)")
    print(f"  LRs         {' '.join(f'{lr:.3g}' for lr in sweep.grid_lrs())}")
    print(f"  after grid  {extras_text(sweep)}")
    print(f"  arms        {', '.join(sweep.arms)};  seeds {', '.join(map(str, sweep.seeds))}")
    print(f"  backend     {device_text(t)}"
          + (f" (backend=auto: {sweep.backend_why})" if sweep.backend_why else ""))
    print(f"  model       d_model {t.d_model}, {t.n_heads} heads (head_dim {t.head_dim}), "
          f"block {t.block_size}, bias {t.bias}, data {t.data} (vocab "
          f"{vocab if vocab else '?'}, {vocab_from})")
    print(f"  run         {t.steps:,} steps x {t.tokens_per_step:,} tokens = "
          f"{t.steps * t.tokens_per_step:,} tokens; warmup {t.warmup_steps}, eval every "
          f"{t.eval_every}, probes every {t.probe_every}, checkpoint every {t.ckpt_every}")
    cfgs = {d: run_config(sweep, d, sweep.train.lr, sweep.arms[-1], 0) for d in sweep.depth}
    speeds: dict[int, float] = {}
    for depth, cfg in cfgs.items():
        line = f"  depth {depth:<5} "
        if vocab:
            p = count_params(model_args(cfg, vocab))
            line += (f"{p['total'] / 1e6:.2f}M parameters ({p['non_embedding'] / 1e6:.2f}M "
                     f"non-embedding); memory ~{memory.format_bytes(needs[depth])} a run")
        if calibrate_speed and vocab:
            speeds[depth], n = timed(line + "; calibrating (compile, then 3 s of steps)", cfg,
                                     vocab, jobs=sweep.jobs)
            line += (f"; {speeds[depth]:,.0f} tok/s ({counted(n, 'timed step')}); "
                     f"{format_seconds(forecast.run_cost_tokens(cfg) / speeds[depth])} a run")
        print(line, flush=True)
    if not vocab:
        print(f"  time        not estimated: {vocab_from}")
        return speeds
    print_time(sweep, cfgs, vocab, unfinished, refine_max, speeds)
    return speeds


def print_time(sweep: SweepConfig, cfgs: dict[int, TrainConfig], vocab: int,
               unfinished: list[TrainConfig], refine_max: int, calibrated: dict[int, float]
               ) -> None:
    if calibrated:
        per_depth, source = calibrated, ("tok/s timed here for every depth (--calibrate)"
                                         + forecast.busy_note())
    else:
        per_depth, source = plan_speeds(cfgs, vocab, sweep.jobs)
    total = forecast.run_seconds(unfinished, per_depth) / sweep.jobs
    refine = [run_config(sweep, d, 1.0, "none", 0) for d in sweep.depth]
    per_refine = forecast.run_seconds(refine, per_depth) / len(refine)
    print(f"  time        ~{forecast.time_text(total)} for the "
          f"{counted(len(unfinished), 'unfinished grid run')} in "
          f"{counted(sweep.jobs, 'process', 'processes')}"
          + (f", + up to {forecast.time_text(refine_max * per_refine / sweep.jobs)} of refinement"
             if refine_max else "")
          + " (training and evaluation; diverged runs stop early; probes and checkpoints "
          f"not counted); {source}", flush=True)
    alarm = forecast.warning(total, sweep.train, sweep.preset)
    if alarm:
        print(f"  warning     {alarm}", flush=True)


def plan_speeds(cfgs: dict[int, TrainConfig], vocab: int, jobs: int
                ) -> tuple[dict[int, float], str]:
    """A plan's tokens/s without --calibrate: the bench's figure, a short timing, or FLOPs."""
    found, why = forecast.from_bench(cfgs, vocab)
    if why:
        print(f"  note        {why}")
    if found:
        return found
    depth, cfg = next(iter(cfgs.items()))
    try:
        tok_s, steps = timed(f"  time        timing depth {depth} here (compile, then 3 s of "
                             "steps)", cfg, vocab, jobs=jobs)
    except (UsageError, ImportError) as e:  # no engine installed here
        if isinstance(e, ImportError) and interrupts.caused_by_interrupt(e):
            raise
        peak = forecast.sgemm_gflops(n=1024, repeats=2)
        tok_s = peak * 1e9 * forecast.CPU_SHARE / flops_per_token(model_args(cfg, vocab))
        return forecast.scaled(cfgs, vocab, tok_s, cfg), (
            f"tok/s from the FLOP model: {forecast.CPU_SHARE:.0%} of numpy's float32 matmul peak "
            f"here ({peak:,.0f} GFLOP/s), not timed ({e})")
    others = " scaled by FLOPs per token to the other depths" if len(cfgs) > 1 else ""
    return forecast.scaled(cfgs, vocab, tok_s, cfg), (
        f"tok/s from a short timing here (depth {depth}, {counted(steps, 'step')}){others}; "
        "--calibrate times every depth" + forecast.busy_note())


def plan_memory(sweep: SweepConfig, vocab: int | None) -> dict[int, float]:
    """Each depth's estimated peak bytes a run; UsageError when `jobs` runs would not fit."""
    if not vocab:  # the data is not prepared: the sweep stops on that before training anyway
        return {}
    gpu = backends.device_memory(sweep.train, runs=sweep.jobs) \
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
    """A standalone `train` command of the keys off the defaults, and backend: this run_id."""
    default = TrainConfig()
    words = [shlex.quote(f"{f.name}={value_text(getattr(cfg, f.name))}") for f in fields(cfg)
             if getattr(cfg, f.name) != getattr(default, f.name) or f.name == "backend"]
    return f"{shlex.quote(sys.executable)} -m qkstudy train " + " ".join(words)


def remaining_runs(sweep: SweepConfig) -> tuple[list[TrainConfig], list[TrainConfig]]:
    """(grid runs without a finished result, the runs the results call for after the grid)."""
    todo = [c for c in grid(sweep) if not run_outcome(c).finished]
    return todo, extra_runs(sweep, groups(sweep)) if not todo else []


def declare_grid(sweep: SweepConfig, speeds: dict[int, float] | None = None) -> None:
    """Write sweep.json: the grid and axes (united with earlier ones'); and this machine's
    calibrated tokens/s when measured (the speeds file of its host)."""
    folder = SweepFolder(Path(sweep.runs_dir) / sweep.name)
    files.make_folder(folder.path, "sweep folder")
    earlier = folder.read_plan()

    def union(key: str, values) -> list:
        return sorted(set(earlier.get(key, [])) | set(values))

    files.write_json(folder.plan_file, {
        "grid_lrs": union("grid_lrs", sweep.grid_lrs()), "preset": sweep.preset,
        "depths": union("depths", sweep.depth), "seeds": union("seeds", sweep.seeds),
        "arms": union("arms", sweep.arms), "refine": sweep.refine,
        "refine_steps": sweep.refine_steps, "refine_factor": sweep.refine_factor,
        "threshold_steps": sweep.threshold_steps, "max_seeds": sweep.max_seeds,
        "min_gap": sweep.min_gap})
    if speeds:
        folder.write_speeds(speeds)
