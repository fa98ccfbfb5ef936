"""`python -m qkstudy sweep [key=value ...]`: arms x learning rate x seed (x depth) grids of
resumable runs, refined from the results on disk (docs/sweeps.md)."""

from .cli import USAGE, cli
from .config import PRESETS, grid, parse_sweep_config

__all__ = ["PRESETS", "USAGE", "cli", "grid", "parse_sweep_config"]
