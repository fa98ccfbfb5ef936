"""The models the benchmarks time: a preset's run model at its largest depth (framework-free)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..config import ModelArgs, TrainConfig, model_args
from ..errors import UsageError
from ..parameters import count_params


def preset_shape(name: str) -> dict[str, int]:
    """The model of preset `name` (its largest depth) as a shape dict."""
    from ..sweep.config import PRESETS
    from ..sweep.plan import VOCAB_BY_SUFFIX

    if name not in PRESETS:
        raise UsageError(f"unknown shape {name!r}; the shapes are the presets: "
                         f"{', '.join(PRESETS)}")
    sweep = PRESETS[name]
    t = sweep.train
    return {"depth": max(sweep.depth), "d_model": t.d_model, "n_heads": t.n_heads,
            "block_size": t.block_size, "batch_size": t.batch_size,
            "vocab": VOCAB_BY_SUFFIX[t.data.rsplit("-", 1)[-1]]}


def preset_base(name: str) -> TrainConfig | None:
    """The preset's own run config, or None for a shape that is not a preset."""
    from ..sweep.config import PRESETS

    return PRESETS[name].train if name in PRESETS else None


def shape_config(shape: dict, base: TrainConfig | None = None, **changes
                 ) -> tuple[TrainConfig, ModelArgs]:
    """(the run config of `shape` over `base` with `changes` (backend=, ...), its model args)."""
    base = base or TrainConfig(warmup_steps=10, max_steps=10_000)
    cfg = dataclasses.replace(base, depth=shape["depth"], d_model=shape["d_model"],
                              n_heads=shape["n_heads"], block_size=shape["block_size"],
                              batch_size=shape["batch_size"], **changes).validate()
    return cfg, model_args(cfg, shape["vocab"])


def random_batch(cfg: TrainConfig, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of uniform random token ids, int32, of the config's batch shape."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (cfg.batch_size, cfg.block_size + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def flops_per_token(args: ModelArgs) -> float:
    """Training FLOPs per token, 6 N + 12 L H Q T (PaLM app. B); N: the matmul parameters."""
    n = count_params(args)["total"] - args.block_size * args.d_model  # minus the position table
    attention = 12 * args.depth * args.n_heads * (args.d_model // args.n_heads) * args.block_size
    return 6.0 * n + attention
