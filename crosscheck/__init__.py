"""Checks across the engines and machines: parity, the spot check, the GPU acceptance check."""
