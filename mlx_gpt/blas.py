"""OpenBLAS loaded globally before `import mlx`, so MLX's Linux CPU backend computes on it
(docs/performance.md)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

BLAS_PATHS = ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
              "/usr/lib/aarch64-linux-gnu/libopenblas.so.0", "/usr/lib64/libopenblas.so.0",
              "/usr/lib/libopenblas.so.0")

loaded: str | None = None  # the BLAS loaded, recorded in each run's manifest
slow_blas: str | None = None  # why MLX may compute on its slow reference BLAS, said once it does


def ensure_fast_blas() -> str | None:
    """Load an optimised BLAS globally before mlx is imported. Returns its path, or None."""
    global loaded, slow_blas
    if loaded or not sys.platform.startswith("linux") or os.environ.get("MLX_GPT_BLAS") == "none":
        return loaded
    if "mlx.core" in sys.modules:
        slow_blas = "mlx was imported before mlx_gpt; it may be using the slow reference BLAS"
    for path in [os.environ.get("MLX_GPT_BLAS"), ctypes.util.find_library("openblas"),
                 *BLAS_PATHS]:
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            lib.cblas_sgemm  # noqa: B018 - must export the plain name MLX imports
        except (OSError, AttributeError):
            continue
        loaded = path
        return loaded
    slow_blas = ("no OpenBLAS found; MLX on Linux falls back to the reference BLAS (~50x slower "
                 "matmuls). Fix: apt-get install libopenblas0-pthread (or set "
                 "MLX_GPT_BLAS=/path/lib.so)")
    return None


def warn_slow_blas() -> None:
    """Say once, as MLX is about to compute, why it may run on its slow reference BLAS."""
    global slow_blas
    if slow_blas:
        print(f"warning: {slow_blas}", file=sys.stderr, flush=True)
        slow_blas = None
