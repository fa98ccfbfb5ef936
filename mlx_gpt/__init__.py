"""The MLX engine. Importing it prepares MLX's CPU backend before the first `import mlx` (Linux
only): OpenBLAS for its matmuls and the tuned kernel build (cpu_jit.py)."""

from .cpu_jit import ensure_fast_blas, ensure_native_jit

ensure_fast_blas()
ensure_native_jit()
