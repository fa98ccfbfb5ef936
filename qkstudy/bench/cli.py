"""`python -m qkstudy bench [key=value ...]`: the rounds, the report and its Markdown tables."""

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

from .. import files, provenance
from ..cli import keys_usage
from ..config import apply_overrides, split_key_values
from ..errors import UsageError
from ..forecast import BENCH_KEY, sgemm_gflops
from ..parameters import count_params, flops_per_token
from ..progress import table
from .shapes import preset_base, preset_shape, shape_config
from .step import Spec, StepFailed, measure_together

BACKENDS = ("mlx", "torch")
LABEL = {"mlx": "MLX", "torch": "PyTorch"}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    shapes: str = "demo,mini,study"  # preset shapes measured with every backend
    backends: str = "mlx,torch"
    rounds: int = 3  # every measurement once per round; medians and ranges over rounds
    warmup: int = 2  # untimed steps per measurement (compilation, first allocations)
    seconds: float = 3.0  # timed steps per measurement: enough for about this long ...
    min_steps: int = 3  # ... and at least this many
    probes: bool = True  # evaluation and probe cost (round 1)
    quick: bool = False  # the demo shape, one round, one second a measurement: a smoke test
    out: str = "reports"


def names_of(text: str, key: str, known: tuple[str, ...] | None = None) -> list[str]:
    names = [s.strip() for s in text.split(",")]
    if not all(names):
        raise UsageError(f"{key} has an empty name ({text!r})")
    if len(set(names)) != len(names):
        raise UsageError(f"{key} names one twice ({text!r})")
    for name in names:
        if known is not None and name not in known:
            raise UsageError(f"unknown {key[:-1]} {name!r} in {key}; known: {', '.join(known)}")
    return names


def validate(bench: BenchConfig) -> tuple[list[str], list[str]]:
    """(the shapes, the installed backends) to measure; UsageError for bad keys or values."""
    for ok, message in [
            (bench.rounds >= 1, f"rounds must be >= 1, got {bench.rounds}"),
            (bench.warmup >= 1, f"warmup must be >= 1 (it also sizes the timed steps), got "
                                f"{bench.warmup}"),
            (math.isfinite(bench.seconds) and bench.seconds > 0,
             f"seconds must be a number > 0, got {bench.seconds}"),
            (bench.min_steps >= 1, f"min_steps must be >= 1, got {bench.min_steps}")]:
        if not ok:
            raise UsageError(message)
    shapes = names_of(bench.shapes, "shapes")
    for name in shapes:
        preset_shape(name)  # the shapes are the presets: UsageError naming them
    backends = names_of(bench.backends, "backends", BACKENDS)
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
    return shapes, [b for b in backends if b not in missing]


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


def measure_case(name: str, backend: str, bench: BenchConfig, first: bool) -> dict:
    """One measurement of the backend at shape `name` in a fresh process, or {"error": why}."""
    shape = preset_shape(name)
    cfg, _ = shape_config(shape, preset_base(name), backend=backend)
    spec = Spec(config=dataclasses.asdict(cfg), vocab=shape["vocab"], warmup=bench.warmup,
                seconds=bench.seconds, min_steps=bench.min_steps,
                overheads=first and bench.probes, matmul=first)
    try:
        return measure_together(spec)[0]
    except StepFailed as e:
        return {"error": str(e)}


def record(report: dict, entry: dict, backend: str, m: dict, first: bool) -> None:
    """One measurement into the report (in round 1 also facts, overheads and matmul peak)."""
    key = BENCH_KEY[backend]
    entry["samples"].setdefault(key, []).append(m.get("tokens_per_s"))
    entry.setdefault("details", {}).setdefault(key, []).append(m)
    if "error" in m:
        print(f"failed ({m['error']})", flush=True)
        return
    print(f"{m['tokens_per_s']:,.0f} tok/s", flush=True)
    if first:
        report["facts"].setdefault(backend, m["backend"] | {"engine": m["engine"]})
        if "overheads" in m:
            entry["overheads"][backend] = m["overheads"]
        if "matmul_gflops" in m:
            report.setdefault("matmul_gflops", {}).setdefault(backend, m["matmul_gflops"])


def run(bench: BenchConfig, argv: list[str] | None = None) -> dict:
    if bench.quick:
        bench = dataclasses.replace(bench, shapes="demo", rounds=1,
                                    seconds=min(bench.seconds, 1.0))
    names, backends = validate(bench)
    report: dict = {
        "command": shlex.join(["python", "-m", "qkstudy", "bench", *(argv or [])]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "cpu": provenance.chip(), "load_average": load_average(),
                    "load_before_each": []},
        "config": dataclasses.asdict(bench), "backends": backends, "facts": {}}
    print("measuring the sgemm peak (numpy) ...", flush=True)
    report["sgemm_gflops"] = sgemm_gflops()
    shapes: dict[str, dict] = {}
    for name in names:
        _, args = shape_config(preset_shape(name), preset_base(name))
        shapes[name] = {"shape": preset_shape(name), "params": count_params(args),
                        "flops_per_token": flops_per_token(args), "samples": {},
                        "overheads": {}}
    for r in range(bench.rounds):
        for name in names:
            for backend in backends:
                print(f"measuring {name}: {LABEL[backend]}, round {r + 1} of {bench.rounds} ...",
                      end=" ", flush=True)
                report["machine"]["load_before_each"] += (load_average() or [])[:1]
                record(report, shapes[name], backend, measure_case(name, backend, bench, r == 0),
                       r == 0)
    mlx, torch = BENCH_KEY["mlx"], BENCH_KEY["torch"]
    for entry in shapes.values():  # medians, ranges, FLOP/s and the per-round paired ratio
        samples = entry["samples"]
        entry["tokens_per_s"] = {k: spread(v) for k, v in samples.items()}
        entry["gflops"] = {k: s["median"] * entry["flops_per_token"] / 1e9
                           for k, s in entry["tokens_per_s"].items() if s}
        entry["share_of_sgemm_peak"] = {k: g / report["sgemm_gflops"]
                                        for k, g in entry["gflops"].items()}
        entry["ratios"] = {f"{torch}/{mlx}": spread(
            [y / x for x, y in zip(samples[mlx], samples[torch]) if x and y is not None])
        } if mlx in samples and torch in samples else {}
    report["shapes"] = shapes
    report["machine"]["load_average_after"] = load_average()
    return report


def median_range(s: dict | None, fmt: str = "{:,.0f}", unit: str = "") -> str:
    if not s:
        return "-"
    text = fmt.format(s["median"]) + unit
    return text if s["n"] == 1 else f"{text} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def markdown(report: dict) -> str:
    m, cfg = report["machine"], report["config"]
    load, after, during = (m.get(k) for k in ("load_average", "load_average_after",
                                              "load_before_each"))
    matmul, facts = report.get("matmul_gflops", {}), report.get("facts", {})
    versions = [f"MLX {facts['mlx']['mlx']} on {facts['mlx']['device']} (BLAS "
                f"{facts['mlx']['blas']})" if "mlx" in facts else "",
                f"PyTorch {facts['torch']['torch']} on {facts['torch']['device']}, "
                f"{facts['torch']['threads']} threads" if "torch" in facts else ""]
    return "\n".join([
        f"Machine: {m['platform']}, {m['cpu'] or 'CPU unknown'}, {m['cpus']} CPUs; "
        + "; ".join(v for v in versions if v)
        + (f"; 1-minute load average {load[0]:.2f} at the start" if load else "")
        + (f", {min(during):.2f}-{max(during):.2f} before each measurement (the bench's own "
           f"processes included)" if during else "")
        + (f", {after[0]:.2f} at the end" if after else "") + ".",
        f"Float32 matmul peak (2048^3, best of 3): numpy {report['sgemm_gflops']:.0f} GFLOP/s"
        + "".join(f", {LABEL[b]} {g:.0f}" for b, g in matmul.items()) + ".",
        f"Command: `{report['command']}`. Each value: the median of {cfg['rounds']} round(s) "
        f"(range in brackets); each measurement a fresh process running the run's own engine: "
        f"{cfg['warmup']} warm-up steps, then timed steps for about {cfg['seconds']:g} s (at "
        f"least {cfg['min_steps']}), read back every log_every steps as a run does. Ratios: "
        "the median (range) of the per-round ratios.",
    ] + speed_table(report))


def speed_table(report: dict) -> list[str]:
    shapes, backends = report["shapes"], report["backends"]
    both = sorted(backends) == ["mlx", "torch"]
    head = (["shape", "params", "MFLOPs/token"] + [f"{LABEL[b]} tok/s" for b in backends]
            + ["PyTorch / MLX"] * both
            + [f"{LABEL[b]} GFLOP/s (share of sgemm peak)" for b in backends]
            + [f"{LABEL[b]} probe / eval overhead" for b in backends])
    lines = ["", "The shapes (each preset's model at its largest depth):", ""] + table(
        ["shape", "depth", "d_model", "heads", "block", "batch", "vocabulary"],
        [[name] + [str(e["shape"][k]) for k in ("depth", "d_model", "n_heads", "block_size",
                                                "batch_size")] + [f"{e['shape']['vocab']:,}"]
         for name, e in shapes.items()])
    rows = []
    for name, e in shapes.items():
        row = [name, f"{e['params']['total'] / 1e6:.2f}M", f"{e['flops_per_token'] / 1e6:.1f}"]
        row += [median_range(e["tokens_per_s"].get(BENCH_KEY[b])) for b in backends]
        row += [median_range(e["ratios"].get("torch-1/mlx-1"), "{:.2f}", "x")] * both
        for b in backends:
            k = BENCH_KEY[b]
            row += [f"{e['gflops'][k]:.1f} ({e['share_of_sgemm_peak'][k]:.0%})"
                    if k in e["gflops"] else "-"]
        for b in backends:
            o = e["overheads"].get(b)
            row += [f"{o['probe_overhead']:.1%} / {o['eval_overhead']:.1%}" if o else "-"]
        rows.append(row)
    lines += ["", "Train step, one process:", ""] + table(head, rows)
    if any(e["overheads"] for e in shapes.values()):
        lines += ["", "Overhead: one probe call (measure, snapshot, update_stats) per probe_every "
                      "steps and one evaluation (eval_batches batches) per eval_every steps, at "
                      "each preset's own intervals, as a share of its training time."]
    return lines


USAGE = keys_usage(
    "python -m qkstudy bench [key=value ...]",
    "Measures every backend's training step the same way (each measurement a fresh process\n"
    "running the run's own engine at a preset's shape; median and range of `rounds` rounds):\n"
    "tokens/s, PyTorch / MLX, FLOP/s and share of the sgemm peak, probe and eval overhead.\n"
    "Writes <out>/bench.md and <out>/bench.json.",
    BenchConfig)


def write_report(out: Path, text_file: str, text: str, report: dict, *more: str) -> None:
    """Prints `text`, writes it to <out>/<text_file> and `report` beside it as JSON; says where."""
    print(text)
    json_file = Path(text_file).with_suffix(".json").name
    files.write_json(out / json_file, report)
    files.write_text(out / text_file, text + "\n")
    print("written: " + ", ".join(str(out / f) for f in (text_file, json_file, *more)),
          file=sys.stderr)


def cli(argv: list[str]) -> int:
    bench = apply_overrides(BenchConfig(), split_key_values(argv))
    report = run(bench, argv)
    write_report(Path(bench.out), "bench.md", markdown(report), report)
    return 0
