"""`python -m qkstudy bench [key=value ...]`: measure, print and write bench.md and bench.json."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import files
from ..cli import keys_usage
from ..config import apply_overrides, split_key_values
from .measure import run
from .plan import BenchConfig
from .tables import markdown


USAGE = keys_usage(
    "python -m qkstudy bench [key=value ...]",
    "Measures every backend's training step the same way (each measurement a fresh process\n"
    "running the run's own engine at a preset's shape; median and range of `rounds` rounds):\n"
    "tokens/s, PyTorch / MLX, FLOP/s and share of the sgemm peak, probe and eval overhead; at\n"
    "cpu_shapes also K processes at once and MLX's plain against its tuned CPU build; then the\n"
    "hours the study takes where. Writes <out>/bench.md and <out>/bench.json.",
    BenchConfig)


def cli(argv: list[str]) -> int:
    bench = apply_overrides(BenchConfig(), split_key_values(argv))
    report = run(bench, argv)
    text = markdown(report)
    print(text)
    out = Path(bench.out)
    files.write_json(out / "bench.json", report)
    files.write_text(out / "bench.md", text + "\n")
    print(f"written: {out / 'bench.md'}, {out / 'bench.json'}", file=sys.stderr)
    return 0
