"""MLX trainer for the QK-norm study: a plain nanoGPT with a QK-norm toggle and probes."""

from .blas import ensure_fast_blas

ensure_fast_blas()  # must precede the first `import mlx` (Linux only; a no-op on macOS)
