"""MLX trainer for the QK-norm study: a plain nanoGPT with a QK-norm toggle and probes."""

from .blas import ensure_fast_blas
from .cpu_jit import ensure_native_jit

# Both must precede the first `import mlx` (Linux only; no-ops on macOS).
ensure_fast_blas()
ensure_native_jit()
