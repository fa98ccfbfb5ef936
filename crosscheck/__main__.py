"""`python -m crosscheck <command>`: parity, spot-check, gpu-check."""

from qkstudy import interrupts
from qkstudy.cli import entry

COMMANDS = {
    "parity": ("crosscheck.parity", "MLX vs PyTorch: logits, loss, gradients, probes, 50 steps"),
    "spot-check": ("crosscheck.spot_check",
                   "a finished run again in the other engine, judged: RUN_DIR [device=] [data=]"),
    "gpu-check": ("crosscheck.gpu_check",
                  "backend=torch on one GPU: CUDA-vs-CPU parity, tokens/s, a demo sweep (<8 min)"),
}
main = entry("python -m crosscheck", COMMANDS,
             missing={"torch": "PyTorch is not installed; pip install -e '.[torch]'",
                      "mlx": "MLX is not installed; pip install -e '.[mlx]'"})


if __name__ == "__main__":
    interrupts.main_process(main)
