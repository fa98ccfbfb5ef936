"""How long a sweep's plan takes, and on what: the device its runs train on, tokens/s per depth
and the hours and nights that come to on this machine.

Tokens/s per depth come, in this order, from: `--calibrate` (every depth timed here); the
bench's stored figure (reports/bench.json, written by `just bench` on this same machine: the
measured shape nearest in FLOPs per token); a short timing of the first depth here. The last
two are scaled to the other depths by FLOPs per token (qkstudy/bench/shapes.py), and the printed
line says which source it is.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import backends, files, provenance
from ..config import TrainConfig, model_args
from ..progress import format_seconds
from ..errors import UsageError
from ..bench.shapes import flops_per_token

NIGHT_HOURS = 10  # a night on a workstation, as `just bench`'s where-to-run table counts it
DAY_SECONDS = 24 * 3600
BENCH_JSON = Path("reports/bench.json")
BENCH_KEY = {"mlx": "mlx-plain-1", "torch": "torch-1"}  # one process, the run's default build


@dataclass
class Speeds:
    """Tokens/s per depth and where they come from (one phrase for the printed plan)."""

    per_depth: dict[int, float]
    source: str


def device_text(t: TrainConfig) -> str:
    """The backend and the device a run of `t` trains on here, or why it cannot train here."""
    try:
        backend = backends.load(t.backend)
    except UsageError as e:
        return f"{t.backend}: not installed here ({e})"
    cpu = f"{provenance.chip()}, {os.cpu_count()} cores"
    try:
        device = backend.device(t)
    except UsageError as e:
        return f"{t.backend}: {e}"
    where = f"{device} ({cpu})" if device == "cpu" else device
    if t.backend == "torch":
        return f"torch on {where}, {t.precision}" + (", compiled" if t.compile else "")
    return f"mlx on {where}"


def flops_of(cfg: TrainConfig, vocab: int) -> float:
    return flops_per_token(model_args(cfg, vocab))


def from_bench(cfgs: dict[int, TrainConfig], vocab: int, path: Path = BENCH_JSON
               ) -> tuple[Speeds | None, str | None]:
    """(Speeds from the bench's stored figure, None) when `path` holds one measured on this
    machine with this backend; (None, why not in one line) when it exists but cannot serve;
    (None, None) when there is none."""
    if not path.exists():
        return None, None
    report = files.read_json(path)
    backend = next(iter(cfgs.values())).backend
    try:
        machine = report["machine"]
        if (machine.get("cpu"), machine.get("cpus")) != (provenance.chip(), os.cpu_count()):
            return None, (f"{path} was measured on another machine ({machine.get('cpus')}-core "
                          f"{machine.get('cpu')}); run `just bench` here to refresh it")
        measured = []
        for name, entry in report["shapes"].items():
            s = (entry.get("tokens_per_s") or {}).get(BENCH_KEY[backend])
            if s and s.get("median", 0) > 0 and entry.get("flops_per_token", 0) > 0:
                measured.append((name, float(s["median"]), float(entry["flops_per_token"])))
    except (TypeError, KeyError, AttributeError, ValueError):
        return None, f"{path} is not a bench report (rewrite it with `just bench`)"
    if not measured:
        return None, f"{path} holds no {backend} figure (run `just bench backends={backend}`)"
    speeds, used = {}, set()
    for depth, cfg in cfgs.items():
        want = flops_of(cfg, vocab)
        name, tok_s, flops = min(measured, key=lambda m: abs(math.log(m[2] / want)))
        speeds[depth] = tok_s * flops / want
        used.add(name)
    stamp = time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))
    return Speeds(speeds, f"tok/s from the bench's stored figure ({path}, {', '.join(sorted(used))} "
                          f"shape, measured {stamp}) scaled by FLOPs per token"), None


def from_short_timing(cfgs: dict[int, TrainConfig], vocab: int, step_speed) -> Speeds:
    """Time a few steps of the first depth here and scale to the others by FLOPs per token."""
    depth, cfg = next(iter(cfgs.items()))
    tok_s, timed = step_speed(cfg, vocab, steps=10, max_seconds=3.0)
    base = flops_of(cfg, vocab)
    speeds = {d: tok_s * base / flops_of(c, vocab) for d, c in cfgs.items()}
    others = " scaled by FLOPs per token to the other depths" if len(cfgs) > 1 else ""
    return Speeds(speeds, f"tok/s from a short timing here (depth {depth}, "
                          f"{timed} step{'s' if timed != 1 else ''}){others}; --calibrate times "
                          "every depth")


def busy_note() -> str:
    """'; timed while the machine was busy (load 11.2 on 2 cores)' when other work shared the
    cores the timing ran on (a 1-minute load above half the cores), else ''."""
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
    faster = []
    if t.backend == "mlx":
        faster.append("backend=torch (faster than MLX on CPUs: docs/performance.md)")
    faster += ["one CUDA GPU (`just gpu-check` there; docs/performance.md's where-to-run table)",
               "--slurm across a cluster's nodes"]
    if preset != "mini":
        faster.append("preset=mini (the smallest study that decides the hypotheses)")
    return (f"more than a day on this machine ({seconds / DAY_SECONDS:,.0f} days); faster: "
            + "; ".join(faster))
