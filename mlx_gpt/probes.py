"""Mechanistic probes on a fixed probe batch, outside the hot train step.

Rows are long format: {"step", "layer", "name", "value"}; layer = -1 for whole-model values.
"""

from __future__ import annotations

import mlx.core as mx

from .model import GPT


def attention_logits(attn, h: mx.array) -> mx.array:
    """Pre-softmax scaled logits (B, nh, T, T) with non-causal entries at -inf."""
    q, k, _ = attn.heads(h)
    q, k = attn.normed(q, k)
    logits = (q * attn.scale) @ k.transpose(0, 1, 3, 2)
    T = logits.shape[-1]
    causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
    return mx.where(causal, logits, -mx.inf)


def measure(model: GPT, x: mx.array, y: mx.array, step: int) -> list[dict]:
    rows = []
    h = model.embed(x)
    for layer, block in enumerate(model.blocks):
        logits = attention_logits(block.attn, block.ln1(h))
        p = mx.softmax(logits, axis=-1)
        entropy = -mx.sum(mx.where(p > 0, p * mx.log(p), 0.0), axis=-1)  # (B, nh, T)
        per_head = entropy.mean(axis=(0, 2))
        rows += [
            {"step": step, "layer": layer, "name": "max_attention_logit",
             "value": mx.max(logits).item()},
            {"step": step, "layer": layer, "name": "attention_entropy_mean",
             "value": per_head.mean().item()},
            {"step": step, "layer": layer, "name": "attention_entropy_min_head",
             "value": per_head.min().item()},
        ]
        h = block(h)
    return rows


def update_stats(step: int, before: dict, after: dict) -> list[dict]:
    return []
