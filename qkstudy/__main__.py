"""`python -m qkstudy <command> [key=value ...]`: prepare, train, sweep, ladder, archive, status, bench."""

from __future__ import annotations

from . import interrupts
from .cli import entry

COMMANDS = {
    "prepare": ("qkstudy.data.prepare", "tokenise a corpus into uint16 train/val files"),
    "train": ("qkstudy.trainer", "train one run, backend=mlx|torch (resumes from its checkpoint)"),
    "sweep": ("qkstudy.sweep.cli", "qk_norm x learning rate x seed grid, resumable"),
    "ladder": ("qkstudy.sweep.ladder", "the width x training-length ladder, point by point, resumable"),
    "archive": ("qkstudy.archive", "a study's finished runs as one compact .tar.xz, and back"),
    "status": ("qkstudy.status", "every run of a sweep: state, progress, ETA (reads files only)"),
    "bench": ("qkstudy.bench.cli", "tokens/s, FLOP/s and overheads of every backend, side by side"),
}


main = entry("python -m qkstudy", COMMANDS)


if __name__ == "__main__":
    interrupts.main_process(main)
