"""Give MLX an optimised BLAS on Linux: the `mlx[cpu]` wheel links the reference (netlib) BLAS,
whose sgemm is ~50x slower than OpenBLAS. libmlx.so imports only `cblas_sgemm/dgemm/cgemm`, so
a BLAS exporting them loaded with RTLD_GLOBAL before mlx is imported comes first in the global
symbol scope and MLX binds to it (LD_PRELOAD without a re-exec). macOS is untouched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

loaded: str | None = None  # path of the BLAS we loaded, recorded in each run's manifest


def _candidates() -> list[str]:
    paths = []
    if os.environ.get("MLX_GPT_BLAS"):
        paths.append(os.environ["MLX_GPT_BLAS"])
    found = ctypes.util.find_library("openblas")
    if found:
        paths.append(found)
    paths += CANDIDATES
    # PyPI's `mkl` wheel ships libmkl_rt with the plain cblas names.
    paths += sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    return paths


def ensure_fast_blas() -> str | None:
    """Load an optimised BLAS globally before mlx is imported. Returns its path, or None."""
    global loaded
    if loaded or not sys.platform.startswith("linux") or os.environ.get("MLX_GPT_BLAS") == "none":
        return loaded
    if "mlx.core" in sys.modules:
        print("warning: mlx was imported before mlx_gpt; it may be using the slow reference BLAS",
              file=sys.stderr)
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            lib.cblas_sgemm  # noqa: B018 - must export the plain name MLX imports
        except (OSError, AttributeError):
            continue
        loaded = path
        return loaded
    print("warning: no OpenBLAS found; MLX on Linux falls back to the reference BLAS (~50x slower "
          "matmuls). Fix: apt-get install libopenblas0-pthread (or set MLX_GPT_BLAS=/path/lib.so)",
          file=sys.stderr)
    return None
