"""The QK-norm variants, one row each: the config's choices, the arms, their words and colours,
the engines that implement them, their parameters and logit bound."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

ENGINES = ("mlx", "torch")  # backend=: mlx_gpt/, torch_ref/
# the probe of each variant parameter's largest |value| (qkstudy/probes.py)
PARAMETER_PROBES = {"q_norm": "q_norm_gain_max_abs", "k_norm": "k_norm_gain_max_abs",
                    "qk_scale": "qk_scale"}


@dataclass(frozen=True)
class Variant:
    """norm: how each head's q and k are normalised over head_dim, "rms", "layer" (mean-centred,
    no bias), "l2" (unit length) or None; gains: a learnable gain per dimension (q_norm, k_norm,
    shared by a layer's heads, init 1); scale_init: a learnable softmax scale qk_scale, one a
    layer, in place of 1/sqrt(head_dim), starting at scale_init(block_size, head_dim);
    logit_bound(largest |value| of each of its parameters by name, head_dim): what no attention
    logit exceeds, or None."""

    name: str
    label: str  # the arm in words (reports, charts)
    colour: str  # the arm's colour in every chart
    engines: tuple[str, ...]  # the engines that implement it
    norm: str | None = None
    gains: bool = False
    scale_init: Callable[[int, int], float] | None = None
    logit_bound: Callable[[dict[str, Any], int], Any] | None = None

    def parameters(self, block_size: int, head_dim: int) -> dict[str, tuple]:
        gains = {n: ((head_dim,), 1.0) for n in ("q_norm", "k_norm")} if self.gains else {}
        if not self.scale_init:
            return gains
        return gains | {"qk_scale": ((1,), self.scale_init(block_size, head_dim))}


def gained_bound(largest: dict[str, Any], head_dim: int):
    """rms- or layer-normalised vectors have norm <= sqrt(head_dim) before their gains."""
    return largest["q_norm"] * largest["k_norm"] * math.sqrt(head_dim)


NONE = Variant("none", "QK-norm off", "#d95f02", ENGINES)  # q and k as they are
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    # Qwen3's placement
    Variant("rmsnorm", "QK-norm on (rmsnorm)", "#1b9e77", ENGINES, "rms", gains=True,
            logit_bound=gained_bound),
    # Wortsman et al. (2023), Dehghani et al. (2023)
    Variant("layernorm", "QK-norm on (layernorm)", "#7570b3", ENGINES, "layer", gains=True,
            logit_bound=gained_bound),
    # Henry et al. (2020), QKNorm: g starts at log2(L^2 - L) for sequences of length L (the
    # block); unit vectors, so |logit| <= |g|
    Variant("l2norm", "QK-norm on (l2norm)", "#1f78b4", ENGINES, "l2",
            scale_init=lambda block, head_dim: math.log2(block * block - block),
            logit_bound=lambda largest, head_dim: largest["qk_scale"]),
)}
CHOICES = (NONE.name, *VARIANTS)  # qk_norm=


def variant(kind: str) -> Variant:
    return NONE if kind == NONE.name else VARIANTS[kind]


def built_by(engine: str, kind: str, norms: dict[str, Any]) -> Variant:
    """The row of `kind` for a model `engine` builds with these norms; UsageError, naming those
    it implements, unless its row names the engine and the engine has its norm."""
    def implements(row: Variant) -> bool:
        return engine in row.engines and (row.norm is None or row.norm in norms)

    row = variant(kind)
    if not implements(row):
        can = [v.name for v in (NONE, *VARIANTS.values()) if implements(v)]
        raise UsageError(f"qk_norm={kind} is not implemented by the {engine} engine; it "
                         f"implements: {', '.join(can)}")
    return row
