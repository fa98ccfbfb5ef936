"""PyTorch's part of the benchmarks (qkstudy/bench/step.py times the run's own Engine, in a
process that never imports mlx_gpt: torch_ref/__init__.py): torch's facts, its matmul peak in
the run's precision and, on CUDA, the peak allocation."""

from __future__ import annotations

import time

import torch

from qkstudy.config import TrainConfig

from .device import describe, resolve_device, set_precision


def facts(cfg: TrainConfig) -> dict:
    device = resolve_device(cfg.device)
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "device": describe(device), "cuda": torch.version.cuda}


def matmul_gflops(cfg: TrainConfig, n: int | None = None, repeats: int = 3) -> float:
    """n^3 matmul GFLOP/s on the run's device in its precision: float32 (fp32; tf32 lets CUDA
    use TF32 tensor cores) or bfloat16 (bf16). n defaults to 8192 on a GPU, 2048 on the CPU;
    the best of `repeats` timings, each of 10 products on a GPU and 1 on the CPU."""
    device = resolve_device(cfg.device)
    set_precision(cfg.precision, device)
    gpu = device.type in ("cuda", "mps")
    n = n or (8192 if gpu else 2048)
    products = 10 if gpu else 1
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    for _ in range(3 if gpu else 1):
        a @ a
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(products):
            a @ a
        sync()
        best = min(best, (time.perf_counter() - t) / products)
    return 2 * n**3 / best / 1e9


def peak_memory_bytes(cfg: TrainConfig) -> int | None:
    """The peak CUDA allocation of this process; None on other devices."""
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
