"""AdamW with PyTorch semantics, written out so every term is visible and matches torch_ref.

- bias correction ON (MLX's own AdamW defaults it off);
- decoupled weight decay on weight matrices (ndim >= 2) only, never on norms' gains or biases;
- `independent_wd` (Wortsman et al. 2023, sec. 3.2.2): the decay is multiplied by the schedule
  factor lr_t / lr instead of lr_t, so weight decay does not shrink as the peak LR shrinks;
- linear warmup, cosine decay to min_lr_ratio * lr; global gradient-norm clipping.
The state is flat dicts keyed by parameter name, so it checkpoints and compiles simply.
"""

from __future__ import annotations

import math

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .config import TrainConfig


def lr_schedule(step: mx.array | int, cfg: TrainConfig) -> mx.array:
    """Learning rate for update number `step` (0-based): warmup then cosine, as nanoGPT."""
    step = mx.array(step, dtype=mx.float32)
    warmup = float(cfg.warmup_steps)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + mx.cos(math.pi * progress)) * (cfg.lr - min_lr)
    warm = cfg.lr * (step + 1.0) / (warmup + 1.0)
    return mx.where(step < warmup, warm, cosine)


def decays(name: str, param: mx.array) -> bool:
    return param.ndim >= 2


class AdamW:
    def __init__(self, cfg: TrainConfig, params: dict):
        self.cfg = cfg
        flat = dict(tree_flatten(params))
        self.decay = {name: decays(name, p) for name, p in flat.items()}
        self.state = {
            "step": mx.array(0, dtype=mx.int32),
            "m": {name: mx.zeros_like(p) for name, p in flat.items()},
            "v": {name: mx.zeros_like(p) for name, p in flat.items()},
        }

    def clip(self, grads: dict[str, mx.array]) -> tuple[dict[str, mx.array], mx.array]:
        """Global-norm clipping as torch.nn.utils.clip_grad_norm_; returns the pre-clip norm."""
        norm = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for g in grads.values()))
        if self.cfg.grad_clip <= 0:
            return grads, norm
        coef = mx.minimum(self.cfg.grad_clip / (norm + 1e-6), 1.0)
        return {k: g * coef for k, g in grads.items()}, norm

    def update(self, model, grads_tree: dict) -> tuple[mx.array, mx.array]:
        """One AdamW step on `model` in place. Returns (pre-clip grad norm, lr used)."""
        cfg, state = self.cfg, self.state
        grads, norm = self.clip(dict(tree_flatten(grads_tree)))
        params = dict(tree_flatten(model.parameters()))
        step = state["step"]
        lr = lr_schedule(step, cfg)
        t = (step + 1).astype(mx.float32)
        bias1 = 1.0 - cfg.beta1**t
        bias2 = 1.0 - cfg.beta2**t
        decay_rate = (lr / cfg.lr if cfg.independent_wd else lr) * cfg.weight_decay
        new = []
        for name, p in params.items():
            g = grads[name]
            m = cfg.beta1 * state["m"][name] + (1.0 - cfg.beta1) * g
            v = cfg.beta2 * state["v"][name] + (1.0 - cfg.beta2) * mx.square(g)
            state["m"][name], state["v"][name] = m, v
            if self.decay[name] and cfg.weight_decay > 0:
                p = p * (1.0 - decay_rate)
            p = p - (lr / bias1) * m / (mx.sqrt(v) / mx.sqrt(bias2) + cfg.eps)
            new.append((name, p))
        model.update(tree_unflatten(new))
        state["step"] = step + 1
        return norm, lr
