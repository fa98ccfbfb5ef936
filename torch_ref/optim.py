"""mlx_gpt.optim.AdamW in torch, term for term, so a torch run follows the MLX run step by step.

Same semantics (see mlx_gpt/optim.py): bias correction; decoupled decay on ndim >= 2 params only;
`independent_wd` multiplies the decay by lr_t / lr instead of lr_t (Wortsman et al. 2023,
sec. 3.2.2); warmup + cosine; global-norm clipping with coef = min(clip / (norm + 1e-6), 1).
Scalars are float32 tensors like the MLX ones, so both round the same way.
With independent_wd off it equals torch.optim.AdamW (the tests check that too).
"""

from __future__ import annotations

import math

import torch

from mlx_gpt.config import TrainConfig


def lr_schedule(step: int, cfg: TrainConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """Learning rate for update number `step` (0-based): linear warmup, then cosine to min_lr."""
    step_t = torch.tensor(float(step), dtype=torch.float32, device=device)
    warmup = float(cfg.warmup_steps)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = ((step_t - warmup) / decay_steps).clamp(0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + torch.cos(math.pi * progress)) * (cfg.lr - min_lr)
    warm = cfg.lr * (step_t + 1.0) / (warmup + 1.0)
    return torch.where(step_t < warmup, warm, cosine)


def decays(name: str, param: torch.Tensor) -> bool:
    return param.ndim >= 2


class AdamW:
    def __init__(self, cfg: TrainConfig, named_params: dict[str, torch.nn.Parameter]):
        self.cfg = cfg
        self.params = named_params
        self.decay = {name: decays(name, p) for name, p in named_params.items()}
        self.step = 0
        self.m = {name: torch.zeros_like(p) for name, p in named_params.items()}
        self.v = {name: torch.zeros_like(p) for name, p in named_params.items()}

    def clip(self) -> torch.Tensor:
        """Global-norm clipping of the .grad tensors in place; returns the pre-clip norm."""
        grads = [p.grad for p in self.params.values()]
        norm = torch.sqrt(sum(torch.sum(g.float() ** 2) for g in grads))
        if self.cfg.grad_clip > 0:
            coef = torch.clamp(self.cfg.grad_clip / (norm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef)
        return norm

    @torch.no_grad()
    def update(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One AdamW step from the params' .grad. Returns (pre-clip grad norm, lr used)."""
        cfg = self.cfg
        norm = self.clip()
        device = next(iter(self.params.values())).device
        lr = lr_schedule(self.step, cfg, device)
        t = torch.tensor(float(self.step + 1), dtype=torch.float32, device=device)
        bias1 = 1.0 - torch.pow(cfg.beta1, t)
        bias2 = 1.0 - torch.pow(cfg.beta2, t)
        decay_rate = (lr / cfg.lr if cfg.independent_wd else lr) * cfg.weight_decay
        for name, p in self.params.items():
            g = p.grad
            m = self.m[name].mul_(cfg.beta1).add_((1.0 - cfg.beta1) * g)
            v = self.v[name].mul_(cfg.beta2).add_((1.0 - cfg.beta2) * g.square())
            if self.decay[name] and cfg.weight_decay > 0:
                p.mul_(1.0 - decay_rate)
            p.sub_((lr / bias1) * m / (v.sqrt() / bias2.sqrt() + cfg.eps))
        self.step += 1
        return norm, lr
