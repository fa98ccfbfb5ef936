"""`python -m qkstudy bench [key=value ...]`: its keys, the variants per shape and the checks,
then the rounds (every variant at every shape), gathered into one report with medians, ranges
and paired ratios beside numpy's float32 matmul peak; printed and written as bench.md and
bench.json."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np

from .. import files, provenance
from ..cli import keys_usage
from ..config import apply_overrides, split_key_values
from ..errors import UsageError
from ..forecast import where_to_run
from ..parameters import count_params
from .shapes import flops_per_token, preset_base, preset_shape, shape_config
from .step import Spec, StepFailed, measure_together, timed
from .tables import LABEL, markdown

BACKENDS = ("mlx", "torch")
BUILDS = ("plain", "native")  # MLX_GPT_CPU_JIT: MLX's own CPU kernel build, and -march=native


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    shapes: str = "demo,mini,study"  # preset shapes measured with every backend; none
    backends: str = "mlx,torch"
    rounds: int = 3  # every measurement once per round; medians and ranges over rounds
    warmup: int = 2  # untimed steps per measurement (compilation, first allocations)
    seconds: float = 3.0  # timed steps per measurement: enough for about this long ...
    min_steps: int = 3  # ... and at least this many
    cpu_shapes: str = "demo,mini"  # also K processes at once and MLX's two CPU builds; none
    parallel: int = 2  # K; 1 leaves that comparison out
    builds: bool = True  # MLX's plain against its tuned CPU build (Linux x86-64 only)
    probes: bool = True  # evaluation and probe cost (round 1)
    quick: bool = False  # the demo shape, one round, one second a measurement: a smoke test
    out: str = "reports"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One engine setting: backend, MLX CPU build, processes at once."""

    backend: str
    build: str | None  # mlx: plain | native; torch: None
    processes: int

    @property
    def key(self) -> str:
        return "-".join([self.backend, *([self.build] if self.build else []),
                         str(self.processes)])

    @property
    def engine(self) -> str:
        return LABEL[self.backend] + {"plain": " plain", "native": " tuned", None: ""}[self.build]

    def env(self) -> dict[str, str]:
        return {"MLX_GPT_CPU_JIT": self.build} if self.build else {}


def tuned_build_supported() -> bool:
    """Where MLX builds its CPU kernels with g++ (mlx_gpt/cpu_jit.py's supported())."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def names_of(text: str, key: str, known: tuple[str, ...] | None = None) -> list[str]:
    """Comma-separated names; `none` is the empty list."""
    if text.strip() == "none":
        return []
    names = [s.strip() for s in text.split(",")]
    if not all(names):
        raise UsageError(f"{key} has an empty name ({text!r})")
    if len(set(names)) != len(names):
        raise UsageError(f"{key} names one twice ({text!r})")
    for name in names:
        if known is not None and name not in known:
            raise UsageError(f"unknown {key[:-1]} {name!r} in {key}; known: {', '.join(known)}")
    return names


@dataclasses.dataclass(frozen=True)
class Plan:
    shapes: list[str]  # every shape measured, in order
    cpu_shapes: list[str]
    backends: list[str]
    builds: list[str]

    def variants(self, name: str, parallel: int) -> list[Variant]:
        """The engines measured at shape `name`, by process count, backend and build."""
        extra = name in self.cpu_shapes
        counts = (1, parallel) if extra and parallel > 1 else (1,)
        out = []
        for n in counts:
            for backend in self.backends:
                builds = (self.builds if extra else ["plain"]) if backend == "mlx" else [None]
                out += [Variant(backend, build, n) for build in builds]
        return out


def validate(bench: BenchConfig) -> Plan:
    """Every check that can fail, before anything is measured."""
    for ok, message in [
            (bench.rounds >= 1, f"rounds must be >= 1, got {bench.rounds}"),
            (bench.warmup >= 1, f"warmup must be >= 1 (it also sizes the timed steps), got "
                                f"{bench.warmup}"),
            (math.isfinite(bench.seconds) and bench.seconds > 0,
             f"seconds must be a number > 0, got {bench.seconds}"),
            (bench.min_steps >= 1, f"min_steps must be >= 1, got {bench.min_steps}"),
            (bench.parallel >= 1, f"parallel must be >= 1 (1 leaves the comparison out), got "
                                  f"{bench.parallel}")]:
        if not ok:
            raise UsageError(message)
    shapes = names_of(bench.shapes, "shapes")
    cpu_shapes = names_of(bench.cpu_shapes, "cpu_shapes")
    for name in shapes + cpu_shapes:
        preset_shape(name)  # the shapes are the presets: UsageError naming them
    if not shapes and not cpu_shapes:
        raise UsageError("nothing to measure: shapes and cpu_shapes are both none")
    backends = names_of(bench.backends, "backends", BACKENDS)
    if not backends:
        raise UsageError("backends needs at least one of mlx, torch")
    missing = [b for b in backends if importlib.util.find_spec(b) is None]
    if missing == backends:
        raise UsageError(f"{' and '.join(missing)} not installed: nothing to measure with; "
                         + " or ".join(f"pip install -e '.[{b}]'" for b in missing))
    for b in missing:
        print(f"warning: {b} is not installed here; measuring "
              f"{', '.join(x for x in backends if x not in missing)} only", file=sys.stderr)
    out = Path(bench.out)
    try:  # the report's folder, made and written to once before anything is measured
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".bench-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    builds = list(BUILDS) if bench.builds and tuned_build_supported() else ["plain"]
    return Plan(shapes + [s for s in cpu_shapes if s not in shapes], cpu_shapes,
                [b for b in backends if b not in missing], builds)


def sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    """Best-of float32 n^3 matmul GFLOP/s in numpy (its BLAS): the machine's peak here."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    return 2 * n**3 / min(timed(lambda: a @ a) for _ in range(repeats)) / 1e9


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
    if bench.quick:
        bench = dataclasses.replace(bench, shapes="demo", cpu_shapes="demo", rounds=1,
                                    seconds=min(bench.seconds, 1.0))
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
