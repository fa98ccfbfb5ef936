"""torch_ref's side of the engine seam (qkstudy/backends.py): the names the core finds it by."""

from __future__ import annotations

from qkstudy.config import TrainConfig

from .device import describe, memory_limit, resolve_device
from .engine import Engine, preflight
from .hardware import facts, matmul_gflops, peak_memory_bytes

__all__ = ["Engine", "device", "facts", "matmul_gflops", "memory_limit",
           "peak_memory_bytes", "preflight"]


def device(cfg: TrainConfig) -> str:
    """The device `device=` resolves to here, described ("cpu", "cuda:0 (NVIDIA H200)")."""
    return describe(resolve_device(cfg.device))
