"""What the optimizer does, stated once for both engines: the learning rate of every update and
which parameters decay, by how much. mlx_gpt/optim.py and torch_ref/optim.py apply these numbers
and this rule with their library's AdamW; tests/test_optimizer.py holds both to them.

- The learning rate (nanoGPT's `get_lr`): linear warmup over `warmup_steps` updates, update s
  (0-based) at lr * (s + 1) / (warmup_steps + 1); then a cosine from lr down to
  min_lr_ratio * lr at update `steps`, where it stays. `learning_rates` writes it out as one
  float32 number per update, the very numbers both engines use.
- Weight decay (nanoGPT's `configure_optimizers`): every parameter with two or more dimensions
  (the embeddings wte and wpe, every linear weight) decays; norms' gains and biases never do.
- The decay coefficient: AdamW's weight_decay, which the libraries multiply by the update's
  learning rate; with `independent_wd` (Wortsman et al. 2023, sec. 3.2.2) it is weight_decay /
  lr, so the decay per step is weight_decay x lr_t / lr and does not shrink with the peak LR.
"""

from __future__ import annotations

import numpy as np

from .config import TrainConfig


def learning_rates(cfg: TrainConfig) -> np.ndarray:
    """The learning rate of update 0 .. `cfg.steps` (float32, steps + 1 values): warmup, then
    cosine to the floor, which the last value holds (an update past `steps` uses it too)."""
    step = np.arange(cfg.steps + 1, dtype=np.float64)
    warmup = float(cfg.warmup_steps)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = np.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + np.cos(np.pi * progress)) * (cfg.lr - min_lr)
    warm = cfg.lr * (step + 1.0) / (warmup + 1.0)
    return np.where(step < warmup, warm, cosine).astype(np.float32)


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Whether weight decay applies to the parameter `name` of this shape: two or more
    dimensions (matrices and embeddings), never a gain or a bias."""
    return len(shape) >= 2


def decay_coefficient(cfg: TrainConfig) -> float:
    """AdamW's weight_decay: the decay per step is the update's learning rate times this."""
    return cfg.weight_decay / cfg.lr if cfg.independent_wd else cfg.weight_decay
