"""How long training takes: a sweep's plan and ETA, status's time left, the bench's hours."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from . import files, provenance
from .config import TrainConfig, model_args
from .parameters import flops_per_token
from .progress import format_seconds

NIGHT_HOURS = 10  # a night on a workstation
DAY_SECONDS = 24 * 3600
BENCH_KEY = {"mlx": "mlx-1", "torch": "torch-1"}  # one process of each backend
# The share of numpy's sgemm peak a CPU train step reaches (15-52% measured: performance.md)
CPU_SHARE = 0.3


def run_cost_tokens(cfg: TrainConfig) -> float:
    """Train tokens plus evaluation, counted as train-step equivalents (a forward ~ 1/3 step)."""
    evals = cfg.steps // cfg.eval_every + 1
    return cfg.tokens_per_step * (cfg.steps + evals * cfg.eval_batches / 3)


def run_seconds(cfgs: list[TrainConfig], speeds: Mapping[int, float]) -> float:
    return sum(run_cost_tokens(c) / speeds[c.depth] for c in cfgs if speeds.get(c.depth, 0) > 0)


def scaled(cfgs: dict[int, TrainConfig], vocab: int, tok_s: float, at: TrainConfig
           ) -> dict[int, float]:
    """`tok_s` measured at config `at`, carried to every depth by FLOPs per token."""
    flops = flops_per_token(model_args(at, vocab))
    return {d: tok_s * flops / flops_per_token(model_args(c, vocab)) for d, c in cfgs.items()}


def from_bench(cfgs: dict[int, TrainConfig], vocab: int, path: Path = Path("reports/bench.json")
               ) -> tuple[tuple[dict[int, float], str] | None, str | None]:
    """(speeds, None) from this machine's bench report, else (None, why not or None)."""
    if not path.exists():
        return None, None
    report, backend = files.read_json(path), next(iter(cfgs.values())).backend
    try:
        machine = report["machine"]
        if (machine.get("cpu"), machine.get("cpus")) != (provenance.chip(), os.cpu_count()):
            return None, (f"{path} was measured on another machine ({machine.get('cpus')}-core "
                          f"{machine.get('cpu')}); run `just bench` here to refresh it")
        measured = [(name, float(s["median"]), float(e["flops_per_token"]))
                    for name, e in report["shapes"].items()
                    if (s := (e.get("tokens_per_s") or {}).get(BENCH_KEY[backend]))
                    and s.get("median", 0) > 0 and e.get("flops_per_token", 0) > 0]
    except (TypeError, KeyError, AttributeError, ValueError):
        return None, f"{path} is not a bench report (rewrite it with `just bench`)"
    if not measured:
        return None, f"{path} holds no {backend} figure (run `just bench backends={backend}`)"
    speeds, used = {}, set()
    for depth, cfg in cfgs.items():
        want = flops_per_token(model_args(cfg, vocab))
        name, tok_s, flops = min(measured, key=lambda m: abs(math.log(m[2] / want)))
        speeds[depth] = tok_s * flops / want
        used.add(name)
    stamp = time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))
    return (speeds, f"tok/s from the bench's stored figure ({path}, {', '.join(sorted(used))} "
                    f"shape, measured {stamp}) scaled by FLOPs per token"), None


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    """Best-of float32 n^3 matmul GFLOP/s in numpy (its BLAS): the machine's peak here."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    return 2 * n**3 / min(timed(lambda: a @ a) for _ in range(repeats)) / 1e9


def busy_note() -> str:
    """'; timed while the machine was busy (...)' when the 1-minute load is above half the cores."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return ""
    cores = os.cpu_count() or 1
    return (f"; timed while the machine was busy (load {load:.1f} on {cores} cores): an idle "
            "one is faster" if load > cores / 2 else "")


def time_text(seconds: float) -> str:
    """'4h10m', '2,588 h (259 nights of 10 h)', '25m10s'."""
    hours = seconds / 3600
    if hours < 10:
        return format_seconds(seconds)
    return f"{hours:,.0f} h ({hours / NIGHT_HOURS:,.0f} nights of {NIGHT_HOURS} h)"


def warning(seconds: float, t: TrainConfig, preset: str) -> str | None:
    """One line when a plan takes more than a day here, with the faster ways to run it."""
    if seconds <= DAY_SECONDS:
        return None
    faster = ["backend=torch (faster than MLX on CPUs: docs/performance.md)"] * (t.backend == "mlx")
    faster += ["one CUDA GPU (`just gpu-check` there; docs/performance.md's where-to-run table)",
               "--slurm across a cluster's nodes"]
    faster += ["preset=mini (the smallest study that tests the hypotheses)"] * (preset != "mini")
    return (f"more than a day on this machine ({seconds / DAY_SECONDS:,.0f} days); faster: "
            + "; ".join(faster))


def queue_eta(left: float, first: float, planned: float, seconds: float, processes: int) -> float:
    """Seconds until a sweep's queue (`left` calibrated seconds; `first` those of the next run)
    is trained by `processes`, calibrated as that many runs trained at once. `planned`,
    `seconds`: calibrated and wall seconds this process trained. Wall over calibrated time
    starts at 1, weighted as one run, and moves to the measured ratio."""
    if left <= 0 or first <= 0:
        return math.inf if left > 0 else 0.0
    return left * (first + seconds) / (first + planned) / processes


def depth_rates(runs: list, calibrated: Mapping[int, float]) -> tuple[dict[int, float], str]:
    """{depth: tok/s} for the time left, and where each came from: the median of the depth's
    runs finished on this machine, else this machine's calibration at the sweep's start, else
    the median of its runs finished on other machines (named), so that runs copied in from a
    faster or slower machine never set this one's pace while it has a measure of its own."""
    rates, sources = {}, {}
    for depth in sorted({r.depth for r in runs if r.depth is not None}):
        done = [r for r in runs if r.depth == depth and r.finished and r.tok_s]
        here = [r.tok_s for r in done if r.machine is None]
        if here:
            rates[depth], source = statistics.median(here), "measured by its runs finished here"
        elif calibrated.get(depth, 0) > 0:
            rates[depth], source = calibrated[depth], "calibrated here at the sweep's start"
        elif done:
            rates[depth] = statistics.median(r.tok_s for r in done)
            source = f"measured by runs finished on {', '.join(sorted({r.machine for r in done}))}"
        else:
            continue
        sources.setdefault(source, []).append(str(depth))
    return rates, " and ".join(f"{how} (depth {', '.join(ds)})" for how, ds in sources.items())


def time_left_line(runs: list, calibrated: Mapping[int, float]) -> str:
    """The training time of the runs without a result, in one process on this machine, for
    `just status`; each run has `machine`: None when it was trained here, else where."""
    left = [r for r in runs if not r.finished and r.state != "failed"]
    if not left:
        return "time left: none (every run has a result" + (
            "; failed runs are retried by the sweep's command)" if any(
                r.state == "failed" for r in runs) else ")")
    rates, sources = depth_rates(runs, calibrated)
    known = [r for r in left if r.depth in rates and r.steps and r.tokens_per_step]
    if not known:
        return (f"time left: not known for the {len(left)} runs left (no finished run and no "
                "calibration of their depths yet)")
    seconds = sum((r.steps - min(r.step, r.steps)) * r.tokens_per_step / rates[r.depth]
                  for r in known)
    unknown = len(left) - len(known)
    return (f"time left: ~{time_text(seconds)} for {len(known)} of the {len(left)} runs left in "
            f"one process here, on {provenance.host()} (training only; tok/s {sources})"
            + (f"; {unknown} runs of depths not yet timed not counted" if unknown else ""))
