"""Checks across the two engines: parity (MLX vs PyTorch, numerically) and the spot check (an MLX
run re-run with PyTorch). The one package that imports both mlx_gpt and torch_ref."""
