"""MLX's part of the benchmarks (qkstudy/bench/step.py times the run's own Engine): MLX's
facts (version, device, BLAS, CPU kernel build), its float32 matmul peak and its peak memory."""

from __future__ import annotations

import time

import mlx.core as mx

from qkstudy.config import TrainConfig

from . import cpu_jit
from .blas import loaded as blas


def facts(cfg: TrainConfig) -> dict:
    return {"mlx": mx.__version__, "device": str(mx.default_device()), "blas": blas,
            "cpu_jit": "native" if cpu_jit.active else "plain"}


def matmul_gflops(cfg: TrainConfig, n: int = 2048, repeats: int = 3) -> float:
    """Best-of float32 n^3 matmul GFLOP/s on MLX's default device."""
    a = mx.random.normal((n, n), dtype=mx.float32)
    mx.eval(a @ a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(a @ a)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def peak_memory_bytes(cfg: TrainConfig) -> int:
    """MLX's own peak allocation in this process (mx.get_peak_memory)."""
    return int(mx.get_peak_memory())
