"""`python -m mlx_gpt sweep [key=value ...]`: QK-norm x learning rate x seed (x depth) grids.

A sweep is a preset (a frozen `SweepConfig`) crossed with key=value overrides. It expands to a
list of independent `TrainConfig`s, each content addressed by its run_id, and trains them one
after another under <runs_dir>/<name>/<run_id>/:

- finished runs are skipped and interrupted ones resume from their checkpoint (train.train);
- a run held by another process (its lock) is passed over and looked at again at the end, so
  several sweep processes on one runs/ tree share the work and never train a run twice;
- a run that raises is recorded as failed by train.train and the sweep goes on;
- after the grid, boundary refinement bisects (in log space) between the largest stable and the
  smallest diverged LR of each (depth, qk_norm, seed), so the max stable LR is known to within
  `refine_factor`. Every refinement point is a pure function of the results before it, so any
  process (or machine) that sees the same results asks for the same next run.

`--emit-commands` prints each remaining run as a standalone `python -m mlx_gpt train` command.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import get_args

from . import runlog
from . import train as trainer
from .config import QKNorm, TrainConfig, apply_overrides, split_key_values
from .errors import UsageError
from .locks import RunBusy

# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep. Keys not named here are TrainConfig keys, forwarded into every run."""

    preset: str = "study"
    name: str = "study"  # the sweep folder: <runs_dir>/<name>/<run_id>
    depth: tuple[int, ...] = (6,)
    lrs: tuple[float, ...] = ()  # an explicit LR list; empty -> the log grid below
    lr_min: float = 3e-4
    lr_max: float = 3e-1
    points_per_decade: float = 2.0  # Wortsman et al. 2023 sweep LRs in half-decades
    seeds: tuple[int, ...] = (0, 1)
    qk_norms: tuple[str, ...] = ("none", "rmsnorm")
    refine: bool = True
    refine_steps: int = 2  # bisection steps per (depth, qk_norm, seed)
    refine_factor: float = 1.4  # stop once largest stable / smallest diverged LR are this close
    runs_dir: str = "runs"
    jobs: int = 1  # sweep processes on this machine (they share work through run locks)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> SweepConfig:
        if self.preset not in PRESETS:
            raise UsageError(f"unknown preset {self.preset!r}; known: {', '.join(PRESETS)}")
        checks = [
            (bool(self.depth), "depth needs at least one value"),
            (bool(self.seeds), "seeds needs at least one value"),
            (bool(self.qk_norms), "qk_norms needs at least one value"),
            (self.lr_min > 0, f"lr_min must be > 0, got {self.lr_min}"),
            (self.lr_min < self.lr_max, f"lr_min={self.lr_min:g} must be below lr_max={self.lr_max:g}"),
            (self.points_per_decade > 0, f"points_per_decade must be > 0, got {self.points_per_decade}"),
            (all(lr > 0 for lr in self.lrs), "every value in lrs must be > 0"),
            (self.refine_steps >= 0, f"refine_steps must be >= 0, got {self.refine_steps}"),
            (self.refine_factor > 1, f"refine_factor must be > 1, got {self.refine_factor}"),
            (self.jobs >= 1, f"jobs must be >= 1, got {self.jobs}"),
            ("/" not in self.name and self.name not in ("", ".", ".."),
             f"name must be a plain folder name, got {self.name!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        return self

    def grid_lrs(self) -> list[float]:
        if self.lrs:
            return sorted(set(self.lrs))
        return log_grid(self.lr_min, self.lr_max, self.points_per_decade)


def three_significant(x: float) -> float:
    """Round to 3 significant digits so LRs read well in names and tables (3e-4, 9.49e-4)."""
    return float(f"{x:.3g}")


def log_grid(lr_min: float, lr_max: float, points_per_decade: float) -> list[float]:
    """lr_min * 10**(i / points_per_decade) up to lr_max (inclusive), rounded to 3 digits."""
    if not (0 < lr_min < lr_max and points_per_decade > 0):
        return []
    n = math.floor(math.log10(lr_max / lr_min) * points_per_decade + 1e-9)
    lrs = [three_significant(lr_min * 10 ** (i / points_per_decade)) for i in range(n + 1)]
    if points_per_decade == 2:  # Wortsman et al.'s half-decades are written 1, 3, 10, 30, ...
        lrs = [one_three(lr) for lr in lrs]
    return lrs


def one_three(lr: float) -> float:
    """Snap a half-decade point to the 1-3-10 series when it lies within 6% of it."""
    exponent = math.floor(math.log10(lr))
    for mantissa in (1, 3, 10):
        nice = float(f"{mantissa}e{exponent}")
        if abs(lr / nice - 1) < 0.06:
            return nice
    return lr


# The study's plan: a plain nanoGPT of ~12M parameters (depth 6) with the GPT-2 vocabulary and a
# fixed budget of 100M tokens: 16 x 256 = 4,096 tokens a step, 24,414 steps.
STUDY = SweepConfig(
    preset="study", name="study", depth=(6,), lr_min=3e-4, lr_max=3e-1, points_per_decade=2,
    seeds=(0, 1, 2), qk_norms=("none", "rmsnorm"), refine=True, refine_steps=2, refine_factor=1.4,
    train=TrainConfig(
        data="data/tinystories-gpt2", d_model=192, n_heads=3, block_size=256, batch_size=16,
        budget_tokens=100_000_000, warmup_steps=1000, eval_every=500, eval_batches=20,
        probe_every=250, log_every=10, ckpt_every=1000),
)

# A miniature of the study on the synthetic byte corpus: 5 LRs from safe (1e-3) to divergent
# (1: both arms blow up when warmup ends), both arms, two seeds (the least a paired comparison
# needs: its verdicts can only be "suggestive"), 100 steps of 8 x 64 tokens, divergence judged
# on a 30-step window (a third of the run).
# QK-norm off shows attention-logit growth from 1e-2 up (docs/sweeps.md has the numbers).
DEMO = SweepConfig(
    preset="demo", name="demo", depth=(4,), lr_min=1e-3, lr_max=1.0, points_per_decade=4 / 3,
    seeds=(0, 1), qk_norms=("none", "rmsnorm"), refine=False,
    # a model this small leaves cores idle: two processes finished the demo 1.32x sooner than
    # one on a 2-core CPU (2m02s against 2m41s; `just bench` measured 1.44x in tokens/s)
    jobs=2,
    train=TrainConfig(
        data="data/synthetic-bytes", d_model=128, n_heads=4, block_size=64, batch_size=8,
        max_steps=100, warmup_steps=30, eval_every=25, eval_batches=4, probe_every=25,
        log_every=10, ckpt_every=50, divergence_window=30),
)

PRESETS: dict[str, SweepConfig] = {"study": STUDY, "demo": DEMO}

LIST_KEYS = {"depth": int, "lrs": float, "seeds": int, "qk_norms": str}
# TrainConfig keys the sweep sets itself, with the sweep key to use instead.
GRID_KEYS = {"lr": "lrs (or lr_min, lr_max, points_per_decade)", "seed": "seeds",
             "qk_norm": "qk_norms", "sweep": "name"}


def parse_list(key: str, text: str, kind: type) -> tuple:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{key} needs at least one value")
    out = []
    for item in items:
        if kind is str:
            choices = get_args(QKNorm)
            if item not in choices:
                raise UsageError(f"{key}: {item!r} is not one of {', '.join(choices)}")
            out.append(item)
            continue
        try:
            value = float(item)
        except ValueError:
            raise UsageError(f"{key}: {item!r} is not a number") from None
        if kind is int:
            if value != int(value):
                raise UsageError(f"{key}: {item!r} is not an integer")
            value = int(value)
        out.append(value)
    return tuple(out)


def parse_sweep_config(words: list[str]) -> SweepConfig:
    """Preset (preset=NAME, default study) crossed with key=value overrides, validated."""
    pairs = split_key_values(words)
    preset = pairs.pop("preset", "study")
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = PRESETS[preset]
    sweep_keys = {f.name for f in fields(SweepConfig)} - {"train", "preset"}
    train_keys = {f.name for f in fields(TrainConfig)}
    for key in pairs:
        if key in GRID_KEYS:
            raise UsageError(f"{key} is set by the sweep grid; use {GRID_KEYS[key]}")
        if key not in sweep_keys and key not in train_keys:
            raise UsageError(f"unknown key {key!r}; sweep keys: {', '.join(sorted(sweep_keys))}; "
                             f"run keys: {', '.join(sorted(train_keys - set(GRID_KEYS)))}")
    range_keys = [k for k in ("lr_min", "lr_max", "points_per_decade") if k in pairs]
    if range_keys and "lrs" in pairs:
        raise UsageError(f"give lrs or {'/'.join(range_keys)}, not both")
    lists = {k: parse_list(k, pairs.pop(k), kind) for k, kind in LIST_KEYS.items() if k in pairs}
    if range_keys:
        lists["lrs"] = ()  # a range given here replaces a preset's explicit list
    scalars = {k: pairs.pop(k) for k in list(pairs) if k in sweep_keys}
    sweep = apply_overrides(base, scalars)
    train = apply_overrides(base.train, pairs)  # what is left: TrainConfig keys
    return dataclasses.replace(sweep, train=train, **lists).validate()


# --- the plan -------------------------------------------------------------------------------


def run_config(sc: SweepConfig, depth: int, lr: float, qk_norm: str, seed: int) -> TrainConfig:
    """One run of the sweep. data_seed follows the seed (offset by the base data_seed), so a seed
    replicates all of training's randomness while every LR and arm of one seed is paired."""
    return dataclasses.replace(
        sc.train, depth=depth, lr=lr, qk_norm=qk_norm, seed=seed,
        data_seed=sc.train.data_seed + seed, sweep=sc.name, runs_dir=sc.runs_dir)


def grid(sc: SweepConfig) -> list[TrainConfig]:
    """Grid runs in the order they are trained: seed, then depth, then LR (ascending), with the
    two qk_norm arms of one LR adjacent. A partial night thus holds whole paired LR curves for
    seed 0 at every depth before any run of seed 1 starts."""
    return [run_config(sc, depth, lr, qk, seed)
            for seed in sc.seeds for depth in sc.depth
            for lr in sc.grid_lrs() for qk in sc.qk_norms]


Group = tuple[int, str, int]  # (depth, qk_norm, seed): one LR curve, refined on its own


def groups(sc: SweepConfig) -> list[Group]:
    return [(depth, qk, seed) for seed in sc.seeds for depth in sc.depth for qk in sc.qk_norms]


# --- boundary refinement ----------------------------------------------------------------------


def next_midpoint(results: Mapping[float, bool | None], grid_lrs: Sequence[float], steps: int,
                  factor: float) -> float | None:
    """The next LR to try, or None when the boundary is known well enough.

    `results` maps every LR tried so far to True (stable), False (diverged) or None (failed,
    no verdict). The bracket is [lo, hi]: hi = the smallest diverged LR, lo = the largest stable
    LR below it. The next point is their geometric mean (bisection in log LR), until `steps`
    points off the grid have been tried or hi / lo <= factor.
    """
    on_grid = set(grid_lrs)
    if sum(1 for lr in results if lr not in on_grid) >= steps:
        return None
    diverged = [lr for lr, stable in results.items() if stable is False]
    if not diverged:
        return None
    hi = min(diverged)
    stable_below = [lr for lr, stable in results.items() if stable and lr < hi]
    if not stable_below:
        return None
    lo = max(stable_below)
    if hi / lo <= factor:
        return None
    mid = math.sqrt(lo * hi)
    rounded = three_significant(mid)
    mid = rounded if lo < rounded < hi else mid
    return None if mid in results else mid


def bisect_boundary(grid_lrs: Sequence[float], is_stable: Callable[[float], bool | None],
                    steps: int, factor: float) -> dict[float, bool | None]:
    """Run the whole refinement against a stability oracle; returns every LR asked, in order."""
    results = {lr: is_stable(lr) for lr in grid_lrs}
    while (lr := next_midpoint(results, grid_lrs, steps, factor)) is not None:
        results[lr] = is_stable(lr)
    return results


def verdict(cfg: TrainConfig) -> bool | None | str:
    """True (completed), False (diverged), None (failed) or "pending" (no result yet)."""
    summary = runlog.read_json(trainer.run_dir_of(cfg) / "summary.json") or {}
    return {"completed": True, "diverged": False, "failed": None}.get(summary.get("status"),
                                                                       "pending")


def group_state(sc: SweepConfig, group: Group) -> tuple[dict[float, bool | None], TrainConfig | None]:
    """Replay a group's refinement from the results on disk.

    Returns (results so far, the next run to train or None). The next run is None when the
    group is done or waits on a run without a result (for example one held by another process).
    """
    depth, qk, seed = group
    grid_lrs = sc.grid_lrs()
    results: dict[float, bool | None] = {}
    for lr in grid_lrs:
        v = verdict(run_config(sc, depth, lr, qk, seed))
        if v == "pending":
            return results, None
        results[lr] = v
    while sc.refine and (lr := next_midpoint(results, grid_lrs, sc.refine_steps,
                                             sc.refine_factor)) is not None:
        cfg = run_config(sc, depth, lr, qk, seed)
        v = verdict(cfg)
        if v == "pending":
            return results, cfg
        results[lr] = v
    return results, None


def boundary(results: Mapping[float, bool | None]) -> tuple[float | None, float | None]:
    """(largest stable LR below the smallest diverged one, smallest diverged LR)."""
    diverged = [lr for lr, stable in results.items() if stable is False]
    hi = min(diverged) if diverged else None
    stable = [lr for lr, s in results.items() if s and (hi is None or lr < hi)]
    return (max(stable) if stable else None), hi


# --- plan printing, calibration -----------------------------------------------------------------

VOCAB_BY_SUFFIX = {"gpt2": 50257, "bytes": 257}


def vocab_size(data: str) -> tuple[int | None, str]:
    """The data's vocabulary size and where it came from (meta.json, or the folder's name)."""
    meta = runlog.read_json(Path(data) / "meta.json")
    if meta and "vocab_size" in meta:
        return int(meta["vocab_size"]), "meta.json"
    suffix = Path(data).name.rsplit("-", 1)[-1]
    if suffix in VOCAB_BY_SUFFIX:
        return VOCAB_BY_SUFFIX[suffix], f"assumed from the name; {data} is not prepared yet"
    return None, f"{data} is not prepared yet"


def param_counts(cfg: TrainConfig, vocab: int) -> dict[str, int]:
    from .model import GPT, count_params

    return count_params(GPT(trainer.model_args(cfg, vocab)))  # lazy arrays: nothing computed


def calibrate(cfg: TrainConfig, vocab: int, steps: int = 3, max_seconds: float = 10.0
              ) -> tuple[float, int]:
    """(tokens/s, steps timed): compiled AdamW steps of this exact shape after one warm-up step
    (which compiles); up to `steps` of them, fewer once `max_seconds` have passed."""
    import mlx.core as mx

    from .optim import AdamW

    model = trainer.build_model(cfg, vocab)
    step_fn, state = trainer.make_train_step(model, AdamW(cfg, model.parameters()))

    x = mx.random.randint(0, vocab, (cfg.batch_size, cfg.block_size))
    y = mx.random.randint(0, vocab, (cfg.batch_size, cfg.block_size))
    mx.eval(step_fn(x, y), state)
    start, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - start < max_seconds):
        mx.eval(step_fn(x, y), state)
        timed += 1
    return timed * cfg.tokens_per_step / (time.perf_counter() - start), timed


def run_cost_tokens(cfg: TrainConfig) -> float:
    """Train tokens plus evaluation, counted as train-step equivalents (a forward ~ 1/3 step)."""
    evals = cfg.steps // cfg.eval_every + 1
    return cfg.tokens_per_step * (cfg.steps + evals * cfg.eval_batches / 3)


def lr_text(lrs: Sequence[float]) -> str:
    return " ".join(f"{lr:.3g}" for lr in lrs)


def describe(sc: SweepConfig, runs: list[TrainConfig], calibrate_speed: bool) -> dict[int, float]:
    """Print the plan; returns the calibrated tokens/s per depth (empty if not calibrated)."""
    t = sc.train
    vocab, vocab_from = vocab_size(t.data)
    unfinished = [c for c in runs if verdict(c) in ("pending", None)]
    n_groups = len(groups(sc))
    refine_max = n_groups * sc.refine_steps if sc.refine else 0
    print(f"sweep {sc.name} (preset {sc.preset}): {len(runs)} grid runs = "
          f"{len(sc.grid_lrs())} LRs x {len(sc.qk_norms)} qk_norm x {len(sc.seeds)} seeds x "
          f"{len(sc.depth)} depths" + (f", + up to {refine_max} refinement runs "
                                       f"({sc.refine_steps} per curve, to within x{sc.refine_factor:g})"
                                       if refine_max else ", no refinement"))
    print(f"  folder      {Path(sc.runs_dir) / sc.name}  ({len(runs) - len(unfinished)} of "
          f"{len(runs)} grid runs already finished)")
    print(f"  LRs         {lr_text(sc.grid_lrs())}")
    print(f"  qk_norm     {', '.join(sc.qk_norms)};  seeds {', '.join(map(str, sc.seeds))}")
    print(f"  model       d_model {t.d_model}, {t.n_heads} heads (head_dim {t.head_dim}), "
          f"block {t.block_size}, bias {t.bias}, data {t.data} (vocab "
          f"{vocab if vocab else '?'}, {vocab_from})")
    print(f"  run         {t.steps:,} steps x {t.tokens_per_step:,} tokens = "
          f"{t.steps * t.tokens_per_step:,} tokens; warmup {t.warmup_steps}, eval every "
          f"{t.eval_every}, probes every {t.probe_every}, checkpoint every {t.ckpt_every}")
    speeds: dict[int, float] = {}
    for depth in sc.depth:
        cfg = dataclasses.replace(t, depth=depth, qk_norm=sc.qk_norms[-1])
        line = f"  depth {depth:<5} "
        if vocab:
            p = param_counts(cfg, vocab)
            line += f"{p['total'] / 1e6:.2f}M parameters ({p['non_embedding'] / 1e6:.2f}M non-embedding)"
        if calibrate_speed and vocab:
            speeds[depth], timed = calibrate(cfg, vocab)
            line += (f"; {speeds[depth]:,.0f} tok/s ({timed} timed steps); "
                     f"{trainer.format_seconds(run_cost_tokens(cfg) / speeds[depth])} a run")
        print(line, flush=True)
    if speeds:
        total = sum(run_cost_tokens(c) / speeds[c.depth] for c in unfinished)
        per_refine = sum(run_cost_tokens(run_config(sc, d, 1.0, "none", 0)) / speeds[d]
                         for d in sc.depth) / len(sc.depth)
        print(f"  estimate    {trainer.format_seconds(total)} for the {len(unfinished)} unfinished "
              f"grid runs" + (f", + up to {trainer.format_seconds(refine_max * per_refine)} "
                              f"of refinement" if refine_max else "")
              + " (training and evaluation; diverged runs stop early; probes and checkpoints "
              "not counted)", flush=True)
    return speeds


def value_text(value: object) -> str:
    """A value as `parse_train_config` reads it back exactly (repr round-trips floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def command_line(cfg: TrainConfig) -> str:
    """A standalone `train` command for this run: every field, so its run_id is the sweep's."""
    words = [shlex.quote(f"{f.name}={value_text(getattr(cfg, f.name))}") for f in fields(cfg)]
    return "python -m mlx_gpt train " + " ".join(words)


def remaining_runs(sc: SweepConfig) -> tuple[list[TrainConfig], list[TrainConfig]]:
    """(grid runs without a finished result, refinement runs the results on disk now call for)."""
    todo = [c for c in grid(sc) if verdict(c) in ("pending", None)]
    refine = [cfg for g in groups(sc) if (cfg := group_state(sc, g)[1]) is not None]
    return todo, refine


# --- running ------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What this process did, for the progress line and the closing report."""

    total: int
    trained: int = 0
    skipped: int = 0
    status: dict[str, int] = field(default_factory=lambda: {"completed": 0, "diverged": 0,
                                                            "failed": 0})
    busy: list[TrainConfig] = field(default_factory=list)  # held by another process
    tokens: float = 0.0
    seconds: float = 0.0

    @property
    def done(self) -> int:
        return sum(self.status.values())


def run_one(cfg: TrainConfig, tally: Tally, attempted: set[str], speed: float, queue_left: float,
            verbose: bool) -> None:
    """Train one run (or skip it), recording the outcome; RunBusy and failures do not raise."""
    attempted.add(cfg.run_id)
    v = verdict(cfg)
    if v in (True, False):
        tally.skipped += 1
        tally.status["completed" if v else "diverged"] += 1
        return
    rate = tally.tokens / tally.seconds if tally.seconds > 0 else speed
    eta = trainer.format_seconds(queue_left / rate) if rate > 0 else "?"
    position = f"{tally.done + len(tally.busy) + 1}/{tally.total}"
    if verbose:
        counts = ", ".join(f"{n} {s}" for s, n in tally.status.items())
        print(f"[sweep {position}: {counts}, {len(tally.busy)} busy | ETA {eta}] "
              f"lr {cfg.lr:.3g} qk_norm {cfg.qk_norm} depth {cfg.depth} seed {cfg.seed}",
              flush=True)
    start = time.perf_counter()
    try:
        summary = trainer.train(cfg, verbose=verbose, prefix=f"[{position}] ")
    except RunBusy:
        tally.busy.append(cfg)
        if verbose:
            print(f"[{position}] {cfg.run_id} is being trained by another process; passing over",
                  flush=True)
        return
    except (KeyboardInterrupt, UsageError):
        raise
    except Exception as e:  # noqa: BLE001 - one failed run must not stop the sweep
        tally.status["failed"] += 1
        tally.trained += 1
        print(f"[{position}] {cfg.run_id} failed: {type(e).__name__}: {e} (traceback in "
              f"{trainer.run_dir_of(cfg) / 'traceback.txt'})", flush=True)
        return
    tally.trained += 1
    tally.seconds += time.perf_counter() - start
    tally.tokens += summary.get("tokens_seen") or 0
    tally.status[summary["status"] if summary["status"] in tally.status else "failed"] += 1


def execute(sc: SweepConfig, speeds: Mapping[int, float], verbose: bool = True) -> Tally:
    """Train the grid, then the refinement; runs held elsewhere are looked at again at the end."""
    runs = grid(sc)
    tally = Tally(total=len(runs))
    attempted: set[str] = set()
    finished = [c for c in runs if verdict(c) in (True, False)]
    for cfg in finished:
        run_one(cfg, tally, attempted, 0.0, 0.0, verbose=False)
    if finished and verbose:
        print(f"{len(finished)} of {len(runs)} grid runs already finished; skipping them",
              flush=True)

    def speed(cfg: TrainConfig) -> float:
        return speeds.get(cfg.depth, 0.0)

    queue = [c for c in runs if c.run_id not in attempted]
    for i, cfg in enumerate(queue):
        left = sum(run_cost_tokens(c) for c in queue[i:])
        run_one(cfg, tally, attempted, speed(cfg), left, verbose)
    # runs that were busy: finished by now (skipped), still busy, or free again (trained)
    for cfg in list(tally.busy):
        tally.busy.remove(cfg)
        run_one(cfg, tally, attempted, speed(cfg), run_cost_tokens(cfg), verbose)
    if not sc.refine:
        return tally
    while True:  # one round = at most one new point per curve, so every curve advances together
        new = [cfg for g in groups(sc) if (cfg := group_state(sc, g)[1]) is not None
               and cfg.run_id not in attempted]
        if not new:
            return tally
        tally.total += len(new)
        for i, cfg in enumerate(new):
            left = sum(run_cost_tokens(c) for c in new[i:])
            run_one(cfg, tally, attempted, speed(cfg), left, verbose)


def report(sc: SweepConfig, tally: Tally, seconds: float) -> None:
    """What the runs/ tree now holds for this sweep (whoever trained it), and each boundary."""
    curves = {g: group_state(sc, g)[0] for g in groups(sc)}
    on_grid = set(sc.grid_lrs())
    runs = grid(sc) + [run_config(sc, depth, lr, qk, seed) for (depth, qk, seed), results
                       in curves.items() for lr in results if lr not in on_grid]
    counts = {"completed": 0, "diverged": 0, "failed": 0, "pending": 0}
    for cfg in runs:
        v = verdict(cfg)
        counts[{True: "completed", False: "diverged", None: "failed"}.get(v, "pending")] += 1
    print(f"sweep {sc.name}: {len(runs) - counts['pending']} of {len(runs)} runs have a result "
          f"({counts['completed']} completed, {counts['diverged']} diverged, "
          f"{counts['failed']} failed); {tally.trained} trained by this process in "
          f"{trainer.format_seconds(seconds)}; results in {Path(sc.runs_dir) / sc.name}")
    if tally.busy:
        print(f"  {len(tally.busy)} runs are held by another process: "
              f"{', '.join(c.run_id for c in tally.busy)}. "
              "Run the sweep again once it ends to finish any refinement that waits on them.")
    if counts["failed"]:
        print("  failed runs keep a traceback.txt in their folder; the next sweep retries them.")
    print("  stability boundary per curve (largest stable LR < smallest diverged LR):")
    for (depth, qk, seed), results in curves.items():
        lo, hi = boundary(results)
        print(f"    depth {depth} qk_norm {qk:<9} seed {seed}:  "
              f"{'-' if lo is None else f'{lo:.3g}'} < "
              f"{'none diverged' if hi is None else f'{hi:.3g}'}"
              + ("" if len(results) >= len(on_grid) else "  (grid incomplete)"))
    print_peak_logits(sc, runs)


def print_peak_logits(sc: SweepConfig, runs: list[TrainConfig]) -> None:
    """Per depth and seed, each arm's peak max attention logit (any layer, any step) by LR."""
    from .probes import peak_max_attention_logit

    table: dict[tuple, dict[str, float]] = {}
    for cfg in runs:
        folder = trainer.run_dir_of(cfg)
        if not (folder / "probes").is_dir():
            continue
        table.setdefault((cfg.depth, cfg.seed, cfg.lr), {})[cfg.qk_norm] = \
            peak_max_attention_logit(folder)
    if not table:
        return
    print("  peak max attention logit (max over layers and probe steps):")
    print("    depth seed       lr  " + "".join(f"{qk:>12}" for qk in sc.qk_norms))
    for (depth, seed, lr), arms in sorted(table.items()):
        cells = "".join(f"{arms[qk]:>12,.1f}" if qk in arms else f"{'-':>12}"
                        for qk in sc.qk_norms)
        print(f"    {depth:>5} {seed:>4} {lr:>8.3g}  {cells}")


def declare_grid(sc: SweepConfig) -> None:
    """Write <runs_dir>/<name>/sweep.json: the base LR grid (so the analysis can tell grid runs
    from refinement runs) and the sweep's axes. Grids of earlier sweeps into the same folder
    are kept (union)."""
    folder = Path(sc.runs_dir) / sc.name
    folder.mkdir(parents=True, exist_ok=True)
    earlier = runlog.read_json(folder / "sweep.json") or {}
    runlog.write_json(folder / "sweep.json", {
        "grid_lrs": sorted(set(earlier.get("grid_lrs", [])) | set(sc.grid_lrs())),
        "preset": sc.preset, "depths": sorted(set(earlier.get("depths", [])) | set(sc.depth)),
        "seeds": sorted(set(earlier.get("seeds", [])) | set(sc.seeds)),
        "qk_norms": sorted(set(earlier.get("qk_norms", [])) | set(sc.qk_norms)),
        "refine": sc.refine, "refine_steps": sc.refine_steps, "refine_factor": sc.refine_factor,
    })


def spawn_workers(words: list[str], sc: SweepConfig) -> list[subprocess.Popen]:
    """jobs=K: K-1 more sweep processes on the same tree (run locks share the work between them)."""
    folder = Path(sc.runs_dir) / sc.name
    folder.mkdir(parents=True, exist_ok=True)
    workers = []
    for i in range(1, sc.jobs):
        log = open(folder / f"sweep-worker-{i}.log", "w")  # noqa: SIM115 - the child writes it
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "mlx_gpt", "sweep", *words, "jobs=1", "--worker"],
            stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return workers


USAGE = """usage: python -m mlx_gpt sweep [key=value ...] [--dry-run [--calibrate]] [--emit-commands]

Trains qk_norm x LR grid x seeds (x depths) as independent, resumable runs, then refines each
curve's stability boundary. Presets: preset=study (default) or preset=demo.
sweep keys: depth=6 or depth=2,4,8  lrs=1e-3,3e-3 (explicit)  lr_min= lr_max= points_per_decade=
            seeds=0,1  qk_norms=none,rmsnorm  refine=true  refine_steps=  refine_factor=
            name= (folder under runs_dir)  runs_dir=runs  jobs=1
any other TrainConfig key (d_model=, budget_tokens=, warmup_steps=, ...) goes into every run.
  --dry-run        print the plan and stop (add --calibrate to measure tokens/s and estimate time)
  --emit-commands  print each remaining run as one `python -m mlx_gpt train ...` line"""

FLAGS = ("--dry-run", "--calibrate", "--emit-commands", "--worker")


def cli(argv: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in argv):
        print(USAGE)
        return 0
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - set(FLAGS)
    if unknown:
        raise UsageError(f"unknown flag {min(unknown)}; flags: {', '.join(FLAGS[:3])}")
    words = [a for a in argv if not a.startswith("--")]
    sc = parse_sweep_config(words)
    runs = [c.validate() for c in grid(sc)]  # every run's config is checked before anything runs

    if "--emit-commands" in flags:
        todo, refine = remaining_runs(sc)
        for cfg in todo + refine:
            print(command_line(cfg))
        print(f"# {len(todo)} of {len(runs)} grid runs left, {len(refine)} refinement runs "
              "called for by the results so far" + (" (run --emit-commands again once these "
                                                    "finish and their folders are merged)"
                                                    if sc.refine else ""), file=sys.stderr)
        return 0
    worker = "--worker" in flags
    if not flags & {"--dry-run"} and not worker:
        trainer.load_data(sc.train)  # the data must exist before anything is written
    if worker:
        speeds: Mapping[int, float] = {}
    else:
        speeds = describe(sc, runs, calibrate_speed="--dry-run" not in flags
                          or "--calibrate" in flags)
    if "--dry-run" in flags:
        return 0

    if not worker:
        declare_grid(sc)
    start = time.perf_counter()
    workers = spawn_workers(words, sc) if sc.jobs > 1 and not worker else []
    if workers:
        print(f"started {len(workers)} more sweep processes (logs in "
              f"{Path(sc.runs_dir) / sc.name}/sweep-worker-*.log)", flush=True)
    tally = None
    try:
        tally = execute(sc, speeds, verbose=True)
    except KeyboardInterrupt:
        print(f"\nsweep {sc.name} interrupted; the current run is checkpointed. Run the same "
              f"command again to resume: python -m mlx_gpt sweep {shlex.join(words)}",
              file=sys.stderr, flush=True)
        return 130
    finally:
        for w in workers:
            w.wait()
    if not worker:
        if workers:  # the other processes may have finished runs this one passed over
            tally.busy = [c for c in tally.busy if verdict(c) == "pending"]
        report(sc, tally, time.perf_counter() - start)
    return 0
