"""The MLX engine; importing it prepares MLX's CPU backend (cpu_jit.py) on Linux."""

from .cpu_jit import ensure_fast_blas, ensure_native_jit

ensure_fast_blas()
ensure_native_jit()
