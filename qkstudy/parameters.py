"""The model's parameters without a framework: names, shapes, counts, initial values."""

from __future__ import annotations

import math
import zlib

import numpy as np

from .config import ModelArgs
from .variants import variant

def parameter_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    c, bias, head_dim = args.d_model, args.bias, args.d_model // args.n_heads
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (args.padded_vocab, c),
                                          "wpe.weight": (args.block_size, c)}
    own = variant(args.qk_norm).parameters(args.block_size, head_dim)

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = (c,)
        if bias:
            shapes[f"{name}.bias"] = (c,)

    def linear(name: str, n_in: int, n_out: int) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in)
        if bias:
            shapes[f"{name}.bias"] = (n_out,)

    for i in range(args.depth):
        b = f"blocks.{i}"
        norm(f"{b}.ln1")
        linear(f"{b}.attn.qkv", c, 3 * c)
        linear(f"{b}.attn.proj", c, c)
        for name, (shape, _) in own.items():
            shapes[f"{b}.attn.{name}.weight"] = shape
        norm(f"{b}.ln2")
        linear(f"{b}.mlp.fc", c, 4 * c)
        linear(f"{b}.mlp.proj", 4 * c, c)
    norm("ln_f")
    return shapes


def count_params(args: ModelArgs) -> dict[str, int]:
    sizes = {name: math.prod(shape) for name, shape in parameter_shapes(args).items()}
    total = sum(sizes.values())
    embedding = sizes["wte.weight"] + sizes["wpe.weight"]
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def initial_weights(args: ModelArgs, seed: int) -> dict[str, np.ndarray]:
    """nanoGPT's init: N(0, 0.02), residual projections / sqrt(2 depth), biases 0, gains 1."""
    residual_std = 0.02 / math.sqrt(2 * args.depth)
    own = variant(args.qk_norm).parameters(args.block_size, args.d_model // args.n_heads)
    weights = {}
    for name, shape in parameter_shapes(args).items():
        if name.endswith(".weight") and len(shape) == 2:
            std = residual_std if name.endswith("proj.weight") else 0.02
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            weights[name] = (std * rng.standard_normal(shape, dtype=np.float64)).astype(np.float32)
        elif name.endswith(".bias"):
            weights[name] = np.zeros(shape, np.float32)
        elif (key := name.split(".attn.")[-1].removesuffix(".weight")) in own:  # the variant's
            weights[name] = np.full(shape, own[key][1], np.float32)
        else:  # the LayerNorm gains
            weights[name] = np.ones(shape, np.float32)
    return weights


def flops_per_token(args: ModelArgs) -> float:
    """Training FLOPs per token, 6 N + 12 L H Q T (PaLM app. B); N: the matmul parameters."""
    n = count_params(args)["total"] - args.block_size * args.d_model  # minus the position table
    attention = 12 * args.depth * args.n_heads * (args.d_model // args.n_heads) * args.block_size
    return 6.0 * n + attention
