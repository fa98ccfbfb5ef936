"""mlx_gpt's side of the engine seam (qkstudy/backends.py): the names the core finds it by."""

from __future__ import annotations

import shutil
import sys

import mlx.core as mx

from qkstudy.config import TrainConfig
from qkstudy.errors import UsageError

from .engine import Engine
from .hardware import facts, matmul_gflops, peak_memory_bytes

__all__ = ["Engine", "device", "facts", "matmul_gflops", "memory_limit",
           "peak_memory_bytes", "preflight"]


def device(cfg: TrainConfig) -> str:
    """MLX's default device, "cpu" or "gpu" (MLX picks it; a run has no device key)."""
    return str(mx.default_device().type).rsplit(".", 1)[-1]


def preflight(cfg: TrainConfig) -> None:
    """On Linux MLX's CPU backend compiles the step's fused kernels with g++ at first use:
    without it the run would fail at its first step, after its folder is made."""
    if sys.platform.startswith("linux") and device(cfg) == "cpu" and not shutil.which("g++"):
        raise UsageError("MLX's CPU backend compiles its kernels with g++, which is not on PATH: "
                         "install it (Debian/Ubuntu: apt-get install g++) or run with "
                         "backend=torch")


def memory_limit(cfg: TrainConfig, runs: int | None = None) -> None:
    """MLX trains in the machine's memory (unified on a Mac): the core's own check."""
    return None
