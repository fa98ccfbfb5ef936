"""PyTorch reference of the mlx_gpt model: same names, same numbers; the engine of backend=torch."""

# torch goes first, before mlx_gpt loads OpenBLAS into the global symbol scope: otherwise
# libtorch_cpu's calls to its own (MKL) sgemm_ bind to OpenBLAS's, whose thread pool then fights
# torch's OpenMP threads (measured: train steps 2x slower on a 2-core CPU).
try:
    import torch  # noqa: F401
except ModuleNotFoundError:  # `python -m crosscheck` says how to install it
    pass
