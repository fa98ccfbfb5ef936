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

from . import interrupts, runlog
from . import probes as probe_lib
from .batches import probe_batch, train_stream, val_batches
from .cli import keys_usage
from .config import TrainConfig, parse_train_config
from .errors import UsageError
from .locks import RunBusy, run_lock
from .model import GPT, ModelArgs, count_params, init_weights
from .optim import AdamW
from .recorder import Recorder, divergence  # noqa: F401  (divergence: part of this module's API)


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    return ModelArgs(vocab_size=vocab_size, depth=cfg.depth, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, block_size=cfg.block_size, bias=cfg.bias,
                     qk_norm=cfg.qk_norm, attn_softcap=cfg.attn_softcap, z_loss=cfg.z_loss,
                     kernels=cfg.kernels)


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
    """The compiled update: (x, y) -> (loss, pre-clip grad norm, lr, z-loss term), mutating
    model and opt. The gradient is that of GPT.objective (cross-entropy plus the z-loss term
    when z_loss > 0); `loss` is the cross-entropy alone, so every arm logs the same quantity.

    Returns it with the state list to pass to mx.eval / mx.async_eval after each call."""
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: m.objective(x, y))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array):
        (_, loss, z), grads = loss_and_grad(model, x, y)
        grad_norm, lr = opt.update(model, grads)
        return loss, grad_norm, lr, z

    return step_fn, state


# --- checkpoints -----------------------------------------------------------------------------
# A checkpoint holds weights, AdamW state and the step. The step is also the whole data and RNG
# cursor: batch k is a pure function of (data_seed, k) and the step draws no random numbers
# (no dropout), so nothing else is needed for a bit-identical resume.

def save_checkpoint(path: Path, model: GPT, opt: AdamW, extra: dict) -> int:
    """Write weights, AdamW state and `extra` with a checksum; the previous checkpoint stays
    until this one is written and verified. The step is the optimizer's own count of updates
    applied (the only source of the step). Returns it."""
    arrays = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    arrays.update({f"opt.m.{k}": v for k, v in opt.state["m"].items()})
    arrays.update({f"opt.v.{k}": v for k, v in opt.state["v"].items()})
    arrays["opt.step"] = opt.state["step"]
    host = {k: np.array(v) for k, v in arrays.items()}
    step = int(host["opt.step"])
    runlog.save_tensors(path, host, {"step": str(step), **{k: repr(v) for k, v in extra.items()}})
    return step


def read_checkpoint(path: Path, model: GPT) -> tuple[int, dict[str, np.ndarray], dict]:
    """(step, arrays, extra) of a checkpoint, verified against its checksum and the model's
    parameter names and shapes; runlog.DamagedFile if it fails."""
    import ast

    arrays, metadata = runlog.read_tensors(path)
    want = {f"{group}{k}": v.shape for k, v in tree_flatten(model.parameters())
            for group in ("model.", "opt.m.", "opt.v.")}
    got = {k: v.shape for k, v in arrays.items() if k != "opt.step"}
    step = int(arrays["opt.step"]) if arrays.get("opt.step", np.zeros(2)).size == 1 else None
    if got != want or step is None or metadata.get("step") != str(step):
        raise runlog.DamagedFile(f"{path.name} does not match this run's model and step")
    try:
        extra = {k: ast.literal_eval(v) for k, v in metadata.items() if k not in ("step", "sha256")}
    except (ValueError, SyntaxError):
        raise runlog.DamagedFile(f"{path.name} has unreadable metadata") from None
    return step, arrays, extra


def apply_checkpoint(arrays: dict[str, np.ndarray], model: GPT, opt: AdamW) -> None:
    model.update(tree_unflatten([(k[6:], mx.array(v)) for k, v in arrays.items()
                                 if k.startswith("model.")]))
    for key in ("m", "v"):
        prefix = f"opt.{key}."
        opt.state[key].update({k[len(prefix):]: mx.array(v) for k, v in arrays.items()
                               if k.startswith(prefix)})
    opt.state["step"] = mx.array(arrays["opt.step"])


def load_checkpoint(path: Path, model: GPT, opt: AdamW) -> tuple[int, dict]:
    step, arrays, extra = read_checkpoint(path, model)
    apply_checkpoint(arrays, model, opt)
    return step, extra


def resume_point(cfg: TrainConfig, run_dir: Path, model: GPT, opt: AdamW,
                 warn) -> tuple[int, dict]:
    """(step, recorder clocks) to start from: the checkpoint's, if it verifies and the rows on
    disk agree with it; else step 0 (the checkpoint is removed so it is never tried again)."""
    path = run_dir / "checkpoint.safetensors"
    if path.exists():
        try:
            step, arrays, extra = read_checkpoint(path, model)
            drop_parts_from(run_dir, step)
            why = runlog.resume_problem(run_dir, step, cfg.probe_every)
        except runlog.DamagedFile as e:
            why = str(e)
        if why is None:
            apply_checkpoint(arrays, model, opt)
            return step, extra
        warn(f"warning: {run_dir.name}: {why}; restarting the run from step 0")
        path.unlink()
    drop_parts_from(run_dir, 0)
    return 0, {}


def drop_parts_from(run_dir: Path, step: int) -> None:
    for folder in ("metrics", "probes"):
        runlog.drop_parts_from(run_dir / folder, step)


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
    done = finished_run(run_dir)
    if done:
        if verbose:
            print(f"{prefix}{cfg.run_id} already {done['status']}; skipping", flush=True)
        return done
    make_folder(run_dir, "run folder")
    with run_lock(run_dir) as acquired:
        if not acquired:
            raise RunBusy(f"{run_dir} is being trained by another process")
        done = finished_run(run_dir)  # finished while we took the lock
        if done:
            return done
        # Ctrl-C and SIGTERM wait for the step in flight and its bookkeeping (interrupts.py)
        with interrupts.Deferred() as guard:
            try:
                crashes = runlog.clean_leftovers(run_dir)
                if crashes:
                    error = RunCrashed("an earlier attempt died by a fatal signal: "
                                       + crashes[-1].splitlines()[0])
                    runlog.record_failure(run_dir, summary_base(cfg), error, crashes[-1],
                                          fatal_signal=True)
                    raise error
                with runlog.fatal_signal_log(run_dir):
                    return _train_locked(cfg, run_dir, train_tokens, val_tokens, meta, verbose,
                                         prefix, guard)
            except (KeyboardInterrupt, UsageError, RunCrashed):
                raise
            except Exception as e:
                if guard.signum is not None:  # e.g. Ctrl-C also killed MLX's kernel compiler:
                    raise interrupts.Interrupted(guard.signum) from e  # the last checkpoint stays
                if runlog.disk_full(e):  # the last checkpoint stays: the run can resume
                    raise UsageError(f"disk full while writing {run_dir}; free some space and run "
                                     "the same command again to resume the run") from None
                runlog.record_failure(run_dir, summary_base(cfg), e)
                raise


class RunCrashed(RuntimeError):
    """The run's previous process died by a fatal signal (its traceback is in traceback.txt)."""


def make_folder(path: Path, what: str) -> None:
    """mkdir -p, or a one-line error saying why the folder cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {what} {path}: {e.strerror or e}") from None


def finished_run(run_dir: Path) -> dict | None:
    """The summary of a finished run whose files are intact, None if it is not finished, or
    runlog.DamagedRun naming the damage and the repair."""
    done = runlog.finished(run_dir)
    why = done and runlog.finished_problem(run_dir, done)
    if why:
        raise runlog.DamagedRun(f"run {run_dir} is {done['status']} but damaged: {why}; to "
                                f"retrain it: rm -r {run_dir} and run the same command again")
    return done


def summary_base(cfg: TrainConfig) -> dict:
    return {"run_id": cfg.run_id, "framework": "mlx", "lr": cfg.lr, "depth": cfg.depth,
            "qk_norm": cfg.qk_norm, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "d_model": cfg.d_model, "sweep": cfg.sweep, "config": cfg.identity()}


def _train_locked(cfg, run_dir, train_tokens, val_tokens, meta, verbose, prefix,
                  guard: interrupts.Deferred | None = None) -> dict:
    steps = cfg.steps
    runlog.write_json(run_dir / "config.json", {**cfg.identity(), "run_id": cfg.run_id,
                                                "framework": "mlx"})
    manifest = runlog.manifest(cfg.data, "mlx", f"{mx.default_device()}")
    model = build_model(cfg, meta["vocab_size"])
    opt = AdamW(cfg, model.parameters())

    ckpt_path = run_dir / "checkpoint.safetensors"
    start, clocks = resume_point(cfg, run_dir, model, opt,
                                 lambda line: print(prefix + line, file=sys.stderr, flush=True))
    if start:
        manifest["resumed_from_step"] = start
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

    def checkpoint() -> int:
        rec.flush()
        return save_checkpoint(ckpt_path, model, opt, rec.state())

    def read(pending) -> list[tuple[int, float, float, float, float | None]]:
        """One device sync for a whole log interval of (loss, grad norm, lr, z-loss term)."""
        values = np.array(mx.stack([mx.stack(list(v)) for _, *v in pending]))
        return [(s, a, b, c, z if cfg.z_loss else None)
                for (s, *_), (a, b, c, z) in zip(pending, values.tolist())]

    display = Display(cfg.run_id, steps, verbose, prefix)
    pending: list[tuple[int, mx.array, mx.array, mx.array, mx.array]] = []
    batches = train_stream(train_tokens, cfg.data_seed, start, steps, cfg.batch_size,
                           cfg.block_size)
    try:
        t_sync = time.perf_counter()
        for step in range(start, steps):
            if guard is not None:  # the one place a signal stops the run: between steps
                guard.check()
            measure(step)
            probing = step % cfg.probe_every == 0
            before = dict(tree_flatten(model.parameters())) if probing else None
            x, y = next(batches)
            loss, grad_norm, lr, z = step_fn(mx.array(x), mx.array(y))
            mx.async_eval(state, loss, grad_norm)
            pending.append((step, loss, grad_norm, lr, z))
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
            if diverged:  # probe the weights as they are when the run is declared diverged
                rec.record_probes(probe_lib.measure(model, px, py, step + 1))
                break
            if (step + 1) % cfg.ckpt_every == 0 and step + 1 != steps:
                checkpoint()
            t_sync = time.perf_counter()
    except KeyboardInterrupt:
        # keep the dispatched steps' rows; checkpoint where we are (or finish, if they diverged)
        if pending:
            rec.record_steps(read(pending))
        if rec.status == "diverged":
            summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path)
            display.close(rec.closing_line(summary))
        else:
            display.close(f"interrupted; checkpointed at step {checkpoint()}")
        raise

    if rec.status == "completed":
        measure(steps)
    summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path)
    display.close(rec.closing_line(summary))
    return summary


def _finish(cfg, run_dir, rec: Recorder, model: GPT, manifest: dict, ckpt_path: Path) -> dict:
    weights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    digest = runlog.save_tensors(run_dir / "final.safetensors", weights, {"run_id": cfg.run_id})
    summary = rec.finish({**summary_base(cfg), "final_weights_sha256": digest}, manifest,
                         count_params(model))
    ckpt_path.unlink(missing_ok=True)
    return summary


USAGE = keys_usage(
    "python -m mlx_gpt train [key=value ...]",
    "Trains one run into <runs_dir>/<sweep>/<run_id>/ (run_id: a hash of the config). The same\n"
    "command again resumes an interrupted run from its checkpoint and skips a finished one.",
    TrainConfig)


def cli(argv: list[str]) -> int:
    cfg = parse_train_config(argv)
    try:
        summary = train(cfg)
    except RunBusy as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt as e:
        print(f"interrupted; run the same command again to resume {run_dir_of(cfg)}",
              file=sys.stderr, flush=True)
        return interrupts.exit_code(e)
    print(f"run folder: {run_dir_of(cfg)}  status: {summary['status']}")
    return 0
