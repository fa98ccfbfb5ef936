"""The QK-norm variants, one entry each: what the config accepts, the arms, the parameters and
their initial values, the probes' logit bound and the words the docs and reports use come from
here. Each engine implements every entry once (mlx_gpt/model.py, torch_ref/model.py) and
refuses, in one line, an entry it lacks.

A variant's extra parameters live in each attention module under `attn.<name>.weight`, so the
probes' parameter groups merge them into `qk_norm` and weight decay (matrices only) never
touches them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

HEAD_DIM = "head_dim"  # a parameter shape entry that stands for the head dimension


@dataclass(frozen=True)
class Variant:
    name: str
    words: str  # how the docs and the report describe it
    source: str  # the model or paper it follows
    # extra parameters of each attention: module name -> (shape, initial value from
    # (block_size, head_dim))
    params: dict[str, tuple[tuple[int | str, ...], Callable[[int, int], float]]]
    # the probes' bound on |scaled logit|: "gains" (max|g_q| max|g_k| sqrt(head_dim): RMS- or
    # mean-centred vectors of norm <= sqrt(head_dim) times their gains) or "scale" (|g|: unit
    # vectors times a learnable scale)
    bound: str

    def shapes(self, head_dim: int) -> dict[str, tuple[int, ...]]:
        return {name: tuple(head_dim if d == HEAD_DIM else int(d) for d in shape)
                for name, (shape, _) in self.params.items()}

    def initial(self, name: str, block_size: int, head_dim: int) -> float:
        return self.params[name][1](block_size, head_dim)


def _one(block_size: int, head_dim: int) -> float:
    return 1.0


def henry_scale(block_size: int, head_dim: int) -> float:
    """Henry et al. (2020)'s initial g: log2(L^2 - L) for sequences of length L (here the block)."""
    return math.log2(block_size * block_size - block_size)


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("rmsnorm", "RMSNorm of each head's q and k over head_dim, a learnable gain per "
            "dimension, softmax scale 1/sqrt(head_dim)", "Qwen3's placement",
            {"q_norm": ((HEAD_DIM,), _one), "k_norm": ((HEAD_DIM,), _one)}, "gains"),
    Variant("layernorm", "LayerNorm (mean-centred, no bias) of each head's q and k over "
            "head_dim, a learnable gain per dimension, softmax scale 1/sqrt(head_dim)",
            "Wortsman et al. (2023), Dehghani et al. (2023)",
            {"q_norm": ((HEAD_DIM,), _one), "k_norm": ((HEAD_DIM,), _one)}, "gains"),
    Variant("l2norm", "each head's q and k L2-normalised over head_dim, the softmax scale "
            "1/sqrt(head_dim) replaced by one learnable scale g per layer, initialised to "
            "log2(L^2 - L) for the block length L", "Henry et al. (2020), QKNorm",
            {"qk_scale": ((1,), henry_scale)}, "scale"),
)}


def variant(kind: str) -> Variant | None:
    """The entry of a qk_norm kind (None for "none")."""
    return VARIANTS.get(kind)
