"""Checks across the two engines: parity and the spot check."""
