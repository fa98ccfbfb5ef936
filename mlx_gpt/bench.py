"""`python -m qkstudy bench`: throughput, FLOP/s, memory and overheads, measured side by side.

Everything is measured in one invocation on one machine so that the ratios mean something:
the machine's sgemm peak (numpy/OpenBLAS and MLX), the MLX train step against a PyTorch eager
step of the same model (`python -m torch_ref bench-step`, in its own process), probe and
evaluation cost at the default intervals, and, at the small shapes, MLX's plain CPU build
against the tuned one (mlx_gpt/cpu_jit.py) and one training process against K at once, in
interleaved rounds of fresh processes. Results print as tables and are written to
reports/bench.json and reports/bench.md.

Model FLOPs per token follow the PaLM appendix (Chowdhery et al. 2022, app. B):
6 N + 12 L H Q T, with N the matmul parameters (everything but the position table; the tied
embedding counts once, as the output head) and L, H, Q, T layers, heads, head dim, context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from qkstudy import runlog
from qkstudy.cli import keys_usage
from qkstudy.config import TrainConfig, apply_overrides, split_key_values
from qkstudy.errors import UsageError
from qkstudy.weights import count_params

from . import cpu_jit
from .engine import make_train_step
from .model import GPT, ModelArgs, init_weights
from .optim import make_optimizer

GPT2_VOCAB = 50257
SHAPES = {
    # the reference shape of the performance targets
    "reference": dict(depth=6, d_model=256, n_heads=4, block_size=256, batch_size=8,
                      vocab=GPT2_VOCAB),
    # the study preset's model (mlx_gpt/sweep/config.py, preset `study`)
    "study": dict(depth=6, d_model=192, n_heads=3, block_size=256, batch_size=16,
                  vocab=GPT2_VOCAB),
    # the demo's model on the bytes tokenizer
    "demo": dict(depth=4, d_model=128, n_heads=4, block_size=64, batch_size=8, vocab=257),
    # a small study on the bytes tokenizer: wide enough for attention-logit growth in a few
    # hundred steps, small enough for sweeps on a laptop CPU
    "mini": dict(depth=4, d_model=128, n_heads=4, block_size=128, batch_size=16, vocab=257),
}
SHAPE_KEYS = ("depth", "d_model", "n_heads", "block_size", "batch_size", "vocab")
BUILDS = ("plain", "native")  # MLX_GPT_CPU_JIT values: MLX's own JIT build, and -march=native


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    shapes: str = "reference,study"  # the train-step table (MLX, PyTorch, FLOP/s, memory); none
    steps: int = 5  # timed steps per measurement (after 2 warm-up steps)
    torch: bool = True  # PyTorch eager baseline (needs the torch extra)
    probes: bool = True
    cpu_shapes: str = "demo,mini"  # the CPU table: plain vs tuned build, 1 vs K processes; none
    parallel: int = 2  # K for "K processes at once"; 1 leaves that comparison out
    builds: bool = True  # compare the plain and the tuned CPU build (Linux x86-64 only)
    rounds: int = 2  # interleaved rounds of the CPU table; the median is reported
    quick: bool = False  # demo shape only, 2 steps, 1 round: a smoke test
    out: str = "reports"

    def resolved(self) -> BenchConfig:
        if not self.quick:
            return self
        return dataclasses.replace(self, shapes="demo", cpu_shapes="demo", rounds=1,
                                   steps=min(self.steps, 2))


def shape_names(text: str, key: str) -> list[str]:
    """Comma-separated shape names; `none` leaves that table out."""
    if text.strip() == "none":
        return []
    names = [s.strip() for s in text.split(",")]
    if not all(names):
        raise UsageError(f"{key} has an empty shape name ({text!r}); give names from "
                         f"{', '.join(SHAPES)}, or none to leave that table out")
    for name in names:
        if name not in SHAPES:
            raise UsageError(f"unknown shape {name!r} in {key}; known: {', '.join(SHAPES)}")
    return names


def validate(bench: BenchConfig) -> tuple[list[str], list[str], Path]:
    """Every check that can fail, before anything is measured: (shapes, cpu_shapes, out)."""
    if bench.steps < 1:
        raise UsageError(f"steps must be >= 1, got {bench.steps}")
    if bench.parallel < 1:
        raise UsageError(f"parallel must be >= 1 (1 leaves the comparison out), got {bench.parallel}")
    if bench.rounds < 1:
        raise UsageError(f"rounds must be >= 1, got {bench.rounds}")
    shapes, cpu_shapes = shape_names(bench.shapes, "shapes"), shape_names(bench.cpu_shapes,
                                                                           "cpu_shapes")
    if not shapes and not cpu_shapes:
        raise UsageError("nothing to measure: shapes and cpu_shapes are both none")
    out = Path(bench.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".bench-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    return shapes, cpu_shapes, out


def flops_per_token(args: ModelArgs) -> float:
    model = GPT(args)
    n = count_params(model.args)["total"] - args.block_size * args.d_model  # minus wpe
    attention = 12 * args.depth * args.n_heads * (args.d_model // args.n_heads) * args.block_size
    return 6.0 * n + attention


def sgemm_peak(n: int = 2048, repeats: int = 3) -> dict[str, float]:
    """Best-of sgemm GFLOP/s at n^3 in numpy (OpenBLAS) and in MLX."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    best_np = min(_timed(lambda: a @ a) for _ in range(repeats))
    am = mx.array(a)
    mx.eval(am @ am)
    best_mx = min(_timed(lambda: mx.eval(am @ am)) for _ in range(repeats))
    return {"numpy": 2 * n**3 / best_np / 1e9, "mlx": 2 * n**3 / best_mx / 1e9}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def shape_config(shape: dict) -> tuple[TrainConfig, ModelArgs]:
    cfg = TrainConfig(depth=shape["depth"], d_model=shape["d_model"], n_heads=shape["n_heads"],
                      block_size=shape["block_size"], batch_size=shape["batch_size"],
                      warmup_steps=10, max_steps=10_000)
    args = ModelArgs(vocab_size=shape["vocab"], depth=cfg.depth, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, block_size=cfg.block_size)
    return cfg, args


def random_batch(cfg: TrainConfig, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (cfg.batch_size, cfg.block_size + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def mlx_step_time(shape: dict, steps: int, ready=None) -> dict:
    """Seconds per compiled train step (the trainer's own step), and peak memory. `ready`, a
    multiprocessing barrier, lines up the timed steps of processes measured together."""
    cfg, args = shape_config(shape)
    model = GPT(args)
    init_weights(model, 0)
    step, state = make_train_step(model, make_optimizer(cfg, model.parameters()), cfg.grad_clip)

    x, y = (mx.array(a) for a in random_batch(cfg, args.vocab_size))
    for _ in range(2):
        mx.eval(step(x, y), state)
    if ready is not None:
        ready.wait()
    mx.reset_peak_memory()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        mx.eval(step(x, y), state)
        times.append(time.perf_counter() - t)
    return {"step_s": float(np.median(times)), "peak_memory_gb": mx.get_peak_memory() / 1e9,
            "model": model, "x": x, "y": y, "cfg": cfg}


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """os.environ with `values` set, for the child processes started inside."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def torch_step_time(shape: dict, steps: int) -> dict | None:
    """Seconds per eager PyTorch step of the same model (torch_ref/bench.py), in a fresh
    process without the OpenBLAS preload; None when PyTorch is not installed."""
    words = [f"{k}={shape[k]}" for k in SHAPE_KEYS] + [f"steps={steps}"]
    with environment(MLX_GPT_BLAS="none"):
        done = subprocess.run([sys.executable, "-m", "torch_ref", "bench-step", *words],
                              capture_output=True, text=True)
    if done.returncode != 0:
        if "PyTorch is not installed" not in done.stderr:
            print(f"warning: the PyTorch step failed: {done.stderr.strip()[-500:]}",
                  file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_cost(measured: dict, repeats: int = 3) -> dict:
    """Probe and eval cost per call, and as a share of training at the default intervals."""
    from . import probes

    model, x, y = measured["model"], measured["x"], measured["y"]
    defaults = TrainConfig()
    params = dict(tree_flatten(model.parameters()))
    probes.measure(model, x, y, 0)
    probe_s = min(_timed(lambda: (probes.measure(model, x, y, 0),
                                  probes.update_stats(0, params, params)))
                  for _ in range(repeats))
    eval_fn = mx.compile(model.loss, inputs=model.state)
    mx.eval(eval_fn(x, y))
    eval_s = min(_timed(lambda: mx.eval(eval_fn(x, y))) for _ in range(repeats))
    step_s = measured["step_s"]
    return {
        "probe_call_s": probe_s,
        "probe_overhead": probe_s / (defaults.probe_every * step_s),
        "eval_call_s": eval_s * defaults.eval_batches,
        "eval_overhead": eval_s * defaults.eval_batches / (defaults.eval_every * step_s),
    }


def _process_worker(shape: dict, steps: int, ready, queue) -> None:
    queue.put(mlx_step_time(shape, steps, ready)["step_s"])


def processes_tokens_per_s(shape: dict, steps: int, n: int, build: str) -> float:
    """Total tokens/s of n fresh training processes at once, each on MLX's `build` CPU JIT
    (MLX_GPT_CPU_JIT); their timed steps start together, after compilation and warm-up."""
    ctx = mp.get_context("spawn")
    queue, ready = ctx.Queue(), ctx.Barrier(n)
    with environment(MLX_GPT_CPU_JIT=build):
        procs = [ctx.Process(target=_process_worker, args=(shape, steps, ready, queue))
                 for _ in range(n)]
        for p in procs:
            p.start()
    try:
        step_times = [queue.get(timeout=3600) for _ in procs]
    finally:
        for p in procs:
            p.join()
    return sum(shape["batch_size"] * shape["block_size"] / s for s in step_times)


def cpu_table(names: list[str], bench: BenchConfig) -> dict:
    """tok/s of each (build, processes) pair at each shape: the median of bench.rounds rounds,
    each round measuring every pair once in the same order (plain and tuned interleaved)."""
    builds = list(BUILDS) if bench.builds and cpu_jit.supported() else ["plain"]
    counts = sorted({1, bench.parallel})
    out = {}
    for name in names:
        shape = SHAPES[name]
        samples: dict[str, list[float]] = {}
        for r in range(bench.rounds):
            for n in counts:
                for build in builds:
                    print(f"measuring {name}: {build} build, {n} process(es), round {r + 1} ...",
                          flush=True)
                    samples.setdefault(f"{build}_{n}", []).append(
                        processes_tokens_per_s(shape, bench.steps * 4, n, build))
        entry = {key: float(np.median(v)) for key, v in samples.items()}
        entry["samples"] = samples
        best = max((k for k in entry if k != "samples"), key=lambda k: entry[k])
        entry["fastest"] = best
        out[name] = entry
    return {"shapes": out, "builds": builds, "parallel": bench.parallel, "rounds": bench.rounds}


def run(bench: BenchConfig) -> dict:
    bench = bench.resolved()
    names, cpu_names, _ = validate(bench)
    from .blas import loaded as blas

    report: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "device": str(mx.default_device()), "blas": blas,
                                "mlx": mx.__version__, "cpu": cpu_jit.cpu_model(),
                                "load_average": _load_average(),
                                "cpu_jit": "native" if cpu_jit.active else "plain"},
                    "config": dataclasses.asdict(bench)}
    print("measuring sgemm peak ...", flush=True)
    report["sgemm_gflops"] = sgemm_peak()
    peak = report["sgemm_gflops"]["numpy"]
    for name in names:
        shape = SHAPES[name]
        print(f"measuring shape {name} ...", flush=True)
        cfg, args = shape_config(shape)
        fpt = flops_per_token(args)
        tokens = cfg.batch_size * cfg.block_size
        m = mlx_step_time(shape, bench.steps)
        entry = {
            "shape": shape, "params": count_params(args), "flops_per_token": fpt,
            "mlx_tokens_per_s": tokens / m["step_s"],
            "mlx_gflops": fpt * tokens / m["step_s"] / 1e9,
            "peak_memory_gb": m["peak_memory_gb"],
        }
        entry["mlx_share_of_sgemm_peak"] = entry["mlx_gflops"] / peak
        if bench.probes:
            entry.update(probe_cost(m))
        del m
        if bench.torch:
            t = torch_step_time(shape, max(2, bench.steps // 2))
            if t:
                entry["torch_tokens_per_s"] = tokens / t["step_s"]
                entry["torch_gflops"] = fpt * tokens / t["step_s"] / 1e9
                entry["mlx_over_torch"] = entry["mlx_tokens_per_s"] / entry["torch_tokens_per_s"]
        report[name] = entry
    if cpu_names and (bench.parallel > 1 or (bench.builds and cpu_jit.supported())):
        report["cpu"] = cpu_table(cpu_names, bench)
    report["machine"]["load_average_after"] = _load_average()
    return report


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def cell(entry: dict, key: str, fmt: str) -> str:
    return fmt.format(entry[key]) if key in entry else "-"


def ratio(entry: dict, a: str, b: str) -> str:
    return f"{entry[a] / entry[b]:.2f}x" if a in entry and b in entry else "-"


def cpu_markdown(cpu: dict) -> list[str]:
    k = cpu["parallel"]
    label = {"plain": "plain", "native": "tuned"}
    lines = ["", f"CPU builds and processes (tokens/s in total; median of {cpu['rounds']} "
                 f"interleaved round(s), each measurement in fresh processes; tuned = MLX's "
                 f"CPU kernels built with -march=native, MLX_GPT_CPU_JIT=native):", "",
             f"| shape | plain, 1 process | tuned, 1 process | tuned / plain | plain, {k} at "
             f"once | tuned, {k} at once | {k} / 1 process (plain) | {k} / 1 process (tuned) "
             f"| fastest |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in cpu["shapes"].items():
        build, n = e["fastest"].split("_")
        lines.append(
            f"| {name} | {cell(e, 'plain_1', '{:,.0f}')} | {cell(e, 'native_1', '{:,.0f}')} | "
            f"{ratio(e, 'native_1', 'plain_1')} | {cell(e, f'plain_{k}', '{:,.0f}')} | "
            f"{cell(e, f'native_{k}', '{:,.0f}')} | {ratio(e, f'plain_{k}', 'plain_1')} | "
            f"{ratio(e, f'native_{k}', 'native_1')} | {label[build]}, {n} process(es) |")
    return lines


def markdown(report: dict) -> str:
    peak = report["sgemm_gflops"]
    machine = report["machine"]
    load = machine.get("load_average")
    lines = [f"Machine: {machine['platform']}, {machine['cpu'] or 'CPU unknown'}, "
             f"{machine['cpus']} CPUs, MLX {machine['mlx']} on {machine['device']}, BLAS "
             f"{machine['blas']}, CPU JIT {machine['cpu_jit']}"
             + (f", load average {load[0]:.1f} at the start" if load else "")
             + f". sgemm 2048^3: numpy {peak['numpy']:.0f} GFLOP/s, MLX {peak['mlx']:.0f} GFLOP/s."]
    rows = [(name, report[name]) for name in SHAPES if name in report]
    if rows:
        lines += ["", "| shape | params | MLX tok/s | MLX GFLOP/s | share of sgemm peak | "
                      "PyTorch eager tok/s | MLX / PyTorch | peak memory | probe overhead | "
                      "eval overhead |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in rows:
        lines.append(
            f"| {name} | {e['params']['total'] / 1e6:.1f}M | {e['mlx_tokens_per_s']:,.0f} | "
            f"{e['mlx_gflops']:.1f} | {e['mlx_share_of_sgemm_peak']:.0%} | "
            f"{cell(e, 'torch_tokens_per_s', '{:,.0f}')} | {cell(e, 'mlx_over_torch', '{:.2f}x')} | "
            f"{e['peak_memory_gb']:.2f} GB | {cell(e, 'probe_overhead', '{:.1%}')} | "
            f"{cell(e, 'eval_overhead', '{:.1%}')} |")
    if "cpu" in report:
        lines += cpu_markdown(report["cpu"])
    return "\n".join(lines)


USAGE = keys_usage(
    "python -m qkstudy bench [key=value ...]",
    "Measures, side by side in one invocation: the train step (MLX and PyTorch eager) per shape,\n"
    "FLOP/s and share of the sgemm peak, peak memory, probe and eval overhead, and on the CPU\n"
    "the plain against the tuned kernel build and one against K processes. Writes\n"
    "<out>/bench.md and <out>/bench.json.",
    BenchConfig)


def cli(argv: list[str]) -> int:
    bench = apply_overrides(BenchConfig(), split_key_values(argv))
    report = run(bench)
    text = markdown(report)
    print(text)
    out = Path(bench.out)
    runlog.write_json(out / "bench.json", report)
    runlog.write_text(out / "bench.md", text + "\n")
    print(f"written: {out / 'bench.md'}, {out / 'bench.json'}", file=sys.stderr)
    return 0
