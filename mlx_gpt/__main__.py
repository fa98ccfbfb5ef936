"""`python -m mlx_gpt <command> [key=value ...]`: prepare, train, sweep, bench."""

from __future__ import annotations

import sys

from .cli import dispatch

COMMANDS = {
    "prepare": ("mlx_gpt.data", "tokenise a corpus into uint16 train/val files"),
    "train": ("mlx_gpt.train", "train one run (resumes if its folder has a checkpoint)"),
    "sweep": ("mlx_gpt.sweep", "qk_norm x learning rate x seed grid, resumable"),
    "status": ("mlx_gpt.status", "every run of a sweep: state, progress, ETA (reads files only)"),
    "bench": ("mlx_gpt.bench", "throughput, FLOP/s and probe overhead, side by side"),
    "chaos": ("mlx_gpt.chaos", "the storm test: a small sweep under 30 random faults ends "
                               "bit-identical"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m mlx_gpt", COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
