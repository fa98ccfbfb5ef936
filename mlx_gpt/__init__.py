"""The MLX engine; importing it loads OpenBLAS for MLX's CPU backend (blas.py) on Linux,
silently: its Engine says why MLX may compute slowly when it starts to."""

from .blas import ensure_fast_blas

ensure_fast_blas()
