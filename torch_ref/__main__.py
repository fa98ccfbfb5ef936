"""`python -m torch_ref <command>`: parity, spot-check, gpu-check."""

from __future__ import annotations

import sys

from qkstudy.cli import dispatch

COMMANDS = {
    "parity": ("torch_ref.parity", "MLX vs PyTorch: logits, loss, gradients, probes, 50 steps"),
    "spot-check": ("torch_ref.spot_check",
                   "re-run an MLX run folder with PyTorch: RUN_DIR [device=auto|cuda|mps|cpu]"),
    "gpu-check": ("torch_ref.gpu_check",
                  "backend=torch on one GPU: CUDA-vs-CPU parity, tokens/s, a demo sweep (<8 min)"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m torch_ref", COMMANDS, sys.argv[1:] if argv is None else argv,
                    missing={"torch": "PyTorch is not installed; pip install -e '.[torch]'"})


if __name__ == "__main__":
    sys.exit(main())
