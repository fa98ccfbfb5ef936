"""Flush-to-zero for the CPU's floating point: subnormal numbers (below 1.2e-38 in float32)
become 0, the way GPUs and Apple's cores treat them anyway.

On x86-64 a subnormal operand or result costs a microcode assist of ~100 cycles. At high
learning rates the saturated softmax and Adam's second moments produce many, and a CPU run's
training loop then slows by 15-30% for both engines (docs/performance.md, "In-sweep speed").
The switch is the thread's MXCSR (FTZ and DAZ bits), set through torch.set_flush_denormal on
the calling thread; threads started after it (MLX's and PyTorch's pools) inherit it, so it is
set once per process, before an engine is imported. It changes only values below float32's
smallest normal number, never a run's identity; the manifest records it
(`flush_denormals`). QKSTUDY_DENORMALS=keep leaves the CPU's default.
"""

from __future__ import annotations

import os
import platform

ENV = "QKSTUDY_DENORMALS"
_state: dict[str, bool] = {}


def flush_to_zero() -> bool:
    """Set FTZ/DAZ on this thread once per process (x86-64 with PyTorch installed, unless
    QKSTUDY_DENORMALS=keep); whether it is set."""
    if "on" not in _state:
        _state["on"] = False
        if os.environ.get(ENV, "flush") != "keep" and platform.machine().lower() in (
                "x86_64", "amd64"):
            try:
                import torch
            except ImportError:
                return False
            _state["on"] = bool(torch.set_flush_denormal(True))
    return _state["on"]
