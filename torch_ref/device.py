"""The device a torch run trains on, its share of it, and determinism."""

from __future__ import annotations

import os

import torch
import torch.utils.deterministic

from qkstudy.config import TrainConfig
from qkstudy.errors import UsageError
from qkstudy.memory import format_bytes
from qkstudy.backends import DEVICE_SLOT, RUNS_PER_DEVICE

CUBLAS_WORKSPACE = ":4096:8"  # one of the two settings cuBLAS documents as deterministic


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda, else mps, else cpu; an unavailable device is a usage error."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available()}
    if name == "auto":
        name = next(d for d in ("cuda", "mps", "cpu") if available[d])
    if name not in available:
        raise UsageError(f"device must be one of auto, cuda, mps, cpu; got {name!r}")
    if not available[name]:
        raise UsageError(f"device {name} is not available to this torch build "
                         f"({torch.__version__}); use device=auto or device=cpu")
    return torch.device(name)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return device.type


def set_precision(precision: str, device: torch.device) -> None:
    """fp32: no TF32 anywhere (the reference); tf32: CUDA matmuls and convolutions in TF32."""
    if precision == "tf32" and device.type != "cuda":
        raise UsageError(f"precision=tf32 is a CUDA mode; on {device.type} use fp32 or bf16")
    if precision == "bf16" and device.type == "mps":
        raise UsageError("precision=bf16 is not supported on mps here; use fp32")
    tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def set_determinism(deterministic: bool) -> None:
    """Deterministic algorithms on or off, with cuBLAS's workspace setting."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = False


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def runs_per_device() -> int:
    return max(1, env_int(RUNS_PER_DEVICE, 1))


def this_gpu(runs: int | None = None) -> tuple[int, int]:
    """(this process's GPU, how many of `runs` processes share it)."""
    count = torch.cuda.device_count()
    index = max(0, env_int(DEVICE_SLOT, 0)) % count
    shared = len([s for s in range(runs or runs_per_device()) if s % count == index]) or 1
    return index, shared


def place(name: str) -> torch.device:
    device = resolve_device(name)
    if device.type != "cuda":
        return device
    index, shared = this_gpu()
    torch.cuda.set_device(index)
    if shared > 1:  # an index, not torch.device("cuda"): torch refuses a device without one
        torch.cuda.set_per_process_memory_fraction(1 / shared, index)
    return torch.device("cuda", index)


def memory_limit(cfg: TrainConfig, runs: int | None = None) -> tuple[int, str] | None:
    """(bytes, their words) this run may use on its GPU: its share, at most free + held."""
    if cfg.backend != "torch" or resolve_device(cfg.device).type != "cuda":
        return None
    index, shared = this_gpu(runs)
    free, total = torch.cuda.mem_get_info(index)
    usable = min(total // shared, free + torch.cuda.memory_reserved(index))
    share = f", 1/{shared} of it for each of the {shared} runs sharing it" if shared > 1 else ""
    return usable, (f"cuda:{index} ({torch.cuda.get_device_name(index)}) has "
                    f"{format_bytes(free)} free of {format_bytes(total)}{share}: "
                    f"{format_bytes(usable)} for this run")
