"""The optimizer's numbers for both engines' AdamW: LR schedule and (independent) decay."""

from __future__ import annotations

import numpy as np

from .config import TrainConfig


def learning_rates(cfg: TrainConfig) -> np.ndarray:
    """The float32 LR of updates 0..steps: linear warmup, then a cosine to the floor."""
    step = np.arange(cfg.steps + 1, dtype=np.float64)
    warmup = float(cfg.warmup_steps)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = np.clip((step - warmup) / decay_steps, 0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + np.cos(np.pi * progress)) * (cfg.lr - min_lr)
    warm = cfg.lr * (step + 1.0) / (warmup + 1.0)
    return np.where(step < warmup, warm, cosine).astype(np.float32)


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Matrices and embeddings decay, gains and biases never."""
    return len(shape) >= 2


def decay_coefficient(cfg: TrainConfig) -> float:
    return cfg.weight_decay / cfg.lr if cfg.independent_wd else cfg.weight_decay
