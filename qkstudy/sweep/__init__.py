"""`python -m qkstudy sweep [key=value ...]`: grids of resumable runs (docs/sweeps.md).

The command line (qkstudy/sweep/cli.py) and the trainer behind it are imported only when a
sweep is run (`command`), so reading a sweep's plan or its constants (the analysis does) never
loads them."""

from .config import PRESETS, grid, parse_sweep_config

__all__ = ["PRESETS", "command", "grid", "parse_sweep_config"]


def command(argv: list[str]) -> int:
    """`python -m qkstudy sweep` with these words, from code (the ladder runs its points so)."""
    from .cli import cli

    return cli(argv)
