"""The mlx_gpt decoder in PyTorch: same architecture, parameter names and shapes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from qkstudy.config import NORM_EPS, ModelArgs
from qkstudy.variants import built_by

# each qkstudy/variants.py norm over head_dim, with its gain w (None: no gain), as mlx_gpt's
NORMS = {"rms": lambda x, w: x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS) * (
             1.0 if w is None else w),
         "layer": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None, NORM_EPS),
         "l2": lambda x, w: x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + NORM_EPS)}


class CausalSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.d_model // args.n_heads
        self.qkv = nn.Linear(args.d_model, 3 * args.d_model, bias=args.bias)
        self.proj = nn.Linear(args.d_model, args.d_model, bias=args.bias)
        self.variant = built_by("torch", args.qk_norm, NORMS)  # its parameters and its norm
        for name, (shape, value) in self.variant.parameters(args.block_size, self.head_dim).items():
            setattr(self, name, nn.Module())  # its parameter is attn.<name>.weight
            getattr(self, name).weight = nn.Parameter(torch.full(shape, value))
        self.softcap = args.attn_softcap
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v: each (B, nh, T, hs)."""
        B, T, C = x.shape
        return tuple(t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
                     for t in self.qkv(x).split(C, dim=-1))

    def normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.variant.norm is None:
            return q, k
        norm = NORMS[self.variant.norm]
        if self.variant.gains:
            return norm(q, self.q_norm.weight), norm(k, self.k_norm.weight)
        return norm(q, None), norm(k, None)

    def capped(self, scores: torch.Tensor) -> torch.Tensor:
        return self.softcap * torch.tanh(scores * (1.0 / self.softcap)) if self.softcap else scores

    def forward(self, x: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q_raw, k_raw, v = self.heads(x)
        q, k = self.normed(q_raw, k_raw)
        # a learnable softmax scale (variants.py's scale_init): q carries it into the kernel
        qs, scale = (q * self.qk_scale.weight, 1.0) if self.variant.scale_init else (q, self.scale)
        if capture is None and not self.softcap:
            y = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale)
        else:
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            logits = (qs * scale) @ k.transpose(-2, -1)  # (B, nh, T, T)
            capped = self.capped(logits)
            y = torch.softmax(capped.masked_fill(~causal, float("-inf")), dim=-1) @ v
            if capture is not None:
                capture.update(q=q_raw, k=k_raw, q_normed=q, k_normed=k, logits=logits,
                               capped=capped, causal=causal)
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
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.wte = nn.Embedding(args.padded_vocab, args.d_model)
        self.wpe = nn.Embedding(args.block_size, args.d_model)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.depth))
        self.ln_f = nn.LayerNorm(args.d_model, eps=NORM_EPS, bias=args.bias)

    def forward(self, idx: torch.Tensor, captures: list[dict] | None = None) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            capture = None if captures is None else {}
            x = block(x, capture)
            if captures is not None:
                captures.append(capture)
        return self.ln_f(x) @ self.wte.weight.T  # the tied head

    def loss(self, logits: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())
        if not self.args.z_loss:
            return ce, ce, torch.zeros((), dtype=ce.dtype, device=ce.device)
        z = self.args.z_loss * torch.logsumexp(logits, dim=-1).square().mean()
        return ce + z, ce, z
