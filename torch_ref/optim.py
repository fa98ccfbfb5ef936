"""mlx_gpt/optim.py's optimizer with PyTorch's own pieces, the core's rule (qkstudy/optimizer.py):
`torch.optim.AdamW` in two groups (`decays` with `decay_coefficient`, the rest without),
`Schedule` over `learning_rates`, and `clip_grad_norm_`'s two halves (grad_clip=0: no clipping).
"""

from __future__ import annotations

import torch

from qkstudy.config import TrainConfig
from qkstudy.optimizer import decay_coefficient, decays, learning_rates


class Schedule:
    """The rate of every update, set on the optimizer's groups before each step. Each rate is
    base x (rate / base), as LambdaLR computes it, so runs keep their numbers to the bit."""

    def __init__(self, opt: torch.optim.AdamW, cfg: TrainConfig):
        self.opt, self.base = opt, cfg.lr
        self.rates = [self.base * (r / self.base) for r in learning_rates(cfg).tolist()]
        self.resume(0)

    def rate(self, update: int) -> float:  # past the last update, the last one's
        return self.rates[min(update, len(self.rates) - 1)]

    def resume(self, updates: int) -> None:
        """Continue after `updates` updates (the next one uses rate(updates))."""
        self.updates = updates
        for group in self.opt.param_groups:
            group["lr"] = self.rate(updates)


def make_optimizer(cfg: TrainConfig, named_params: dict[str, torch.nn.Parameter]
                   ) -> tuple[torch.optim.AdamW, Schedule]:
    decay = [p for name, p in named_params.items() if decays(name, tuple(p.shape))]
    other = [p for name, p in named_params.items() if not decays(name, tuple(p.shape))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": decay_coefficient(cfg)},
                             {"params": other, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return opt, Schedule(opt, cfg)


def clip_and_step(opt: torch.optim.AdamW, schedule: Schedule, grad_clip: float
                  ) -> torch.Tensor:
    """Clip the .grad tensors to global norm `grad_clip` and take one step. Returns the pre-clip
    gradient norm as a 0-d tensor, not read: nothing here waits for the device."""
    params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)
    opt.step()
    schedule.resume(schedule.updates + 1)
    return norm


def update(opt: torch.optim.AdamW, schedule: Schedule, grad_clip: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """clip_and_step, returning (pre-clip gradient norm, learning rate used) as 0-d tensors."""
    lr = opt.param_groups[0]["lr"]
    norm = clip_and_step(opt, schedule, grad_clip)
    return norm, torch.tensor(lr, dtype=torch.float32, device=norm.device)
