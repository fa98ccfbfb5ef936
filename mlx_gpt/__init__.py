"""The MLX engine of the QK-norm study: the model, its kernels, the compiled step and the probes.

Everything here needs MLX; what does not (config, run format, the training driver, sweeps)
lives in qkstudy/, which imports this package only for a run with backend=mlx. Importing it
prepares MLX's CPU backend, which must happen before the first `import mlx` (Linux only;
no-ops on macOS): OpenBLAS for its matmuls (blas.py) and the tuned kernel build (cpu_jit.py).
"""

from .blas import ensure_fast_blas
from .cpu_jit import ensure_native_jit

ensure_fast_blas()
ensure_native_jit()
