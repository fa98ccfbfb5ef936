"""What `just gpu-check` runs and when: its settings, its time box and its throughput plan,
sized to end in about 5 minutes on one H200 inside a budget of 8 (an estimate until a GPU runs
it: docs/performance.md#just-gpu-check); each stage ends by its share of the budget, and what
does not fit is skipped and said."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"cuda": ("fp32", "tf32", "bf16"), "cpu": ("fp32", "bf16"), "mps": ("fp32",)}
TINY = {"depth": 2, "d_model": 32, "n_heads": 2, "block_size": 32, "batch_size": 4, "vocab": 257}
STAGES = (("parity", 0.25), ("throughput", 0.75), ("sweep", 0.97))  # ends, as budget shares
# Relative deviation of a step's training loss from the CPU's fp32 run above which parity
# fails: a few times the differences measured on the CPU (torch fp32 vs MLX up to 2.9e-2, bf16
# vs fp32 up to 1.1e-1 at 200 steps: docs/torch_ref.md); not yet checked against a GPU's.
PARITY_LIMITS = {"fp32": 0.05, "tf32": 0.1, "bf16": 0.25}


@dataclasses.dataclass(frozen=True)
class GpuCheckConfig:
    device: str = "cuda"  # cuda | mps | cpu (cpu: the same stages without a GPU)
    quick: bool = False  # tiny shapes, eager only, a 4-run sweep: the CPU test
    parallel: int = 2  # K: runs at once in the K-process rows and the sweep's jobs
    budget: float = 480.0  # seconds for the whole check (the plan: ~280 on an H200, estimated)
    seconds: float = 2.0  # timed seconds per throughput measurement
    out: str = ""  # "" -> $OUT if set, else gpu-check

    def out_dir(self) -> Path:
        return Path(self.out or os.environ.get("OUT") or "gpu-check")


class Clock:
    """The check's deadlines: each stage ends by its share of the budget (time a stage leaves
    unused goes to the next one)."""

    def __init__(self, budget: float):
        self.start, self.budget = time.monotonic(), budget

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, stage: str) -> float:
        end = dict(STAGES)[stage] * self.budget
        return end - self.elapsed()


def quick_env(check: GpuCheckConfig) -> dict[str, str]:
    """quick=true: one thread per process (a test on a shared CPU: torch's threads, waiting on
    each other on busy cores, can make a tiny step 100x slower)."""
    return {"OMP_NUM_THREADS": "1"} if check.quick else {}


def python_env(check: GpuCheckConfig) -> dict[str, str]:
    """The environment of the processes started here: this checkout importable."""
    return {**os.environ, **quick_env(check), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def throughput_plan(check: GpuCheckConfig) -> list[dict]:
    """The measurements, in the order they are taken: the study's shape (tiny with quick) eager
    in every precision, bf16 with deterministic=false (what determinism costs), then compiled
    bf16 one run and K at once (quick: eager, K at once)."""
    k = check.parallel

    def row(precision: str, compile_: bool = False, processes: int = 1,
            deterministic: bool = True) -> dict:
        return {"shape": "tiny" if check.quick else "study", "precision": precision,
                "compile": compile_, "processes": processes, "deterministic": deterministic}

    if check.quick:
        return [row("fp32")] + ([row("fp32", processes=k)] if k > 1 else [])
    fast = PRECISIONS[check.device][-1]  # bf16 on a GPU
    plan = [row(p) for p in PRECISIONS[check.device]]
    plan.append(row(fast, deterministic=False))
    plan.append(row(fast, compile_=True))
    if k > 1:
        plan.append(row(fast, compile_=True, processes=k))
    return plan


def label(m: dict) -> str:
    """A measurement's name in the tables: "study bf16 compiled x2", "... nondeterministic"."""
    return (f"{m['shape']} {m['precision']} {'compiled' if m['compile'] else 'eager'} "
            f"x{m['processes']}" + ("" if m.get("deterministic", True) else " nondeterministic"))
