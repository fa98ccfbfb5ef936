"""The optimizer: MLX's own AdamW with PyTorch semantics, applying the core's rule
(qkstudy/optimizer.py: the learning rate of every update, which parameters decay, by how much):
`AdamW(bias_correction=True)` in two groups of a `MultiOptimizer` (the parameters `decays`
names, with `decay_coefficient`, and the rest without), the rate of update s looked up in
`learning_rates(cfg)` inside the compiled step, and global-norm clipping (grad_clip=0: none).
The state is the library's (`opt.state`); its step counts the updates applied.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.optimizers as optim

from qkstudy.config import TrainConfig
from qkstudy.optimizer import decay_coefficient, decays, learning_rates


def lr_schedule(cfg: TrainConfig):
    """The learning rate as MLX's optimizer asks for it: a function of its update count (before
    it increments it), reading the core's numbers."""
    rates = mx.array(learning_rates(cfg))
    last = rates.size - 1
    return lambda step: rates[mx.minimum(step, last)]


def make_optimizer(cfg: TrainConfig, params: dict) -> optim.MultiOptimizer:
    """AdamW over `params` (a model's parameter tree), its state initialised."""
    schedule = lr_schedule(cfg)

    def adamw(weight_decay: float) -> optim.AdamW:
        return optim.AdamW(learning_rate=schedule,
                           betas=[cfg.beta1, cfg.beta2], eps=cfg.eps,
                           weight_decay=weight_decay, bias_correction=True)

    opt = optim.MultiOptimizer([adamw(decay_coefficient(cfg)), adamw(0.0)],
                               [lambda name, param: decays(name, param.shape)])
    opt.init(params)
    return opt


def update(opt: optim.MultiOptimizer, model, grads: dict, grad_clip: float
           ) -> tuple[mx.array, mx.array]:
    """Clip the gradients to global norm `grad_clip` (0: no clipping) and apply one step to
    `model` in place. Returns (pre-clip gradient norm, learning rate used)."""
    clipped, norm = optim.clip_grad_norm(grads, grad_clip if grad_clip > 0 else math.inf)
    opt.update(model, clipped if grad_clip > 0 else grads)
    return norm, opt.learning_rate

