"""`python -m qkstudy sweep [key=value ...]`: arms x learning rate x seed (x depth) grids of
resumable runs, refined from the results on disk (docs/sweeps.md)."""

from .cli import USAGE, cli

__all__ = ["USAGE", "cli"]
