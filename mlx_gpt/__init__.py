"""The MLX engine: the model, its kernels, the compiled step and the probes. Importing it
prepares MLX's CPU backend before the first `import mlx` (Linux only): OpenBLAS for its matmuls
(blas.py) and the tuned kernel build (cpu_jit.py)."""

from .blas import ensure_fast_blas
from .cpu_jit import ensure_native_jit

ensure_fast_blas()
ensure_native_jit()
