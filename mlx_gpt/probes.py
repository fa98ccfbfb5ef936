"""The probes (qkstudy/probes.py) on MLX arrays."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

from qkstudy import probes

from .model import GPT

OPS = SimpleNamespace(
    where=mx.where, f32=lambda x: x.astype(mx.float32),
    numbers=lambda values: np.array(mx.concatenate([v.reshape(-1) for v in values])
                                    .astype(mx.float32), dtype=np.float64).tolist())


def collect(model: GPT, x: mx.array, y: mx.array, step: int) -> list[dict]:
    """Every forward and gradient probe on the batch (x, y), for params after `step` updates."""
    def objective(x: mx.array, y: mx.array):
        captures: list[dict] = []
        logits = model(x, captures)
        total, ce, _ = model.loss(logits, y)
        return total, ce, logits, captures

    (_, ce, logits, captures), grads = nn.value_and_grad(model, objective)(x, y)
    return probes.collected(step, model.args, captures, logits, ce,
                            dict(tree_flatten(model.parameters())), dict(tree_flatten(grads)), OPS)
