"""SweepConfig, its LR grid, the presets, key=value parsing and a sweep's runs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from ..arms import apply_arm, parse_arms
from ..config import (INDEPENDENT_WD_DEFAULT, TORCH_OPTIONS, TrainConfig, apply_overrides,
                      auto_backend, split_key_values)
from ..errors import UsageError

MAX_GRID_LRS = 1000  # a sanity bound: a grid this size is already years of training


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
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ("none", "rmsnorm")
    refine: bool = True
    refine_steps: int = 2  # bisection steps per (depth, arm, seed)
    refine_factor: float = 1.4  # stop once largest stable / smallest diverged LR are this close
    threshold_steps: int = 2  # bisection steps of each depth's seed-mean crossing (adaptive.py)
    max_seeds: int = 6  # adaptive seeds, one at a time, for the cells still undecided
    min_gap: float = 0.1  # nats: the analysis plan's margin (docs/report.md)
    runs_dir: str = "runs"
    jobs: int = 1  # sweep processes on this machine (they share work through run locks)
    train: TrainConfig = field(default_factory=TrainConfig)
    backend_why: str = ""

    def validate(self) -> SweepConfig:
        lo, hi, per = self.lr_min, self.lr_max, self.points_per_decade
        checks = [
            (bool(self.depth), "depth needs at least one value"),
            (bool(self.seeds), "seeds needs at least one value"),
            (bool(self.arms), "arms needs at least one value"),
            (all(math.isfinite(x) for x in (lo, hi, per, self.refine_factor)),
             "lr_min, lr_max, points_per_decade and refine_factor must be finite numbers"),
            (lo > 0, f"lr_min must be > 0, got {lo}"),
            (lo < hi, f"lr_min={lo:g} must be below lr_max={hi:g}"),
            (per > 0, f"points_per_decade must be > 0, got {per}"),
            (lo <= 0 or hi <= lo or self.lrs or math.log10(hi / lo) * per < MAX_GRID_LRS,
             f"lr_min={lo:g} to lr_max={hi:g} at points_per_decade={per:g} is more than "
             f"{MAX_GRID_LRS} learning rates"),
            (len(self.lrs) <= MAX_GRID_LRS, f"lrs has more than {MAX_GRID_LRS} values"),
            (all(lr > 0 for lr in self.lrs), "every value in lrs must be > 0"),
            (self.refine_factor > 1, f"refine_factor must be > 1, got {self.refine_factor}"),
            (math.isfinite(self.min_gap) and self.min_gap > 0,
             f"min_gap must be a number > 0 (nats), got {self.min_gap}"),
            ("/" not in self.name and self.name not in ("", ".", ".."),
             f"name must be a plain folder name, got {self.name!r}"),
        ] + [(getattr(self, k) >= least, f"{k} must be >= {least}, got {getattr(self, k)}")
             for k, least in (("refine_steps", 0), ("threshold_steps", 0), ("max_seeds", 0),
                              ("jobs", 1))]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        return self

    def grid_lrs(self) -> list[float]:
        if self.lrs:
            return sorted(set(self.lrs))
        return log_grid(self.lr_min, self.lr_max, self.points_per_decade)


def three_significant(x: float) -> float:
    return float(f"{x:.3g}")


def log_grid(lr_min: float, lr_max: float, points_per_decade: float) -> list[float]:
    """Log-spaced LRs to 3 digits, lr_max included; half-decades snap to 1-3-10 within 6%."""
    if not (0 < lr_min < lr_max and points_per_decade > 0):
        return []
    n = math.floor(math.log10(lr_max / lr_min) * points_per_decade + 1e-9)
    lrs = [three_significant(lr_min * 10 ** (i / points_per_decade)) for i in range(n + 1)]
    if points_per_decade != 2:
        return lrs
    nice = [[float(f"{m}e{math.floor(math.log10(lr))}") for m in (1, 3, 10)] for lr in lrs]
    return [next((x for x in xs if abs(lr / x - 1) < 0.06), lr) for lr, xs in zip(lrs, nice)]


# Weight decay that does not move with the LR (Wortsman et al. 2023, sec. 3.2.2): coupled decay
# would let the divergence boundary partly measure weight decay (the ablation mini-coupled-wd).
INDEPENDENT_WD = {"independent_wd": True, "weight_decay": INDEPENDENT_WD_DEFAULT}

# The study's plan: a ~12M-parameter nanoGPT (depth 6), GPT-2 vocabulary, 100M tokens.
STUDY = SweepConfig(
    preset="study", name="study", depth=(6,), lr_min=3e-4, lr_max=3e-1, points_per_decade=2,
    seeds=(0, 1, 2), arms=("none", "rmsnorm"), refine=True, refine_steps=2, refine_factor=1.4,
    train=TrainConfig(
        data="data/tinystories-gpt2", d_model=192, n_heads=3, block_size=256, batch_size=16,
        budget_tokens=100_000_000, warmup_steps=1000, eval_every=500, eval_batches=20,
        probe_every=250, log_every=10, ckpt_every=1000, **INDEPENDENT_WD))

# The smallest study that tests H1-H3 on a laptop CPU (`just mini`): seeds fixed in advance,
# LRs from 1e-3 (stable) to 3 (all diverge), two bisection steps (x1.33, finer than H2's x1.41).
MINI = SweepConfig(
    preset="mini", name="mini", depth=(2, 4, 8), lrs=(1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0),
    seeds=(0, 1, 2, 3, 4), arms=("none", "rmsnorm"), refine=True, refine_steps=2,
    refine_factor=1.4, max_seeds=5, jobs=2,
    train=TrainConfig(
        data="data/synthetic-bytes", d_model=64, n_heads=2, block_size=64, batch_size=16,
        max_steps=300, warmup_steps=30, eval_every=50, eval_batches=4, probe_every=50,
        log_every=10, ckpt_every=100, divergence_window=50, **INDEPENDENT_WD))

# A first result in about two minutes (docs/sweeps.md#demo): the mini's run at depth 2 and four
# LRs fixed from the mini's results (no difference, near the onset, off worse, divergent).
DEMO = SweepConfig(
    preset="demo", name="demo", depth=(2,), lrs=(1e-3, 1e-2, 0.1, 1.0),
    seeds=(0, 1, 2, 3), arms=("none", "rmsnorm"), refine=False, threshold_steps=0, max_seeds=0,
    jobs=2,  # two runs at once on a 2-core CPU (docs/performance.md)
    train=MINI.train,
)

# The ablation: the mini with nanoGPT's coupled decay (0.1, scaled by the LR).
MINI_COUPLED_WD = dataclasses.replace(
    MINI, preset="mini-coupled-wd", name="mini-coupled-wd",
    train=dataclasses.replace(MINI.train, independent_wd=False, weight_decay=0.1))

PRESETS: dict[str, SweepConfig] = {"study": STUDY, "demo": DEMO, "mini": MINI,
                                   "mini-coupled-wd": MINI_COUPLED_WD}

NOT_KEYS = {"train", "preset", "backend_why"}  # SweepConfig fields a command line cannot set
LIST_KEYS = {"depth": int, "lrs": float, "seeds": int}
# TrainConfig keys the sweep sets itself, with the sweep key to use instead.
GRID_KEYS = {"lr": "lrs (or lr_min, lr_max, points_per_decade)", "seed": "seeds",
             "qk_norm": "arms", "attn_softcap": "arms (softcap<C>)",
             "z_loss": "arms (zloss<W>)", "sweep": "name"}


def parse_list(key: str, text: str, kind: type) -> tuple:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{key} needs at least one value")
    out = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            raise UsageError(f"{key}: {item!r} is not a number") from None
        if not math.isfinite(value):
            raise UsageError(f"{key}: {item!r} is not a finite number")
        if kind is int and value != int(value):
            raise UsageError(f"{key}: {item!r} is not an integer")
        out.append(kind(value))
    return tuple(out)


def parse_sweep_config(words: list[str]) -> SweepConfig:
    pairs = split_key_values(words)
    preset = pairs.pop("preset", "study")
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = PRESETS[preset]
    sweep_keys = {f.name for f in fields(SweepConfig)} - NOT_KEYS
    train_keys = {f.name for f in fields(TrainConfig)}
    for key in pairs:
        if key in GRID_KEYS:
            raise UsageError(f"{key} is set by the sweep grid; use {GRID_KEYS[key]}")
        if key not in sweep_keys | train_keys:
            raise UsageError(f"unknown key {key!r}; sweep keys: {', '.join(sorted(sweep_keys))}; "
                             f"run keys: {', '.join(sorted(train_keys - set(GRID_KEYS)))}")
    range_keys = [k for k in ("lr_min", "lr_max", "points_per_decade") if k in pairs]
    if range_keys and "lrs" in pairs:
        raise UsageError(f"give lrs or {'/'.join(range_keys)}, not both")
    lists = {k: parse_list(k, pairs.pop(k), kind) for k, kind in LIST_KEYS.items() if k in pairs}
    if "arms" in pairs:
        lists["arms"] = parse_arms("arms", pairs.pop("arms"))
    if range_keys:
        lists["lrs"] = ()  # a range given here replaces a preset's explicit list
    sweep = apply_overrides(base, {k: pairs.pop(k) for k in list(pairs) if k in sweep_keys})
    why = ""
    if pairs.get("backend", "auto") == "auto":
        pairs["backend"], why = auto_backend(any(k in pairs for k in TORCH_OPTIONS))
    train = apply_overrides(base.train, pairs)  # what is left: TrainConfig keys
    return dataclasses.replace(sweep, train=train, backend_why=why, **lists).validate()


def run_config(sweep: SweepConfig, depth: int, lr: float, arm: str, seed: int) -> TrainConfig:
    """One run; data_seed follows the seed, so a seed's LRs and arms share init and batches."""
    return apply_arm(dataclasses.replace(
        sweep.train, depth=depth, lr=lr, seed=seed, data_seed=sweep.train.data_seed + seed,
        sweep=sweep.name, runs_dir=sweep.runs_dir), arm)


def grid(sweep: SweepConfig) -> list[TrainConfig]:
    """Grid runs in training order: seed, depth, LR, arm (whole paired curves seed by seed)."""
    return [run_config(sweep, depth, lr, arm, seed) for seed in sweep.seeds for depth in sweep.depth
            for lr in sweep.grid_lrs() for arm in sweep.arms]


Group = tuple[int, str, int]  # (depth, arm, seed): one LR curve, refined on its own


def groups(sweep: SweepConfig) -> list[Group]:
    return [(d, arm, seed) for seed in sweep.seeds for d in sweep.depth for arm in sweep.arms]
