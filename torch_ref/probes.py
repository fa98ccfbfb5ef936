"""The probes (qkstudy/probes.py) on torch tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from qkstudy import probes

from .model import GPT

OPS = SimpleNamespace(  # MPS has no float64: the numbers leave the device as float32
    where=torch.where, f32=lambda x: x.float(),
    numbers=lambda values: torch.cat([v.float().reshape(-1) for v in values]).cpu().double().tolist())


def collect(model: GPT, x: torch.Tensor, y: torch.Tensor, step: int) -> list[dict]:
    """Every forward and gradient probe on the batch (x, y), for params after `step` updates;
    through torch.autograd.grad, so the parameters' .grad is left alone."""
    named = dict(model.named_parameters())
    with torch.enable_grad():
        captures: list[dict] = []
        logits = model(x, captures)
        total, ce, _ = model.loss(logits, y)
        grads = dict(zip(named, torch.autograd.grad(total, list(named.values()))))
    captures = [{k: v.detach() for k, v in c.items()} for c in captures]
    values = probes.collected(model.args, captures, logits.detach(), ce.detach(),
                              snapshot(model, copy=False), grads, OPS)
    return probes.rows(step, values, OPS)


def snapshot(model: GPT, copy: bool = True) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() if copy else p.detach() for k, p in model.named_parameters()}


def update_stats(step: int, before: dict[str, torch.Tensor],
                 after: dict[str, torch.Tensor]) -> list[dict]:
    """update_rms_ratio/<group> of update `step` from the parameters before and after it."""
    return probes.rows(step, probes.update_ratios(before, after, OPS), OPS)
