"""A plain nanoGPT decoder in MLX with QK-norm, soft-capping and z-loss (docs/model.md)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from qkstudy.config import NORM_EPS, ModelArgs
from qkstudy.parameters import initial_weights
from qkstudy.variants import built_by
# each qkstudy/variants.py norm over head_dim, with its gain w (None: no gain)
NORMS = {"rms": lambda x, w: mx.fast.rms_norm(x, w, NORM_EPS),
         "layer": lambda x, w: mx.fast.layer_norm(x, w, None, NORM_EPS),
         "l2": lambda x, w: x * mx.rsqrt(mx.sum(mx.square(x), axis=-1, keepdims=True) + NORM_EPS)}


class CausalSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.d_model // args.n_heads
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=args.bias)
        self.variant = built_by("mlx", args.qk_norm, NORMS)  # its parameters and its norm
        for name, (shape, value) in self.variant.parameters(args.block_size, self.head_dim).items():
            setattr(self, name, nn.Module())  # its parameter is attn.<name>.weight
            getattr(self, name).weight = mx.full(shape, value)
        self.softcap = args.attn_softcap
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def heads(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """q, k, v: each (B, nh, T, hs)."""
        B, T, C = x.shape
        return tuple(t.reshape(B, T, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
                     for t in mx.split(self.qkv(x), 3, axis=-1))

    def normed(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        if self.variant.norm is None:
            return q, k
        norm = NORMS[self.variant.norm]
        if self.variant.gains:
            return norm(q, self.q_norm.weight), norm(k, self.k_norm.weight)
        return norm(q, None), norm(k, None)

    def capped(self, scores: mx.array) -> mx.array:
        if not self.softcap:
            return scores
        return self.softcap * mx.tanh(scores * (1.0 / self.softcap))

    def __call__(self, x: mx.array, capture: dict | None = None) -> mx.array:
        """The fused kernel, or attention written out (a probe capture, a soft-cap)."""
        B, T, C = x.shape
        q_raw, k_raw, v = self.heads(x)
        q, k = self.normed(q_raw, k_raw)
        # a learnable softmax scale (variants.py's scale_init): q carries it into the kernel
        qs, scale = (q * self.qk_scale.weight, 1.0) if self.variant.scale_init else (q, self.scale)
        if capture is None and not self.softcap:
            y = mx.fast.scaled_dot_product_attention(qs, k, v, scale=scale, mask="causal")
        else:
            causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
            logits = (qs * scale) @ k.transpose(0, 1, 3, 2)  # (B, nh, T, T)
            capped = self.capped(logits)
            y = mx.softmax(mx.where(causal, capped, -mx.inf), axis=-1, precise=True) @ v
            if capture is not None:
                capture.update(q=q_raw, k=k_raw, q_normed=q, k_normed=k, logits=logits,
                               capped=capped, causal=causal)
        return self.proj(y.transpose(0, 2, 1, 3).reshape(B, T, C))  # (B, T, nh*hs)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.fc = nn.Linear(args.d_model, 4 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(4 * args.d_model, args.d_model, bias=args.bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.proj(nn.gelu(self.fc(x)))  # exact GELU, as torch's


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
        self.args = args
        self.wte = nn.Embedding(args.padded_vocab, args.d_model)
        self.wpe = nn.Embedding(args.block_size, args.d_model)
        self.blocks = [Block(args) for _ in range(args.depth)]
        self.ln_f = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)

    def __call__(self, idx: mx.array, captures: list[dict] | None = None) -> mx.array:
        """Logits (B, T, padded_vocab); with `captures`, one dict per block appended to it."""
        x = self.wte(idx) + self.wpe(mx.arange(idx.shape[1]))  # (B, T, C)
        for block in self.blocks:
            capture = None if captures is None else {}
            x = block(x, capture)
            if captures is not None:
                captures.append(capture)
        return self.ln_f(x) @ self.wte.weight.T  # the tied head

    def loss(self, logits: mx.array, targets: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(objective, mean cross-entropy, z-loss term W * mean logsumexp(logits)^2)."""
        lse = mx.logsumexp(logits, axis=-1)
        ce = mx.mean(lse - mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0])
        z = self.args.z_loss * mx.mean(mx.square(lse)) if self.args.z_loss else mx.array(0.0)
        return ce + z, ce, z


def init_weights(model: GPT, seed: int) -> None:
    model.load_weights([(k, mx.array(v)) for k, v in initial_weights(model.args, seed).items()])
    mx.eval(model.parameters())
