"""Train one run: compiled AdamW step, divergence detection, Parquet logs, exact resume.

`python -m mlx_gpt train key=value ...`. Running the same config again resumes from its
checkpoint; a finished run (summary.json says completed or diverged) is not re-run.
"""

from __future__ import annotations

import math
import sys
import time
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
from .model import GPT, ModelArgs, count_params, init_weights
from .optim import AdamW
from .recorder import Recorder, divergence  # noqa: F401  (divergence: part of this module's API)


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    return ModelArgs(vocab_size=vocab_size, depth=cfg.depth, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, block_size=cfg.block_size, bias=cfg.bias,
                     qk_norm=cfg.qk_norm, kernels=cfg.kernels)


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
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: m.loss(x, y))
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

def train(cfg: TrainConfig, *, verbose: bool = True, prefix: str = "") -> dict:
    """Run (or resume, or skip if finished) one config. Returns its summary."""
    cfg.validate()
    train_tokens, val_tokens, meta = load_data(cfg)  # all checks before anything is written
    run_dir = run_dir_of(cfg)
    done = runlog.finished(run_dir)
    if done:
        if verbose:
            print(f"{prefix}{cfg.run_id} already {done['status']}; skipping", flush=True)
        return done
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock(run_dir) as acquired:
        if not acquired:
            raise RunBusy(f"{run_dir} is being trained by another process")
        done = runlog.finished(run_dir)  # finished while we took the lock
        if done:
            return done
        try:
            return _train_locked(cfg, run_dir, train_tokens, val_tokens, meta, verbose, prefix)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as e:
            runlog.record_failure(run_dir, summary_base(cfg), e)
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
    start, clocks = 0, {}
    if ckpt_path.exists():
        start, clocks = load_checkpoint(ckpt_path, model, opt)
        manifest["resumed_from_step"] = start
    for folder in ("metrics", "probes"):
        runlog.drop_parts_from(run_dir / folder, start)
    runlog.write_json(run_dir / "manifest.json", manifest)
    rec = Recorder(cfg, run_dir, **clocks)

    step_fn, state = make_train_step(model, opt)

    @partial(mx.compile, inputs=model.state)
    def eval_fn(x, y):
        return model.loss(x, y)

    val = [(mx.array(x), mx.array(y)) for x, y in
           val_batches(val_tokens, cfg.data_seed, cfg.eval_batches, cfg.batch_size, cfg.block_size)]
    px, py = (mx.array(a) for a in
              probe_batch(val_tokens, cfg.data_seed, cfg.batch_size, cfg.block_size))

    def measure(step: int) -> None:
        """Evaluation and probes at `step` (params after `step` updates); off the hot step."""
        if rec.eval_due(step):
            rec.record_val(step, mx.stack([eval_fn(x, y) for x, y in val]).mean().item())
        if rec.probe_due(step):
            rec.record_probes(probe_lib.measure(model, px, py, step))

    def checkpoint(step: int) -> None:
        rec.flush()
        save_checkpoint(ckpt_path, model, opt, step, rec.state())

    def read(pending) -> list[tuple[int, float, float, float]]:
        """One device sync for a whole log interval of (loss, grad norm, lr)."""
        values = np.array(mx.stack([mx.stack([a, b, c]) for _, a, b, c in pending]))
        return [(s, *v) for (s, *_), v in zip(pending, values.tolist())]

    display = Display(cfg.run_id, steps, verbose, prefix)
    pending: list[tuple[int, mx.array, mx.array, mx.array]] = []
    batches = train_stream(train_tokens, cfg.data_seed, start, steps, cfg.batch_size,
                           cfg.block_size)
    applied = start
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
            applied = step + 1  # updates in the model state: where a checkpoint resumes
            if probing:
                rec.record_probes(probe_lib.update_stats(step, before,
                                                         dict(tree_flatten(model.parameters()))))
            if (step + 1) % cfg.log_every and step + 1 != steps:
                continue
            values = read(pending)
            rec.train_seconds += time.perf_counter() - t_sync
            diverged = rec.record_steps(values)
            pending.clear()
            tok_s = (step + 1 - start) * cfg.tokens_per_step / max(rec.train_seconds, 1e-9)
            display.update(step + 1, values[-1][1], tok_s,
                           (steps - step - 1) * cfg.tokens_per_step / max(tok_s, 1e-9),
                           rec.last_val)
            if diverged:
                break
            if (step + 1) % cfg.ckpt_every == 0 and step + 1 != steps:
                checkpoint(step + 1)
            t_sync = time.perf_counter()
    except KeyboardInterrupt:
        # keep the dispatched steps' rows; checkpoint where we are (or finish, if they diverged)
        if pending:
            rec.record_steps(read(pending))
        if rec.status == "diverged":
            summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path)
            display.close(rec.closing_line(summary))
        else:
            checkpoint(applied)
            display.close(f"interrupted; checkpointed at step {applied}")
        raise

    if rec.status == "completed":
        measure(steps)
    summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path)
    display.close(rec.closing_line(summary))
    return summary


def _finish(cfg, run_dir, rec: Recorder, model: GPT, manifest: dict, ckpt_path: Path) -> dict:
    mx.save_safetensors(str(run_dir / "final.safetensors"), dict(tree_flatten(model.parameters())))
    summary = rec.finish(summary_base(cfg), manifest, count_params(model))
    ckpt_path.unlink(missing_ok=True)
    return summary


def cli(argv: list[str]) -> int:
    cfg = parse_train_config(argv)
    try:
        summary = train(cfg)
    except RunBusy as e:
        raise UsageError(str(e)) from None
    print(f"run folder: {run_dir_of(cfg)}  status: {summary['status']}")
    return 0
