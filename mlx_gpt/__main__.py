"""`python -m mlx_gpt <command> [key=value ...]`: prepare, train, sweep, bench."""

from __future__ import annotations

import importlib
import sys

from .errors import UsageError

COMMANDS = {
    "prepare": ("mlx_gpt.data", "tokenise a corpus into uint16 train/val files"),
    "train": ("mlx_gpt.train", "train one run (resumes if its folder has a checkpoint)"),
    "sweep": ("mlx_gpt.sweep", "qk_norm x learning rate x seed grid, resumable"),
    "bench": ("mlx_gpt.bench", "throughput, FLOP/s and probe overhead, side by side"),
}


def usage() -> str:
    lines = ["usage: python -m mlx_gpt <command> [args]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; expected one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[command][0])
        return int(module.cli(rest) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
