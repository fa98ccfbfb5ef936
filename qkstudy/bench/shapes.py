"""The models the benchmarks time (each preset's at its largest depth) and the study's hours."""

from __future__ import annotations

import dataclasses

from ..config import ModelArgs, TrainConfig, model_args
from ..data.tokenizer import VOCAB_BY_TOKENIZER
from ..errors import UsageError
from ..forecast import run_cost_tokens
from ..parameters import flops_per_token
from ..sweep.config import PRESETS


def preset_shape(name: str) -> dict[str, int]:
    """The model of preset `name` (its largest depth) as a shape dict."""
    if name not in PRESETS:
        raise UsageError(f"unknown shape {name!r}; the shapes are the presets: "
                         f"{', '.join(PRESETS)}")
    sweep = PRESETS[name]
    t = sweep.train
    return {"depth": max(sweep.depth), "d_model": t.d_model, "n_heads": t.n_heads,
            "block_size": t.block_size, "batch_size": t.batch_size,
            "vocab": VOCAB_BY_TOKENIZER[t.data.rsplit("-", 1)[-1]]}


def preset_base(name: str) -> TrainConfig | None:
    """The preset's own run config, or None for a shape that is not a preset."""
    return PRESETS[name].train if name in PRESETS else None


def shape_config(shape: dict, base: TrainConfig | None = None, **changes
                 ) -> tuple[TrainConfig, ModelArgs]:
    """(the run config of `shape` over `base` with `changes` (backend=, ...), its model args)."""
    base = base or TrainConfig(warmup_steps=10, max_steps=10_000)
    cfg = dataclasses.replace(base, depth=shape["depth"], d_model=shape["d_model"],
                              n_heads=shape["n_heads"], block_size=shape["block_size"],
                              batch_size=shape["batch_size"], **changes).validate()
    return cfg, model_args(cfg, shape["vocab"])


def study_plan() -> dict:
    """The study preset's run cost, grid, FLOPs per token and depths (3, each costed as its)."""
    study, shape = PRESETS["study"], preset_shape("study")
    cfg, args = shape_config(shape, preset_base("study"))
    runs = len(study.arms) * len(study.grid_lrs()) * len(study.seeds)
    return {"depth": shape["depth"], "cost_tokens": run_cost_tokens(cfg),
            "budget_tokens": cfg.budget_tokens, "arms": len(study.arms),
            "lrs": len(study.grid_lrs()), "seeds": len(study.seeds), "runs_per_depth": runs,
            "depths": 3, "flops_per_token": flops_per_token(args)}


def study_hours(tokens_per_s: float, plan: dict | None = None) -> dict[str, float]:
    plan = plan or study_plan()
    run = plan["cost_tokens"] / tokens_per_s / 3600
    return {"hours_per_run": run, "hours_per_depth": run * plan["runs_per_depth"],
            "hours_whole_study": run * plan["runs_per_depth"] * plan["depths"]}
