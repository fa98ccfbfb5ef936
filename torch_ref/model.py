"""The mlx_gpt decoder in PyTorch: same architecture, same parameter names and shapes.

Token + learned position embeddings, pre-LN blocks, causal multi-head attention with optional
QK-norm and soft-capped logits, exact-erf GELU MLP of width 4*d_model, final LayerNorm, tied head over the vocab padded
to a multiple of 64, no dropout. Every norm uses eps 1e-5, as mlx_gpt/model.py does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from qkstudy.config import NORM_EPS, ModelArgs, engine_kind
from qkstudy.variants import henry_scale

__all__ = ["GPT", "HeadNorm", "ModelArgs", "cross_entropy", "objective_terms"]


class HeadNorm(nn.Module):
    """QK-norm over head_dim with a gain of shape (head_dim,) shared by the heads of a layer.

    rmsnorm: x * rsqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019), as mx.fast.rms_norm;
    layernorm: mean-centred, no bias (Wortsman et al. 2023), as mx.fast.layer_norm(x, w, None).
    """

    KINDS = {"rmsnorm": lambda x, w: x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)
                                                    + NORM_EPS) * w,
             "layernorm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None, NORM_EPS)}

    def __init__(self, head_dim: int, kind: str):
        super().__init__()
        self.kind = engine_kind(kind, self.KINDS, "torch")
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.KINDS[self.kind](x, self.weight)


class QKScale(nn.Module):
    """Henry et al. (2020)'s learnable softmax scale g (one a layer): the variant l2norm."""

    def __init__(self, value: float):
        super().__init__()
        self.weight = nn.Parameter(torch.full((1,), value))


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + NORM_EPS)


# each qkstudy/variants.py entry, implemented once: its modules and how it normalises q and k
VARIANT_MODULES = ("rmsnorm", "layernorm", "l2norm")


class CausalSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.d_model // args.n_heads
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=args.bias)
        if args.qk_norm != "none":
            engine_kind(args.qk_norm, dict.fromkeys(VARIANT_MODULES), "torch")
        if args.qk_norm in HeadNorm.KINDS:
            self.q_norm = HeadNorm(self.head_dim, args.qk_norm)
            self.k_norm = HeadNorm(self.head_dim, args.qk_norm)
        elif args.qk_norm == "l2norm":
            self.qk_scale = QKScale(henry_scale(args.block_size, self.head_dim))
        self.qk_norm = args.qk_norm
        self.softcap = args.attn_softcap
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v split into heads, before QK-norm: each (B, nh, T, hs)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        return tuple(t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))

    def normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.qk_norm == "none":
            return q, k
        if self.qk_norm == "l2norm":
            return l2_normalise(q), l2_normalise(k)
        return self.q_norm(q), self.k_norm(k)

    def scaled(self, q: torch.Tensor) -> torch.Tensor:
        """q times the softmax scale: 1/sqrt(head_dim), or l2norm's learnable g."""
        return q * (self.qk_scale.weight if self.qk_norm == "l2norm" else self.scale)

    def capped(self, scores: torch.Tensor) -> torch.Tensor:
        """Soft-capping (Gemma 2): C*tanh(scores/C); identity when off."""
        if not self.softcap:
            return scores
        return self.softcap * torch.tanh(scores * (1.0 / self.softcap))

    def forward(self, x: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
        """The attention, computed once. With `capture` (a dict) it is written out and keeps
        what the probes read: q and k before and after QK-norm, the scaled logits before any
        cap, the capped ones the softmax sees, the probabilities and the causal mask."""
        B, T, C = x.shape
        q_raw, k_raw, v = self.heads(x)
        q, k = self.normed(q_raw, k_raw)
        if capture is not None:
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            logits = self.scaled(q) @ k.transpose(-2, -1)  # (B, nh, T, T)
            capped = self.capped(logits)
            probs = torch.softmax(capped.masked_fill(~causal, float("-inf")), dim=-1)
            capture.update(q=q_raw, k=k_raw, q_normed=q, k_normed=k, logits=logits,
                           capped=capped, probs=probs, causal=causal)
            y = probs @ v
        elif self.softcap:  # scaled_dot_product_attention has no soft-cap: written out
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            scores = self.capped(self.scaled(q) @ k.transpose(-2, -1))  # (B, nh, T, T)
            y = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        elif self.qk_norm == "l2norm":  # a learnable scale: q carries it into the fused kernel
            y = F.scaled_dot_product_attention(self.scaled(q), k, v, is_causal=True, scale=1.0)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, nh*hs)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc = nn.Linear(args.d_model, 4 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(4 * args.d_model, args.d_model, bias=args.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # exact erf GELU, as mlx.nn.gelu


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln1 = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)
        self.attn = CausalSelfAttention(args)
        self.ln2 = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), capture)
        x = x + self.mlp(self.ln2(x))
        if capture is not None:
            capture["residual"] = x
        return x


class GPT(nn.Module):
    """Weights start at torch's defaults: load the MLX initial weights (crosscheck.convert)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.wte = nn.Embedding(args.padded_vocab, args.d_model)
        self.wpe = nn.Embedding(args.block_size, args.d_model)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.depth))
        self.ln_f = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)

    def hidden(self, idx: torch.Tensor, captures: list[dict] | None = None) -> torch.Tensor:
        """Final normed hidden states; with `captures` (a list) one dict per block is appended
        (what its attention keeps, and the residual stream after the block)."""
        x = self.embed(idx)
        for block in self.blocks:
            capture = None if captures is None else {}
            x = block(x, capture)
            if captures is not None:
                captures.append(capture)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, captures: list[dict] | None = None) -> torch.Tensor:
        return self.hidden(idx, captures) @ self.wte.weight.T  # (B, T, padded_vocab)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats over the padded vocab, as mlx_gpt.model."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())


def objective_terms(logits: torch.Tensor, targets: torch.Tensor, z_loss: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross-entropy + z-loss term, cross-entropy, z-loss term), as mlx_gpt GPT.objective:
    the term is z_loss * mean over positions of logsumexp(logits)^2 (0 when z_loss is 0)."""
    ce = cross_entropy(logits, targets)
    if not z_loss:
        return ce, ce, torch.zeros((), dtype=ce.dtype, device=ce.device)
    z = z_loss * torch.logsumexp(logits, dim=-1).square().mean()
    return ce + z, ce, z
