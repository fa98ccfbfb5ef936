"""Facts about the machine the bench runs on: its float32 matmul peak (numpy's BLAS) and load."""

from __future__ import annotations

import os
import time

import numpy as np


def sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    """Best-of float32 n^3 matmul GFLOP/s in numpy (its BLAS): the machine's peak here."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None
