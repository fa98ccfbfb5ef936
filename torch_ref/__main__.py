"""`python -m torch_ref <command>`: gpu-check (parity and spot-check: python -m crosscheck)."""

from qkstudy import interrupts
from qkstudy.cli import entry

COMMANDS = {
    "gpu-check": ("torch_ref.gpu_check",
                  "backend=torch on one GPU: CUDA-vs-CPU parity, tokens/s, a demo sweep (<8 min)"),
}
main = entry("python -m torch_ref", COMMANDS,
             missing={"torch": "PyTorch is not installed; pip install -e '.[torch]'"})


if __name__ == "__main__":
    interrupts.main_process(main)
