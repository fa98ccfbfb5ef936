"""PyTorch reference of the mlx_gpt model: same names, same numbers, CUDA/MPS spot checks."""
