"""The QK-norm variants, one row each: choices, arms, parameters and logit bound."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """norm: how each head's q and k are normalised over head_dim, "rms", "layer" (mean-centred,
    no bias), "l2" (unit length) or None; gains: a learnable gain per dimension (q_norm, k_norm,
    shared by a layer's heads, init 1); scale_init: a learnable softmax scale qk_scale, one a
    layer, in place of 1/sqrt(head_dim), starting at scale_init(block_size, head_dim)."""

    name: str
    norm: str | None
    gains: bool = False
    scale_init: Callable[[int, int], float] | None = None

    def parameters(self, block_size: int, head_dim: int) -> dict[str, tuple]:
        gains = {n: ((head_dim,), 1.0) for n in ("q_norm", "k_norm")} if self.gains else {}
        if not self.scale_init:
            return gains
        return gains | {"qk_scale": ((1,), self.scale_init(block_size, head_dim))}


NONE = Variant("none", None)  # qk_norm=none: q and k as they are
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("rmsnorm", "rms", gains=True),  # Qwen3's placement
    Variant("layernorm", "layer", gains=True),  # Wortsman et al. (2023), Dehghani et al. (2023)
    # Henry et al. (2020), QKNorm: g starts at log2(L^2 - L) for sequences of length L (the block)
    Variant("l2norm", "l2", scale_init=lambda block, head_dim: math.log2(block * block - block)),
)}


def variant(kind: str) -> Variant:
    return NONE if kind == "none" else VARIANTS[kind]
