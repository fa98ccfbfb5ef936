"""`python -m torch_ref <command>`: gpu-check (parity and spot-check: python -m crosscheck)."""

from __future__ import annotations

import sys

from qkstudy import interrupts
from qkstudy.cli import dispatch

COMMANDS = {
    "gpu-check": ("torch_ref.gpu_check",
                  "backend=torch on one GPU: CUDA-vs-CPU parity, tokens/s, a demo sweep (<8 min)"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m torch_ref", COMMANDS, sys.argv[1:] if argv is None else argv,
                    missing={"torch": "PyTorch is not installed; pip install -e '.[torch]'"})


if __name__ == "__main__":
    interrupts.main_process(main)
