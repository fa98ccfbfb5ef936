"""The MLX engine; importing it prepares MLX's CPU backend (cpu_jit.py) on Linux, silently:
its Engine says why MLX may compute slowly when it starts to."""

from .cpu_jit import ensure_fast_blas, ensure_native_jit

ensure_fast_blas()
ensure_native_jit()
