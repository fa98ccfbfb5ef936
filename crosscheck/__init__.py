"""Checks across the engines and machines: parity, the GPU acceptance check."""
