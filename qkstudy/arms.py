"""The arms of a sweep: none, a qk_norm variant, softcap<C> or zloss<W>, each one change."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from .config import TrainConfig, short_number
from .errors import UsageError
from .variants import CHOICES, VARIANTS

OFF = "none"
CONTROLS: dict[str, Any] = {"qk_norm": "none", "attn_softcap": 0.0, "z_loss": 0.0}
VOCABULARY = ", ".join([*CHOICES, "softcap<C> (e.g. softcap50)", "zloss<W> (e.g. zloss1e-4)"])
_NUMBERED = re.compile(r"(softcap|zloss)(.+)")
_KEY_OF = {"softcap": "attn_softcap", "zloss": "z_loss"}


def arm_changes(name: str) -> dict[str, Any]:
    if name == OFF:
        return {}
    if name in VARIANTS:  # qkstudy/variants.py
        return {"qk_norm": name}
    match = _NUMBERED.fullmatch(name)
    if match:
        try:
            value = float(match.group(2))
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return {_KEY_OF[match.group(1)]: value}
        raise UsageError(f"arm {name!r}: {match.group(1)} needs a number > 0 after it "
                         f"(e.g. {'softcap50' if match.group(1) == 'softcap' else 'zloss1e-4'})")
    raise UsageError(f"unknown arm {name!r}; arms are: {VOCABULARY}")


def arm_of(values: Mapping[str, Any]) -> str:
    """The arm of a config dict; several controls on are joined with '+'."""
    qk_norm = values.get("qk_norm")
    parts = [] if qk_norm in (None, OFF) else [str(qk_norm)]
    for key, prefix in (("attn_softcap", "softcap"), ("z_loss", "zloss")):
        value = values.get(key)
        if (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value):
            parts.append(prefix + short_number(value))
    return "+".join(parts) or OFF


def arm_name(cfg: TrainConfig) -> str:
    return arm_of(dataclasses.asdict(cfg))


def canonical(name: str) -> str:
    """softcap50.0 -> softcap50; UsageError if unknown."""
    return arm_name(dataclasses.replace(TrainConfig(), **arm_changes(name)))


def parse_arms(key: str, text: str) -> tuple[str, ...]:
    names = [canonical(t.strip()) for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError(f"{key} needs at least one value")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{key}: {', '.join(twice)} given more than once")
    return tuple(names)


def apply_arm(cfg: TrainConfig, name: str) -> TrainConfig:
    return dataclasses.replace(cfg, **{**CONTROLS, **arm_changes(name)})
