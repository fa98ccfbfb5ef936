"""torch_ref's side of the engine seam (qkstudy/backends.py), with torch's bench facts."""

from __future__ import annotations

import torch

from qkstudy.config import TrainConfig
from qkstudy.forecast import timed

from .device import describe, memory_limit, resolve_device, set_precision  # noqa: F401
from .engine import Engine, preflight  # noqa: F401 - the seam's contract (qkstudy/backends.py)


def device(cfg: TrainConfig) -> str:
    return describe(resolve_device(cfg.device))


def facts(cfg: TrainConfig) -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "device": device(cfg), "cuda": torch.version.cuda}


def matmul_gflops(cfg: TrainConfig, n: int | None = None, repeats: int = 3) -> float:
    """n^3 matmul GFLOP/s on the run's device in its precision, best of `repeats`."""
    dev = resolve_device(cfg.device)
    set_precision(cfg.precision, dev)
    gpu = dev.type in ("cuda", "mps")
    n, products = n or (8192 if gpu else 2048), 10 if gpu else 1
    a = torch.randn(n, n, device=dev,
                    dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float32)

    def multiply() -> None:
        for _ in range(products):
            a @ a
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elif dev.type == "mps":
            torch.mps.synchronize()

    multiply()
    return 2 * n**3 * products / min(timed(multiply) for _ in range(repeats)) / 1e9


def peak_memory_bytes(cfg: TrainConfig) -> int | None:
    dev = resolve_device(cfg.device)
    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
