"""The bench's rounds: every variant at every shape, gathered into one report with medians,
ranges and paired ratios, beside numpy's float32 matmul peak and the machine's load."""

from __future__ import annotations

import dataclasses
import os
import platform
import shlex
import statistics
import time

import numpy as np

from .. import provenance
from ..forecast import where_to_run
from ..parameters import count_params
from .plan import BenchConfig, Variant, validate
from .shapes import flops_per_token, preset_base, preset_shape, shape_config
from .step import Spec, StepFailed, measure_together


def sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    """Best-of float32 n^3 matmul GFLOP/s in numpy (its BLAS): the machine's peak here."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def spread(values: list[float | None]) -> dict | None:
    """{"median", "min", "max", "n"} of the values that exist; None if none does."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarise(entry: dict, sgemm: float) -> None:
    """Medians, ranges, FLOP/s and per-round paired ratios of one shape's samples, in place."""
    samples = entry["samples"]
    entry["tokens_per_s"] = {k: spread(v) for k, v in samples.items()}
    entry["gflops"] = {k: s["median"] * entry["flops_per_token"] / 1e9
                       for k, s in entry["tokens_per_s"].items() if s}
    entry["share_of_sgemm_peak"] = {k: g / sgemm for k, g in entry["gflops"].items()}
    pairs, base = [], "mlx-plain-1"
    for key, v in entry["variants"].items():
        if v["processes"] == 1 and key != base:
            pairs.append((base, key))
        if v["processes"] > 1:
            pairs.append((key.rsplit("-", 1)[0] + "-1", key))
    entry["ratios"] = {f"{b}/{a}": spread([y / x for x, y in zip(samples[a], samples[b])
                                           if x and y is not None])
                       for a, b in pairs if a in samples}


def measure_variant(name: str, variant: Variant, bench: BenchConfig, first: bool) -> dict:
    """One measurement of the variant's processes at once, or {"error": why}."""
    shape = preset_shape(name)
    cfg, _ = shape_config(shape, preset_base(name), backend=variant.backend)
    spec = Spec(config=dataclasses.asdict(cfg), vocab=shape["vocab"], warmup=bench.warmup,
                seconds=bench.seconds, min_steps=bench.min_steps,
                overheads=first and bench.probes, matmul=first)
    try:
        results = measure_together(spec, variant.processes, env=variant.env())
    except StepFailed as e:
        return {"error": str(e)}
    return {"tokens_per_s": sum(r["tokens_per_s"] for r in results), "processes": results}


def record(report: dict, entry: dict, v: Variant, m: dict, first: bool) -> None:
    """One measurement into the report (in round 1 also facts, overheads and matmul peak)."""
    entry["variants"][v.key] = dataclasses.asdict(v) | {"engine": v.engine}
    entry["samples"].setdefault(v.key, []).append(m.get("tokens_per_s"))
    entry.setdefault("details", {}).setdefault(v.key, []).append(m)
    if "error" in m:
        print(f"failed ({m['error']})", flush=True)
        return
    print(f"{m['tokens_per_s']:,.0f} tok/s", flush=True)
    one = m["processes"][0]
    if first:
        report["facts"].setdefault(v.backend, one["backend"] | {"engine": one["engine"]})
        if "overheads" in one:
            entry["overheads"][v.backend] = one["overheads"]
        if "matmul_gflops" in one:
            report.setdefault("matmul_gflops", {}).setdefault(v.backend, one["matmul_gflops"])


def run(bench: BenchConfig, argv: list[str] | None = None) -> dict:
    bench = bench.resolved()
    plan = validate(bench)
    report: dict = {
        "command": shlex.join(["python", "-m", "qkstudy", "bench", *(argv or [])]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "cpu": provenance.chip(), "load_average": load_average(),
                    "load_before_each": []},
        "config": dataclasses.asdict(bench), "backends": plan.backends, "builds": plan.builds,
        "facts": {}}
    print("measuring the sgemm peak (numpy) ...", flush=True)
    report["sgemm_gflops"] = sgemm_gflops()
    shapes: dict[str, dict] = {}
    for name in plan.shapes:
        _, args = shape_config(preset_shape(name), preset_base(name))
        shapes[name] = {"shape": preset_shape(name), "params": count_params(args),
                        "flops_per_token": flops_per_token(args), "samples": {},
                        "variants": {}, "overheads": {}}
    for r in range(bench.rounds):
        for name in plan.shapes:
            for v in plan.variants(name, bench.parallel):
                first = r == 0 and v.processes == 1 and v.build in (None, "plain")
                print(f"measuring {name}: {v.engine}, {v.processes} process(es), round "
                      f"{r + 1} of {bench.rounds} ...", end=" ", flush=True)
                load = load_average()
                if load:
                    report["machine"]["load_before_each"].append(load[0])
                record(report, shapes[name], v, measure_variant(name, v, bench, first), first)
    for entry in shapes.values():
        summarise(entry, report["sgemm_gflops"])
    report["shapes"] = shapes
    report["where_to_run"] = where_to_run(shapes, report["machine"])
    report["machine"]["load_average_after"] = load_average()
    return report
