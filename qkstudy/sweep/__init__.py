"""`python -m qkstudy sweep [key=value ...]`: grids of resumable runs (docs/sweeps.md)."""

from .cli import USAGE, cli
from .config import PRESETS, grid, parse_sweep_config

__all__ = ["PRESETS", "USAGE", "cli", "grid", "parse_sweep_config"]
