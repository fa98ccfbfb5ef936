"""`python -m mlx_gpt bench`: throughput, FLOP/s, memory and overheads, measured side by side.

Everything is measured in one invocation on one machine so that the ratios mean something:
the machine's sgemm peak (numpy/OpenBLAS and MLX), the MLX train step against a PyTorch eager
step of the same model (torch_ref), probe and evaluation cost at the default intervals, and K
runs at once against K runs one after another. Results print as a table and are written to
reports/bench.json and reports/bench.md.

Model FLOPs per token follow the PaLM appendix (Chowdhery et al. 2022, app. B):
6 N + 12 L H Q T, with N the matmul parameters (everything but the position table; the tied
embedding counts once, as the output head) and L, H, Q, T layers, heads, head dim, context.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .config import TrainConfig, apply_overrides, split_key_values
from .errors import UsageError
from .model import GPT, ModelArgs, count_params, init_weights
from .optim import AdamW
from .train import make_train_step

GPT2_VOCAB = 50257
SHAPES = {
    # the reference shape of the performance targets
    "reference": dict(depth=6, d_model=256, n_heads=4, block_size=256, batch_size=8,
                      vocab=GPT2_VOCAB),
    # the study preset's model (mlx_gpt/sweep.py, preset `study`)
    "study": dict(depth=6, d_model=192, n_heads=3, block_size=256, batch_size=16,
                  vocab=GPT2_VOCAB),
    # the demo's model on the bytes tokenizer
    "demo": dict(depth=4, d_model=128, n_heads=4, block_size=64, batch_size=8, vocab=257),
}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    shapes: str = "reference,study"
    steps: int = 5  # timed steps per measurement (after 2 warm-up steps)
    torch: bool = True  # PyTorch eager baseline (needs the torch extra)
    parallel: int = 2  # K for "K runs at once"; 1 skips the measurement
    probes: bool = True
    out: str = "reports"


def flops_per_token(args: ModelArgs) -> float:
    model = GPT(args)
    n = count_params(model)["total"] - args.block_size * args.d_model  # minus wpe
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


def _shape_config(shape: dict) -> tuple[TrainConfig, ModelArgs]:
    cfg = TrainConfig(depth=shape["depth"], d_model=shape["d_model"], n_heads=shape["n_heads"],
                      block_size=shape["block_size"], batch_size=shape["batch_size"],
                      warmup_steps=10, max_steps=10_000)
    args = ModelArgs(vocab_size=shape["vocab"], depth=cfg.depth, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, block_size=cfg.block_size)
    return cfg, args


def _batch(cfg: TrainConfig, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (cfg.batch_size, cfg.block_size + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def mlx_step_time(shape: dict, steps: int) -> dict:
    """Seconds per compiled train step (the trainer's own step), and peak memory."""
    cfg, args = _shape_config(shape)
    model = GPT(args)
    init_weights(model, 0)
    step, state = make_train_step(model, AdamW(cfg, model.parameters()))

    x, y = (mx.array(a) for a in _batch(cfg, args.vocab_size))
    for _ in range(2):
        mx.eval(step(x, y), state)
    mx.reset_peak_memory()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        mx.eval(step(x, y), state)
        times.append(time.perf_counter() - t)
    return {"step_s": float(np.median(times)), "peak_memory_gb": mx.get_peak_memory() / 1e9,
            "model": model, "x": x, "y": y, "cfg": cfg}


def torch_step_time(shape: dict, steps: int) -> dict | None:
    """Seconds per eager PyTorch step of the same model, measured in a fresh process.

    The child runs with MLX_GPT_BLAS=none: OpenBLAS loaded into the global symbol scope would
    also capture libtorch's own sgemm calls and slow PyTorch down 2-3x (torch_ref/__init__.py)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    previous = os.environ.get("MLX_GPT_BLAS")
    os.environ["MLX_GPT_BLAS"] = "none"
    try:
        proc = ctx.Process(target=_torch_worker, args=(shape, steps, queue))
        proc.start()
    finally:
        if previous is None:
            del os.environ["MLX_GPT_BLAS"]
        else:
            os.environ["MLX_GPT_BLAS"] = previous
    result = queue.get()
    proc.join()
    return result


def _torch_worker(shape: dict, steps: int, queue) -> None:
    queue.put(_torch_step_time(shape, steps))


def _torch_step_time(shape: dict, steps: int) -> dict | None:
    try:
        import torch

        from torch_ref.model import GPT as TorchGPT
    except ImportError:
        return None
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg, args = _shape_config(shape)
    model = TorchGPT(args)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    x, y = (torch.from_numpy(a).long() for a in _batch(cfg, args.vocab_size))

    def step():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(2):
        step()
    times = [_timed(step) for _ in range(steps)]
    return {"step_s": float(np.median(times)), "threads": torch.get_num_threads()}


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


def _parallel_worker(shape: dict, steps: int, queue) -> None:
    result = mlx_step_time(shape, steps)
    queue.put(result["step_s"])


def k_at_once(shape: dict, steps: int, k: int) -> dict:
    """Aggregate tokens/s of K training processes at once against one process alone."""
    ctx = mp.get_context("spawn")
    tokens = shape["batch_size"] * shape["block_size"]
    out = {}
    for n in (1, k):
        queue = ctx.Queue()
        procs = [ctx.Process(target=_parallel_worker, args=(shape, steps, queue)) for _ in range(n)]
        for p in procs:
            p.start()
        step_times = [queue.get() for _ in procs]
        for p in procs:
            p.join()
        out[n] = sum(tokens / s for s in step_times)
    return {"k": k, "tokens_per_s_1": out[1], "tokens_per_s_k": out[k],
            "speedup": out[k] / out[1]}


def run(bench: BenchConfig) -> dict:
    names = [s for s in bench.shapes.split(",") if s]
    for name in names:
        if name not in SHAPES:
            raise UsageError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    from .blas import loaded as blas

    report: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "device": str(mx.default_device()), "blas": blas,
                                "mlx": mx.__version__}}
    print("measuring sgemm peak ...", flush=True)
    report["sgemm_gflops"] = sgemm_peak()
    peak = report["sgemm_gflops"]["numpy"]
    for name in names:
        shape = SHAPES[name]
        print(f"measuring shape {name} ...", flush=True)
        cfg, args = _shape_config(shape)
        fpt = flops_per_token(args)
        tokens = cfg.batch_size * cfg.block_size
        m = mlx_step_time(shape, bench.steps)
        entry = {
            "shape": shape, "params": count_params(GPT(args)), "flops_per_token": fpt,
            "mlx_tokens_per_s": tokens / m["step_s"],
            "mlx_gflops": fpt * tokens / m["step_s"] / 1e9,
            "peak_memory_gb": m["peak_memory_gb"],
        }
        entry["mlx_share_of_sgemm_peak"] = entry["mlx_gflops"] / peak
        if bench.probes:
            entry.update(probe_cost(m))
        if bench.torch:
            t = torch_step_time(shape, max(2, bench.steps // 2))
            if t:
                entry["torch_tokens_per_s"] = tokens / t["step_s"]
                entry["torch_gflops"] = fpt * tokens / t["step_s"] / 1e9
                entry["mlx_over_torch"] = entry["mlx_tokens_per_s"] / entry["torch_tokens_per_s"]
        report[name] = entry
    if bench.parallel > 1:
        print(f"measuring {bench.parallel} runs at once ...", flush=True)
        report["k_at_once"] = k_at_once(SHAPES["demo"], bench.steps * 4, bench.parallel)
    return report


def cell(entry: dict, key: str, fmt: str) -> str:
    return fmt.format(entry[key]) if key in entry else "-"


def markdown(report: dict) -> str:
    peak = report["sgemm_gflops"]
    lines = [f"Machine: {report['machine']['platform']}, {report['machine']['cpus']} CPUs, "
             f"MLX {report['machine']['mlx']} on {report['machine']['device']}, BLAS "
             f"{report['machine']['blas']}. sgemm 2048^3: numpy {peak['numpy']:.0f} GFLOP/s, "
             f"MLX {peak['mlx']:.0f} GFLOP/s.", "",
             "| shape | params | MLX tok/s | MLX GFLOP/s | share of sgemm peak | PyTorch eager "
             "tok/s | MLX / PyTorch | peak memory | probe overhead | eval overhead |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in SHAPES:
        e = report.get(name)
        if not e:
            continue
        lines.append(
            f"| {name} | {e['params']['total'] / 1e6:.1f}M | {e['mlx_tokens_per_s']:,.0f} | "
            f"{e['mlx_gflops']:.1f} | {e['mlx_share_of_sgemm_peak']:.0%} | "
            f"{cell(e, 'torch_tokens_per_s', '{:,.0f}')} | {cell(e, 'mlx_over_torch', '{:.2f}x')} | "
            f"{e['peak_memory_gb']:.2f} GB | {cell(e, 'probe_overhead', '{:.1%}')} | "
            f"{cell(e, 'eval_overhead', '{:.1%}')} |")
    if "k_at_once" in report:
        k = report["k_at_once"]
        lines += ["", f"{k['k']} demo runs at once: {k['tokens_per_s_k']:,.0f} tok/s in total "
                      f"against {k['tokens_per_s_1']:,.0f} tok/s for one run alone "
                      f"({k['speedup']:.2f}x)."]
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    bench = apply_overrides(BenchConfig(), split_key_values(argv))
    if bench.steps < 1:
        raise UsageError("steps must be >= 1")
    report = run(bench)
    text = markdown(report)
    print(text)
    out = Path(bench.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(text + "\n")
    print(f"written: {out / 'bench.md'}, {out / 'bench.json'}", file=sys.stderr)
    return 0
