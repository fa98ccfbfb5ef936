"""Checks across the two engines, above both: parity (MLX vs PyTorch, numerically), weight
conversion between the frameworks, and the spot check (an MLX run re-run with PyTorch).

mlx_gpt and torch_ref import only the core (qkstudy/) and never each other; what compares them
lives here, so it is the one package that may import both.
"""
