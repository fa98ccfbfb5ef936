"""The core's optimizer rule (qkstudy/optimizer.py) with MLX's own AdamW (PyTorch semantics):
two groups of a MultiOptimizer (the parameters `decays` names, and the rest without decay), the
rate of update s looked up in `learning_rates(cfg)` inside the compiled step, global-norm
clipping (grad_clip=0: none). The state is the library's (`opt.state`)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.optimizers as optim

from qkstudy.config import TrainConfig
from qkstudy.optimizer import decay_coefficient, decays, learning_rates


def make_optimizer(cfg: TrainConfig, params: dict) -> optim.MultiOptimizer:
    rates = mx.array(learning_rates(cfg))
    last = rates.size - 1

    def adamw(weight_decay: float) -> optim.AdamW:
        # the schedule gets the update count before the optimizer increments it
        return optim.AdamW(learning_rate=lambda step: rates[mx.minimum(step, last)],
                           betas=[cfg.beta1, cfg.beta2], eps=cfg.eps,
                           weight_decay=weight_decay, bias_correction=True)

    opt = optim.MultiOptimizer([adamw(decay_coefficient(cfg)), adamw(0.0)],
                               [lambda name, param: decays(name, param.shape)])
    opt.init(params)
    return opt


def update(opt: optim.MultiOptimizer, model, grads: dict, grad_clip: float
           ) -> tuple[mx.array, mx.array]:
    """Clip to global norm `grad_clip` and apply one step to `model` in place: (pre-clip
    gradient norm, learning rate used)."""
    clipped, norm = optim.clip_grad_norm(grads, grad_clip if grad_clip > 0 else math.inf)
    opt.update(model, clipped if grad_clip > 0 else grads)
    return norm, opt.learning_rate
