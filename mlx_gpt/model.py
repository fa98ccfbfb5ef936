"""A plain nanoGPT decoder in MLX, with QK-norm as its switch (and two rival logit controls,
off by default: attention-logit soft-capping and the z-loss term of GPT.objective).

Token + learned position embeddings, pre-LN blocks (LayerNorm), causal multi-head attention,
GELU MLP of width 4*d_model, final LayerNorm, tied input/output embeddings, no dropout.
Parameter names and shapes match torch_ref/model.py one to one (nn.Linear is (out, in) in both).
"""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import mlx.nn as nn

from qkstudy.config import NORM_EPS, ModelArgs, engine_kind
from qkstudy.parameters import initial_weights
from qkstudy.variants import henry_scale

from . import kernels as cpu_kernels

KERNELS = ("auto", "library", "cpu")


def resolve_kernels(kernels: str) -> str:
    """'cpu' (mlx_gpt/kernels.py: exp/erf as multiply-adds, written-out attention) or 'library'
    (mx.fast.scaled_dot_product_attention, nn.gelu, nn.losses.cross_entropy). 'auto' picks cpu
    on MLX's CPU device, where the library computes exp/erf one element at a time, else library.
    Both compute the same function (agreement within float32 rounding is tested)."""
    if kernels == "auto":
        return "cpu" if mx.default_device().type == mx.DeviceType.cpu else "library"
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
    return kernels


class HeadNorm(nn.Module):
    """QK-norm: normalise each head's q (or k) over head_dim, then a learnable gain (init 1).

    rmsnorm as in OLMo 2 / Qwen3; layernorm (mean-centred) as in Wortsman et al. 2023. The gain
    has shape (head_dim,), shared by the heads of a layer, as in Qwen3's q_norm / k_norm.
    """

    KINDS = {"rmsnorm": lambda x, w: mx.fast.rms_norm(x, w, NORM_EPS),
             "layernorm": lambda x, w: mx.fast.layer_norm(x, w, None, NORM_EPS)}

    def __init__(self, head_dim: int, kind: str):
        super().__init__()
        self.kind = engine_kind(kind, self.KINDS, "mlx")
        self.weight = mx.ones((head_dim,))

    def __call__(self, x: mx.array) -> mx.array:
        return self.KINDS[self.kind](x, self.weight)


class QKScale(nn.Module):
    """Henry et al. (2020)'s learnable softmax scale g (one a layer): the variant l2norm."""

    def __init__(self, value: float):
        super().__init__()
        self.weight = mx.full((1,), value)


def l2_normalise(x: mx.array) -> mx.array:
    return x * mx.rsqrt(mx.sum(mx.square(x), axis=-1, keepdims=True) + NORM_EPS)


# each qkstudy/variants.py entry, implemented once: its modules and how it normalises q and k
VARIANT_MODULES = ("rmsnorm", "layernorm", "l2norm")


class CausalSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.d_model // args.n_heads
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=args.bias)
        if args.qk_norm != "none":
            engine_kind(args.qk_norm, dict.fromkeys(VARIANT_MODULES), "mlx")
        if args.qk_norm in HeadNorm.KINDS:
            self.q_norm = HeadNorm(self.head_dim, args.qk_norm)
            self.k_norm = HeadNorm(self.head_dim, args.qk_norm)
        elif args.qk_norm == "l2norm":
            self.qk_scale = QKScale(henry_scale(args.block_size, self.head_dim))
        self.qk_norm = args.qk_norm
        self.kernels = args.kernels
        self.softcap = args.attn_softcap
        # The softmax scale stays 1/sqrt(head_dim) in every arm: QK-norm changes nothing else.
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def heads(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """q, k, v split into heads, before QK-norm: each (B, nh, T, hs)."""
        B, T, C = x.shape
        q, k, v = mx.split(self.qkv(x), 3, axis=-1)
        return tuple(t.reshape(B, T, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
                     for t in (q, k, v))

    def normed(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        if self.qk_norm == "none":
            return q, k
        if self.qk_norm == "l2norm":
            return l2_normalise(q), l2_normalise(k)
        return self.q_norm(q), self.k_norm(k)

    def scaled(self, q: mx.array) -> mx.array:
        """q times the softmax scale: 1/sqrt(head_dim), or l2norm's learnable g."""
        return q * (self.qk_scale.weight if self.qk_norm == "l2norm" else self.scale)

    def capped(self, scores: mx.array) -> mx.array:
        """Soft-capping (Gemma 2): C*tanh(scores/C), so every |logit| < C; identity when off."""
        if not self.softcap:
            return scores
        tanh = cpu_kernels.tanh if self.kernels == "cpu" else mx.tanh
        return self.softcap * tanh(scores * (1.0 / self.softcap))

    def __call__(self, x: mx.array, capture: dict | None = None) -> mx.array:
        """The attention, computed once. With `capture` (a dict) it is written out and keeps
        what the probes read: q and k before and after QK-norm, the scaled logits before any
        cap, the capped ones the softmax sees, the probabilities and the causal mask."""
        B, T, C = x.shape
        q_raw, k_raw, v = self.heads(x)
        q, k = self.normed(q_raw, k_raw)
        if capture is not None:
            causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
            logits = self.scaled(q) @ k.transpose(0, 1, 3, 2)  # (B, nh, T, T)
            capped = self.capped(logits)
            probs = mx.softmax(mx.where(causal, capped, -mx.inf), axis=-1)
            capture.update(q=q_raw, k=k_raw, q_normed=q, k_normed=k, logits=logits,
                           capped=capped, probs=probs, causal=causal)
            y = probs @ v
        elif self.kernels == "cpu":  # written out so the softmax uses the vectorisable exp
            causal = mx.triu(mx.full((T, T), -1e30, dtype=q.dtype), k=1)
            scores = self.capped(self.scaled(q) @ k.transpose(0, 1, 3, 2)) + causal
            y = cpu_kernels.softmax(scores) @ v  # scores: (B, nh, T, T)
        elif self.softcap:  # the fused kernel has no soft-cap: the same maths written out
            causal = mx.triu(mx.full((T, T), -mx.inf, dtype=q.dtype), k=1)
            scores = self.capped(self.scaled(q) @ k.transpose(0, 1, 3, 2)) + causal
            y = mx.softmax(scores, axis=-1, precise=True) @ v
        elif self.qk_norm == "l2norm":  # a learnable scale: q carries it into the fused kernel
            y = mx.fast.scaled_dot_product_attention(self.scaled(q), k, v, scale=1.0,
                                                     mask="causal")
        else:
            y = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask="causal")
        return self.proj(y.transpose(0, 2, 1, 3).reshape(B, T, C))  # (B, T, nh*hs)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc = nn.Linear(args.d_model, 4 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(4 * args.d_model, args.d_model, bias=args.bias)
        self.gelu = cpu_kernels.gelu if args.kernels == "cpu" else nn.gelu

    def __call__(self, x: mx.array) -> mx.array:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln1 = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)
        self.attn = CausalSelfAttention(args)
        self.ln2 = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array, capture: dict | None = None) -> mx.array:
        x = x + self.attn(self.ln1(x), capture)
        x = x + self.mlp(self.ln2(x))
        if capture is not None:
            capture["residual"] = x
        return x


class GPT(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        args = dataclasses.replace(args, kernels=resolve_kernels(args.kernels))
        self.args, self.kernels = args, args.kernels
        self.wte = nn.Embedding(args.padded_vocab, args.d_model)
        self.wpe = nn.Embedding(args.block_size, args.d_model)
        self.blocks = [Block(args) for _ in range(args.depth)]
        self.ln_f = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)

    def embed(self, idx: mx.array) -> mx.array:
        return self.wte(idx) + self.wpe(mx.arange(idx.shape[1]))  # (B, T, C)

    def hidden(self, idx: mx.array, captures: list[dict] | None = None) -> mx.array:
        """Final normed hidden states (B, T, C); the tied head is `hidden @ wte.weight.T`.
        With `captures` (a list), one dict per block is appended: what its attention keeps
        (CausalSelfAttention) and the residual stream after the block."""
        x = self.embed(idx)
        for block in self.blocks:
            capture = None if captures is None else {}
            x = block(x, capture)
            if captures is not None:
                captures.append(capture)
        return self.ln_f(x)

    def __call__(self, idx: mx.array, captures: list[dict] | None = None) -> mx.array:
        return self.hidden(idx, captures) @ self.wte.weight.T  # (B, T, padded_vocab)

    def loss(self, idx: mx.array, targets: mx.array) -> mx.array:
        """Mean next-token cross-entropy in nats of the batch idx -> targets."""
        return cross_entropy(self(idx), targets, self.kernels)

    def objective(self, idx: mx.array, targets: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(training objective, cross-entropy, z-loss term) of the batch idx -> targets.

        The objective is the cross-entropy plus, with z_loss = W > 0, the z-loss term
        W * mean over positions of logsumexp(logits)^2 (Chowdhery et al. 2022; Wortsman et al.
        2023); with z_loss off it is the cross-entropy alone and the term is 0.
        """
        if not self.args.z_loss:
            ce = self.loss(idx, targets)
            return ce, ce, mx.zeros((), dtype=ce.dtype)
        return objective_terms(self(idx), targets, self.args.z_loss, self.kernels)


def init_weights(model: GPT, seed: int) -> None:
    """The run's initial weights: qkstudy.parameters' numpy scheme, the same in both engines."""
    model.load_weights([(k, mx.array(v)) for k, v in initial_weights(model.args, seed).items()])
    mx.eval(model.parameters())


def cross_entropy(logits: mx.array, targets: mx.array, kernels: str) -> mx.array:
    """Mean next-token cross-entropy in nats; kernels: 'cpu' or 'library' (GPT.kernels)."""
    if kernels == "library":
        return nn.losses.cross_entropy(logits, targets, reduction="mean")
    target_logits = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return mx.mean(cpu_kernels.logsumexp(logits, axis=-1) - target_logits)


def objective_terms(logits: mx.array, targets: mx.array, z_loss: float,
                    kernels: str) -> tuple[mx.array, mx.array, mx.array]:
    """(cross-entropy + z-loss term, cross-entropy, z-loss term): one log-sum-exp serves both."""
    lse = (cpu_kernels.logsumexp(logits, axis=-1) if kernels == "cpu"
           else mx.logsumexp(logits, axis=-1))
    target_logits = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = mx.mean(lse - target_logits)
    z = z_loss * mx.mean(mx.square(lse))
    return ce + z, ce, z
