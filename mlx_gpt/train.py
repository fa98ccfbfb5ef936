"""Train one run: compiled AdamW step, divergence detection, Parquet logs, exact resume.

`python -m mlx_gpt train key=value ...`. Running the same config again resumes from its
checkpoint; a finished run (summary.json says completed or diverged) is not re-run.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from . import probes as probe_lib
from . import runlog
from .batches import probe_batch, train_stream, val_batches
from .config import TrainConfig, parse_train_config
from .errors import UsageError
from .locks import RunBusy, run_lock
from .model import GPT, ModelArgs, count_params, cross_entropy, init_weights
from .optim import AdamW


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    return ModelArgs(vocab_size=vocab_size, depth=cfg.depth, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, block_size=cfg.block_size, bias=cfg.bias,
                     qk_norm=cfg.qk_norm)


def build_model(cfg: TrainConfig, vocab_size: int) -> GPT:
    model = GPT(model_args(cfg, vocab_size))
    init_weights(model, cfg.seed)
    mx.eval(model.parameters())
    return model


def run_dir_of(cfg: TrainConfig) -> Path:
    return Path(cfg.runs_dir) / cfg.sweep / cfg.run_id


def load_data(cfg: TrainConfig):
    from .data import load_tokens

    train_tokens, val_tokens, meta = load_tokens(cfg.data)
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < cfg.block_size + 2:
            raise UsageError(f"block_size={cfg.block_size} is above the {split} data of {cfg.data} "
                             f"({len(tokens)} tokens)")
    return train_tokens, val_tokens, meta


def make_train_step(model: GPT, opt: AdamW):
    """The compiled update: (x, y) -> (loss, pre-clip grad norm, lr), mutating model and opt.

    Returns it with the state list to pass to mx.eval / mx.async_eval after each call."""
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: cross_entropy(m(x), y))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array):
        loss, grads = loss_and_grad(model, x, y)
        grad_norm, lr = opt.update(model, grads)
        return loss, grad_norm, lr

    return step_fn, state


# --- checkpoints -----------------------------------------------------------------------------
# A checkpoint holds weights, AdamW state and the step. The step is also the whole data and RNG
# cursor: batch k is a pure function of (data_seed, k) and the step draws no random numbers
# (no dropout), so nothing else is needed for a bit-identical resume.

def save_checkpoint(path: Path, model: GPT, opt: AdamW, step: int, extra: dict) -> None:
    arrays = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    arrays.update({f"opt.m.{k}": v for k, v in opt.state["m"].items()})
    arrays.update({f"opt.v.{k}": v for k, v in opt.state["v"].items()})
    arrays["opt.step"] = opt.state["step"]
    tmp = path.with_name(".checkpoint.tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays, metadata={"step": str(step), **{
        k: repr(v) for k, v in extra.items()}})
    tmp.replace(path)


def load_checkpoint(path: Path, model: GPT, opt: AdamW) -> tuple[int, dict]:
    import ast

    arrays, metadata = mx.load(str(path), return_metadata=True)
    model.update(tree_unflatten([(k[6:], v) for k, v in arrays.items() if k.startswith("model.")]))
    for key in ("m", "v"):
        prefix = f"opt.{key}."
        opt.state[key].update({k[len(prefix):]: v for k, v in arrays.items()
                               if k.startswith(prefix)})
    opt.state["step"] = arrays["opt.step"]
    extra = {k: ast.literal_eval(v) for k, v in metadata.items() if k != "step"}
    return int(metadata["step"]), extra


# --- display ---------------------------------------------------------------------------------

class Display:
    """One live line on a terminal; plain periodic lines (every ~30 s) otherwise."""

    def __init__(self, run_id: str, steps: int, enabled: bool = True, prefix: str = ""):
        self.run_id, self.steps, self.enabled, self.prefix = run_id, steps, enabled, prefix
        self.tty = sys.stdout.isatty()
        self.last_print = 0.0

    def update(self, step: int, loss: float, tok_s: float, eta_s: float, val: float | None) -> None:
        if not self.enabled:
            return
        val_text = f" val {val:.3f}" if val is not None else ""
        line = (f"{self.prefix}{self.run_id} step {step}/{self.steps} loss {loss:.4f}{val_text} "
                f"{tok_s:,.0f} tok/s ETA {format_seconds(eta_s)}")
        if self.tty:
            print("\r\033[K" + line, end="", flush=True)
        elif time.monotonic() - self.last_print > 30:
            print(line, flush=True)
            self.last_print = time.monotonic()

    def close(self, message: str) -> None:
        if self.enabled:
            print(("\r\033[K" if self.tty else "") + f"{self.prefix}{self.run_id} {message}",
                  flush=True)


def format_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# --- the run ---------------------------------------------------------------------------------

def finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def train(cfg: TrainConfig, *, verbose: bool = True, prefix: str = "") -> dict:
    """Run (or resume, or skip if finished) one config. Returns its summary."""
    cfg.validate()
    train_tokens, val_tokens, meta = load_data(cfg)  # all checks before anything is written
    run_dir = run_dir_of(cfg)
    done = runlog.read_json(run_dir / "summary.json")
    if done and done.get("status") in runlog.FINISHED:
        if verbose:
            print(f"{prefix}{cfg.run_id} already {done['status']}; skipping", flush=True)
        return done
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock(run_dir) as acquired:
        if not acquired:
            raise RunBusy(f"{run_dir} is being trained by another process")
        done = runlog.read_json(run_dir / "summary.json")  # finished while we took the lock
        if done and done.get("status") in runlog.FINISHED:
            return done
        try:
            return _train_locked(cfg, run_dir, train_tokens, val_tokens, meta, verbose, prefix)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as e:
            (run_dir / "traceback.txt").write_text(traceback.format_exc())
            runlog.write_json(run_dir / "summary.json", {
                **summary_base(cfg), "status": "failed", "error": f"{type(e).__name__}: {e}"})
            raise


def summary_base(cfg: TrainConfig) -> dict:
    return {"run_id": cfg.run_id, "framework": "mlx", "lr": cfg.lr, "depth": cfg.depth,
            "qk_norm": cfg.qk_norm, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "d_model": cfg.d_model, "sweep": cfg.sweep, "config": cfg.identity()}


def _train_locked(cfg, run_dir, train_tokens, val_tokens, meta, verbose, prefix) -> dict:
    steps = cfg.steps
    runlog.write_json(run_dir / "config.json", {**cfg.identity(), "run_id": cfg.run_id,
                                                "framework": "mlx"})
    manifest = runlog.manifest(cfg.data, "mlx", f"{mx.default_device()}")
    model = build_model(cfg, meta["vocab_size"])
    opt = AdamW(cfg, model.parameters())

    ckpt_path = run_dir / "checkpoint.safetensors"
    start, extra = 0, {"init_loss": None, "elapsed": 0.0, "train_seconds": 0.0}
    if ckpt_path.exists():
        start, extra = load_checkpoint(ckpt_path, model, opt)
        manifest["resumed_from_step"] = start
    for folder in ("metrics", "probes"):
        runlog.drop_parts_from(run_dir / folder, start)
    runlog.write_json(run_dir / "manifest.json", manifest)

    step_fn, state = make_train_step(model, opt)

    @partial(mx.compile, inputs=model.state)
    def eval_fn(x, y):
        return cross_entropy(model(x), y)

    val = [(mx.array(x), mx.array(y)) for x, y in
           val_batches(val_tokens, cfg.data_seed, cfg.eval_batches, cfg.batch_size, cfg.block_size)]
    px, py = (mx.array(a) for a in
              probe_batch(val_tokens, cfg.data_seed, cfg.batch_size, cfg.block_size))

    def evaluate() -> float:
        return mx.stack([eval_fn(x, y) for x, y in val]).mean().item()

    metric_rows: list[dict] = []
    probe_rows: list[dict] = []
    val_by_step: dict[int, float] = {}
    display = Display(cfg.run_id, steps, verbose, prefix)
    wall0 = time.perf_counter() - extra["elapsed"]
    train_seconds = extra["train_seconds"]
    init_loss = extra["init_loss"]
    last_val: float | None = None
    status, diverged_step, reason = "completed", None, None

    def measure(step: int) -> None:
        """Evaluation and probes at `step` (params after `step` updates); off the hot step."""
        nonlocal init_loss, last_val
        if step % cfg.eval_every == 0 or step == steps:
            val_by_step[step] = last_val = evaluate()
            if init_loss is None:
                init_loss = val_by_step[step]
        if step % cfg.probe_every == 0 or step == steps:
            probe_rows.extend(probe_lib.measure(model, px, py, step))

    def flush() -> None:
        runlog.write_part(run_dir / "metrics", metric_rows, runlog.METRICS_SCHEMA)
        runlog.write_part(run_dir / "probes", probe_rows, runlog.PROBES_SCHEMA)
        metric_rows.clear()
        probe_rows.clear()

    def checkpoint(step: int) -> None:
        flush()
        save_checkpoint(ckpt_path, model, opt, step, {
            "init_loss": init_loss, "elapsed": time.perf_counter() - wall0,
            "train_seconds": train_seconds})

    def row(step, loss, grad_norm, lr, val_loss):
        return {"step": step, "tokens": step * cfg.tokens_per_step, "lr": lr,
                "train_loss": loss, "grad_norm": grad_norm, "val_loss": val_loss,
                "val_ppl": math.exp(min(val_loss, 700.0)) if val_loss is not None else None,
                "elapsed_s": time.perf_counter() - wall0}

    pending: list[tuple[int, mx.array, mx.array, mx.array]] = []
    batches = train_stream(train_tokens, cfg.data_seed, start, steps, cfg.batch_size,
                           cfg.block_size)
    step = start
    try:
        t_sync = time.perf_counter()
        for step in range(start, steps):
            measure(step)
            probing = step % cfg.probe_every == 0
            before = dict(tree_flatten(model.parameters())) if probing else None
            x, y = next(batches)
            loss, grad_norm, lr = step_fn(mx.array(x), mx.array(y))
            mx.async_eval(state, loss, grad_norm)
            pending.append((step, loss, grad_norm, lr))
            if probing:
                probe_rows.extend(probe_lib.update_stats(step, before,
                                                         dict(tree_flatten(model.parameters()))))
            if (step + 1) % cfg.log_every and step + 1 != steps:
                continue
            # one sync per log interval: read the pending losses, check for divergence
            values = np.array(mx.stack([mx.stack([a, b, c]) for _, a, b, c in pending]))
            train_seconds += time.perf_counter() - t_sync
            for (s, *_), (loss_v, norm_v, lr_v) in zip(pending, values.tolist()):
                metric_rows.append(row(s, loss_v, norm_v, lr_v, val_by_step.pop(s, None)))
                reason = divergence(cfg, s, loss_v, norm_v, init_loss)
                if reason:
                    status, diverged_step = "diverged", s
                    break
            pending.clear()
            done_steps = step + 1 - start
            tok_s = done_steps * cfg.tokens_per_step / max(train_seconds, 1e-9)
            display.update(step + 1, loss_v, tok_s,
                           (steps - step - 1) * cfg.tokens_per_step / max(tok_s, 1e-9), last_val)
            if status == "diverged":
                break
            if (step + 1) % cfg.ckpt_every == 0 and step + 1 != steps:
                checkpoint(step + 1)
            t_sync = time.perf_counter()
    except KeyboardInterrupt:
        # finish the dispatched steps, keep their rows, checkpoint where we are, then stop
        logged = {r["step"] for r in metric_rows}
        for s, loss, grad_norm, lr in pending:
            if s in logged:  # the interrupt came mid-sync, after this row was appended
                continue
            metric_rows.append(row(s, loss.item(), grad_norm.item(), lr.item(),
                                   val_by_step.pop(s, None)))
        checkpoint(pending[-1][0] + 1 if pending else step)
        display.close(f"interrupted; checkpointed at step {pending[-1][0] + 1 if pending else step}")
        raise

    final_step = steps if status == "completed" else diverged_step + 1
    measure(steps) if status == "completed" else None
    if status == "completed":
        metric_rows.append(row(steps, None, None, None, val_by_step.pop(steps)))
    flush()
    mx.save_safetensors(str(run_dir / "final.safetensors"), dict(tree_flatten(model.parameters())))
    ckpt_path.unlink(missing_ok=True)

    metrics = runlog.read_parts(run_dir / "metrics").to_pydict()
    vals = [v for v in metrics["val_loss"] if v is not None]
    finite_vals = [v for v in vals if math.isfinite(v)]
    wall = time.perf_counter() - wall0
    summary = {
        **summary_base(cfg),
        "status": status,
        "init_loss": init_loss,
        "final_val_loss": finite(vals[-1]) if status == "completed" and vals else None,
        "min_val_loss": min(finite_vals) if finite_vals else None,
        "final_train_loss": finite(metrics["train_loss"][-2 if status == "completed" else -1]),
        "diverged_step": diverged_step,
        "diverged_reason": reason,
        "steps": final_step,
        "tokens_seen": final_step * cfg.tokens_per_step,
        "wall_seconds": wall,
        "train_seconds": train_seconds,
        "tokens_per_second": final_step * cfg.tokens_per_step / max(train_seconds, 1e-9),
        "params": count_params(model),
    }
    manifest["ended"] = runlog.now()
    runlog.write_json(run_dir / "manifest.json", manifest)
    runlog.write_json(run_dir / "summary.json", summary)
    display.close(f"{status} at step {final_step}: val {summary['final_val_loss'] or float('nan'):.4f}"
                  if status == "completed" else f"diverged at step {diverged_step} ({reason})")
    return summary


def divergence(cfg: TrainConfig, step: int, loss: float, grad_norm: float,
               init_loss: float | None) -> str | None:
    """Why this step counts as diverged, or None. Checked for every step at each sync."""
    if not math.isfinite(loss):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return "non-finite gradient norm"
    if init_loss is not None and step >= cfg.warmup_steps and loss > init_loss + cfg.divergence_margin:
        return f"loss {loss:.3f} above initial loss {init_loss:.3f} + {cfg.divergence_margin:g}"
    return None


def cli(argv: list[str]) -> int:
    cfg = parse_train_config(argv)
    try:
        summary = train(cfg)
    except RunBusy as e:
        raise UsageError(str(e)) from None
    print(f"run folder: {run_dir_of(cfg)}  status: {summary['status']}")
    return 0
