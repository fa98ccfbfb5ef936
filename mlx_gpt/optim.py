"""The optimizer: MLX's own AdamW with PyTorch semantics, and the learning-rate schedule.

- `mlx.optimizers.AdamW(bias_correction=True)` (MLX defaults it off; torch.optim.AdamW has it on);
- decoupled weight decay on every parameter with ndim >= 2 (the embeddings wte and wpe and every
  linear weight), never on norms' gains or biases: two AdamW groups in a `MultiOptimizer`;
- `independent_wd` (Wortsman et al. 2023, sec. 3.2.2): the decay multiplies lr_t / lr instead of
  lr_t, i.e. AdamW's weight_decay is weight_decay / lr, so it does not shrink with the peak LR;
- linear warmup, cosine decay to min_lr_ratio * lr (`lr_schedule`, the one hand-written part);
- global gradient-norm clipping with `mlx.optimizers.clip_grad_norm` (grad_clip=0: none).
The state is the library's (`opt.state`); its step counts the updates applied.
"""

from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
import mlx.optimizers as optim

from qkstudy.config import TrainConfig


def lr_schedule(step: mx.array | int, cfg: TrainConfig) -> mx.array:
    """Learning rate for update number `step` (0-based): warmup then cosine, as nanoGPT.
    MLX's optimizer calls it with its step count before incrementing it."""
    step = mx.array(step).astype(mx.float32)
    warmup = float(cfg.warmup_steps)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + mx.cos(math.pi * progress)) * (cfg.lr - min_lr)
    warm = cfg.lr * (step + 1.0) / (warmup + 1.0)
    return mx.where(step < warmup, warm, cosine)


def decays(name: str, param: mx.array) -> bool:
    """Whether weight decay applies: every parameter with ndim >= 2 (as nanoGPT)."""
    return param.ndim >= 2


def decay_coefficient(cfg: TrainConfig) -> float:
    """AdamW's weight_decay: the decay per step is lr_t times this."""
    return cfg.weight_decay / cfg.lr if cfg.independent_wd else cfg.weight_decay


def make_optimizer(cfg: TrainConfig, params: dict) -> optim.MultiOptimizer:
    """AdamW over `params` (a model's parameter tree), its state initialised."""
    def adamw(weight_decay: float) -> optim.AdamW:
        return optim.AdamW(learning_rate=partial(lr_schedule, cfg=cfg),
                           betas=[cfg.beta1, cfg.beta2], eps=cfg.eps,
                           weight_decay=weight_decay, bias_correction=True)

    opt = optim.MultiOptimizer([adamw(decay_coefficient(cfg)), adamw(0.0)], [decays])
    opt.init(params)
    return opt


def update(opt: optim.MultiOptimizer, model, grads: dict, grad_clip: float
           ) -> tuple[mx.array, mx.array]:
    """Clip the gradients to global norm `grad_clip` (0: no clipping) and apply one step to
    `model` in place. Returns (pre-clip gradient norm, learning rate used)."""
    clipped, norm = optim.clip_grad_norm(grads, grad_clip if grad_clip > 0 else math.inf)
    opt.update(model, clipped if grad_clip > 0 else grads)
    return norm, opt.learning_rate


def step_count(state: dict) -> mx.array:
    """The updates applied, from an optimizer state (`opt.state`): every group counts them."""
    return state["states"][0]["step"]
