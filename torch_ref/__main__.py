"""`python -m torch_ref <command>`: parity, spot-check."""

from __future__ import annotations

import importlib
import sys

import mlx_gpt  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlx_gpt.errors import UsageError

COMMANDS = {
    "parity": ("torch_ref.parity", "MLX vs PyTorch: logits, loss, gradients, probes, 50 steps"),
    "spot-check": ("torch_ref.spot_check",
                   "re-run an MLX run folder with PyTorch: RUN_DIR [device=auto|cuda|mps|cpu]"),
}


def usage() -> str:
    lines = ["usage: python -m torch_ref <command> [args]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in COMMANDS.items()]
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
        try:
            module = importlib.import_module(COMMANDS[command][0])
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise UsageError("PyTorch is not installed; pip install -e '.[torch]'") from None
        return int(module.cli(rest) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
