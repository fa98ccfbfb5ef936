"""The bench's measurements, round by round: every variant at every shape, in fresh processes
(step.py), gathered into one report."""

from __future__ import annotations

import dataclasses
import os
import platform
import shlex

from .. import provenance
from ..parameters import count_params
from .forecast import where_to_run
from .machine import load_average, sgemm_gflops
from .plan import BenchConfig, Variant, validate
from .shapes import flops_per_token, preset_base, preset_shape, shape_config
from .stats import summarise
from .step import Spec, StepFailed, measure_together


def measure_variant(name: str, variant: Variant, bench: BenchConfig, first: bool) -> dict:
    """One measurement: the variant's processes at once. {"tokens_per_s": their total, ...}, or
    {"error": why}."""
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


def run(bench: BenchConfig, argv: list[str] | None = None) -> dict:
    bench = bench.resolved()
    plan = validate(bench)
    report: dict = {
        "command": shlex.join(["python", "-m", "qkstudy", "bench", *(argv or [])]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": provenance.chip(),
                    "load_average": load_average(), "load_before_each": []},
        "config": dataclasses.asdict(bench), "backends": plan.backends, "builds": plan.builds}
    print("measuring the sgemm peak (numpy) ...", flush=True)
    report["sgemm_gflops"] = sgemm_gflops()
    shapes: dict[str, dict] = {}
    for name in plan.shapes:
        shape = preset_shape(name)
        _, args = shape_config(shape, preset_base(name))
        shapes[name] = {"shape": shape, "params": count_params(args),
                        "flops_per_token": flops_per_token(args), "samples": {},
                        "variants": {}, "overheads": {}}
    facts: dict[str, dict] = {}
    for r in range(bench.rounds):
        for name in plan.shapes:
            for v in plan.variants(name, bench.parallel):
                first = r == 0 and v.processes == 1 and v.build in (None, "plain")
                print(f"measuring {name}: {v.engine}, {v.processes} process(es), round "
                      f"{r + 1} of {bench.rounds} ...", end=" ", flush=True)
                load = load_average()
                if load:
                    report["machine"]["load_before_each"].append(load[0])
                m = measure_variant(name, v, bench, first)
                entry = shapes[name]
                entry["variants"][v.key] = dataclasses.asdict(v) | {"engine": v.engine}
                entry["samples"].setdefault(v.key, []).append(m.get("tokens_per_s"))
                entry.setdefault("details", {}).setdefault(v.key, []).append(m)
                if "error" in m:
                    print(f"failed ({m['error']})", flush=True)
                    continue
                print(f"{m['tokens_per_s']:,.0f} tok/s", flush=True)
                one = m["processes"][0]
                if first:
                    facts.setdefault(v.backend, one["backend"] | {"engine": one["engine"]})
                    if "overheads" in one:
                        entry["overheads"][v.backend] = one["overheads"]
                    if "matmul_gflops" in one:
                        report.setdefault("matmul_gflops", {}).setdefault(
                            v.backend, one["matmul_gflops"])
    report["facts"] = facts
    for entry in shapes.values():
        summarise(entry, report["sgemm_gflops"])
    report["shapes"] = shapes
    report["where_to_run"] = where_to_run(shapes, report["machine"])
    report["machine"]["load_average_after"] = load_average()
    return report
