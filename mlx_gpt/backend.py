"""mlx_gpt's side of the engine seam (qkstudy/backends.py), with MLX's bench facts."""

from __future__ import annotations

import shutil
import sys

import mlx.core as mx

from qkstudy.config import TrainConfig
from qkstudy.errors import UsageError
from qkstudy.forecast import timed

from . import blas
from .engine import Engine  # noqa: F401 - the seam's contract (qkstudy/backends.py)


def device(cfg: TrainConfig) -> str:
    return str(mx.default_device().type).rsplit(".", 1)[-1]


def preflight(cfg: TrainConfig) -> None:
    """On Linux MLX's CPU backend compiles its kernels with g++ at the first step."""
    if sys.platform.startswith("linux") and device(cfg) == "cpu" and not shutil.which("g++"):
        raise UsageError("MLX's CPU backend compiles its kernels with g++, which is not on PATH: "
                         "install it (Debian/Ubuntu: apt-get install g++) or run with "
                         "backend=torch")


def memory_limit(cfg: TrainConfig, runs: int | None = None) -> None:
    return None


def facts(cfg: TrainConfig) -> dict:
    return {"mlx": mx.__version__, "device": str(mx.default_device()), "blas": blas.loaded}


def matmul_gflops(cfg: TrainConfig, n: int = 2048, repeats: int = 3) -> float:
    a = mx.random.normal((n, n), dtype=mx.float32)
    mx.eval(a @ a)
    return 2 * n**3 / min(timed(lambda: mx.eval(a @ a)) for _ in range(repeats)) / 1e9


def peak_memory_bytes(cfg: TrainConfig) -> int:
    return int(mx.get_peak_memory())
