"""The optimizer of mlx_gpt/optim.py with PyTorch's own pieces, so a torch run follows the MLX run.

`torch.optim.AdamW` (bias correction is always on there) with nanoGPT's two groups: decay on
every parameter with ndim >= 2, none on gains and biases; `independent_wd` (Wortsman et al.
2023, sec. 3.2.2) is weight_decay / lr, so the decay multiplies lr_t / lr instead of lr_t;
`LambdaLR` over the same warmup + cosine schedule (`lr_schedule`, the one hand-written part);
`torch.nn.utils.clip_grad_norm_` for global-norm clipping (grad_clip=0: none).
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from qkstudy.config import TrainConfig


def lr_schedule(step: int, cfg: TrainConfig) -> float:
    """Learning rate for update number `step` (0-based): linear warmup, then cosine to min_lr
    (mlx_gpt.optim.lr_schedule's formula)."""
    warmup = float(cfg.warmup_steps)
    if step < warmup:
        return cfg.lr * (step + 1.0) / (warmup + 1.0)
    decay_steps = max(1.0, float(cfg.steps - cfg.warmup_steps))
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = min(max((step - warmup) / decay_steps, 0.0), 1.0)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - min_lr)


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether weight decay applies: every parameter with ndim >= 2 (as nanoGPT)."""
    return param.ndim >= 2


def make_optimizer(cfg: TrainConfig, named_params: dict[str, torch.nn.Parameter]
                   ) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over `named_params` with its learning-rate schedule."""
    decay = [p for name, p in named_params.items() if decays(name, p)]
    other = [p for name, p in named_params.items() if not decays(name, p)]
    weight_decay = cfg.weight_decay / cfg.lr if cfg.independent_wd else cfg.weight_decay
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return opt, LambdaLR(opt, lambda step: lr_schedule(step, cfg) / cfg.lr)


def update(opt: torch.optim.AdamW, schedule: LambdaLR, grad_clip: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the .grad tensors to global norm `grad_clip` (0: no clipping) and take one step.
    Returns (pre-clip gradient norm, learning rate used) as 0-d tensors."""
    params = [p for group in opt.param_groups for p in group["params"]]
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:  # the norm as clip_grad_norm_ computes it, the gradients untouched
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad)
                                                     for p in params]))
    lr = torch.tensor(opt.param_groups[0]["lr"], dtype=torch.float32, device=norm.device)
    opt.step()
    schedule.step()
    return norm, lr
