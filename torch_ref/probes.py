"""The attention probes of mlx_gpt.probes, computed in torch on the fixed probe batch.

Rows are long format {"step", "layer", "name", "value"} with mlx_gpt's names, so a torch run's
probes/ parts read like an MLX run's and parity can compare them name by name.
"""

from __future__ import annotations

import torch

from .model import GPT, CausalSelfAttention


def attention_logits(attn: CausalSelfAttention, h: torch.Tensor) -> torch.Tensor:
    """Pre-softmax scaled logits (B, nh, T, T) with non-causal entries at -inf."""
    q, k, _ = attn.heads(h)
    q, k = attn.normed(q, k)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    T = logits.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=logits.device).tril()
    return logits.masked_fill(~causal, float("-inf"))


@torch.no_grad()
def measure(model: GPT, x: torch.Tensor, y: torch.Tensor, step: int) -> list[dict]:
    """Per layer: max attention logit, mean attention entropy (nats), entropy of the lowest head."""
    rows = []
    h = model.embed(x)
    for layer, block in enumerate(model.blocks):
        logits = attention_logits(block.attn, block.ln1(h))
        p = torch.softmax(logits, dim=-1)
        plogp = torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))
        per_head = (-plogp.sum(dim=-1)).mean(dim=(0, 2))  # (nh,)
        values = {"max_attention_logit": logits.max(), "attention_entropy_mean": per_head.mean(),
                  "attention_entropy_min_head": per_head.min()}
        rows += [{"step": step, "layer": layer, "name": name, "value": float(value)}
                 for name, value in values.items()]
        h = block(h)
    return rows
