"""Train one run: compiled AdamW step, divergence detection, Parquet logs, exact resume.

`python -m mlx_gpt train key=value ...`. Running the same config again resumes from its
checkpoint; a finished run (summary.json says completed or diverged) is not re-run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from . import interrupts, memory, runlog
from . import probes as probe_lib
from .batches import probe_batch, train_stream, val_batches
from .cli import keys_usage
from .config import TrainConfig, model_args, parse_train_config
from .display import Display, format_seconds  # noqa: F401  (format_seconds: the sweep's)
from .errors import UsageError
from .locks import RunBusy, run_lock
from .model import GPT, count_params, init_weights
from .optim import make_optimizer, step_count, update
from .recorder import Recorder, divergence  # noqa: F401  (divergence: part of this module's API)


def build_model(cfg: TrainConfig, vocab_size: int) -> GPT:
    model = GPT(model_args(cfg, vocab_size))
    init_weights(model, cfg.seed)
    mx.eval(model.parameters())
    return model


def run_dir_of(cfg: TrainConfig) -> Path:
    return Path(cfg.runs_dir) / cfg.sweep / cfg.run_id


def load_data(cfg: TrainConfig):
    """(train tokens, val tokens, meta) after every check that needs the data, the memory
    estimate included, so train and the sweep refuse before anything is written."""
    from .data import load_tokens

    train_tokens, val_tokens, meta = load_tokens(cfg.data)
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < cfg.block_size + 2:
            raise UsageError(f"block_size={cfg.block_size} is above the {split} data of {cfg.data} "
                             f"({len(tokens)} tokens)")
    # an allocation MLX cannot satisfy kills the process by SIGSEGV: refuse such a config here
    memory.check(cfg, meta["vocab_size"])
    return train_tokens, val_tokens, meta


def make_train_step(model: GPT, opt: optim.MultiOptimizer, grad_clip: float):
    """The compiled update: (x, y) -> (loss, pre-clip grad norm, lr, z-loss term), mutating
    model and opt (optim.make_optimizer's). The gradient is that of GPT.objective (cross-entropy
    plus the z-loss term when z_loss > 0); `loss` is the cross-entropy alone, so every arm logs
    the same quantity.

    Returns it with the state list to pass to mx.eval / mx.async_eval after each call."""
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: m.objective(x, y))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array):
        (_, loss, z), grads = loss_and_grad(model, x, y)
        grad_norm, lr = update(opt, model, grads, grad_clip)
        return loss, grad_norm, lr, z

    return step_fn, state


# --- checkpoints -----------------------------------------------------------------------------
# A checkpoint holds the weights ("model.<name>") and the optimizer's whole state ("opt.<key>"
# of tree_flatten(opt.state): moments, learning rate and step). The optimizer's step is also the
# whole data and RNG cursor: batch k is a pure function of (data_seed, k) and the step draws no
# random numbers (no dropout), so nothing else is needed for a bit-identical resume.

def checkpoint_arrays(model: GPT, opt: optim.MultiOptimizer) -> dict[str, mx.array]:
    arrays = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    arrays.update({f"opt.{k}": v for k, v in tree_flatten(opt.state)})
    return arrays


def save_checkpoint(path: Path, model: GPT, opt: optim.MultiOptimizer, extra: dict) -> int:
    """Write weights, optimizer state and `extra` with a checksum; the previous checkpoint stays
    until this one is written and verified. The step is the optimizer's own count of updates
    applied (the only source of the step). Returns it."""
    host = {k: np.array(v) for k, v in checkpoint_arrays(model, opt).items()}
    step = int(step_count(opt.state))
    runlog.save_tensors(path, host, {"step": str(step), **{k: repr(v) for k, v in extra.items()}})
    return step


def checkpoint_step(arrays: dict[str, np.ndarray]) -> int | None:
    """The updates applied, from a checkpoint's arrays; None unless every optimizer group holds
    one and the same count."""
    steps = [v for k, v in arrays.items() if k.startswith("opt.") and k.endswith(".step")]
    if not steps or any(s.shape != () for s in steps) or len({int(s) for s in steps}) != 1:
        return None
    return int(steps[0])


def read_checkpoint(path: Path, model: GPT, opt: optim.MultiOptimizer
                    ) -> tuple[int, dict[str, np.ndarray], dict]:
    """(step, arrays, extra) of a checkpoint, verified against its checksum and the names,
    shapes and dtypes of this model's parameters and optimizer state; runlog.DamagedFile if it
    fails."""
    import ast

    arrays, metadata = runlog.read_tensors(path)
    want = {k: (tuple(v.shape), np.dtype(str(v.dtype).split(".")[-1]))
            for k, v in checkpoint_arrays(model, opt).items()}
    got = {k: (v.shape, v.dtype) for k, v in arrays.items()}
    step = checkpoint_step(arrays)
    if got != want or step is None or metadata.get("step") != str(step):
        raise runlog.DamagedFile(f"{path.name} does not match this run's model and step")
    try:
        extra = {k: ast.literal_eval(v) for k, v in metadata.items() if k not in ("step", "sha256")}
    except (ValueError, SyntaxError):
        raise runlog.DamagedFile(f"{path.name} has unreadable metadata") from None
    return step, arrays, extra


def apply_checkpoint(arrays: dict[str, np.ndarray], model: GPT, opt: optim.MultiOptimizer) -> None:
    """Load the weights and the optimizer state. Before make_train_step: the compiled step
    holds the optimizer's state dicts."""
    model.update(tree_unflatten([(k[6:], mx.array(v)) for k, v in arrays.items()
                                 if k.startswith("model.")]))
    opt.state = tree_unflatten([(k[4:], mx.array(v)) for k, v in arrays.items()
                                if k.startswith("opt.")])
    opt.init(model.parameters())  # marks it initialised; every entry is already there


def load_checkpoint(path: Path, model: GPT, opt: optim.MultiOptimizer) -> tuple[int, dict]:
    step, arrays, extra = read_checkpoint(path, model, opt)
    apply_checkpoint(arrays, model, opt)
    return step, extra


def resume_point(cfg: TrainConfig, run_dir: Path, model: GPT, opt: optim.MultiOptimizer,
                 warn) -> tuple[int, dict]:
    """(step, recorder clocks) to start from: the checkpoint's, if it verifies and the rows on
    disk agree with it; else step 0 (the checkpoint is removed so it is never tried again)."""
    path = run_dir / "checkpoint.safetensors"
    if path.exists():
        try:
            step, arrays, extra = read_checkpoint(path, model, opt)
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


# --- the run ---------------------------------------------------------------------------------

Repair = Callable[[Path, str], None]  # told (where the damaged folder went, what was damaged)


def train(cfg: TrainConfig, *, verbose: bool = True, prefix: str = "",
          repair: Repair | None = None) -> dict:
    """Run (or resume, or skip if finished) one config. Returns its summary. A finished run
    whose files are damaged raises runlog.DamagedRun, or with `repair` is moved aside (nothing
    deleted, set_aside_damaged), `repair` is told where, and the run is trained again."""
    cfg.validate()
    train_tokens, val_tokens, meta = load_data(cfg)  # all checks before anything is written
    run_dir = run_dir_of(cfg)
    try:
        done = finished_run(run_dir)
    except runlog.DamagedRun:
        if repair is None:
            raise
        moved = set_aside_damaged(run_dir)
        if moved:
            repair(*moved)
        done = finished_run(run_dir)  # None, unless another process retrained it meanwhile
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
                                "retrain it, keeping the damaged files aside: the same command "
                                "with repair=true (a sweep repairs it by itself)")
    return done


def set_aside_damaged(run_dir: Path) -> tuple[Path, str] | None:
    """(where it went, what was damaged) after moving a finished run with damaged files to
    <sweep>/.damaged/ (runlog.set_aside) under the run's lock, so it can be trained again; None
    if it is not damaged (another process may have repaired it first); RunBusy if another
    process holds it."""
    try:
        with run_lock(run_dir) as acquired:
            if not acquired:
                raise RunBusy(f"{run_dir} is being trained or repaired by another process")
            try:
                finished_run(run_dir)  # checked again under the lock
                return None
            except runlog.DamagedRun as e:
                damage = str(e).split("; ")[0]  # what is damaged; the rest is the advice
                return runlog.set_aside(run_dir, damage), damage
    except FileNotFoundError:  # moved aside by another process before we took the lock
        return None


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
    opt = make_optimizer(cfg, model.parameters())

    ckpt_path = run_dir / "checkpoint.safetensors"
    start, clocks = resume_point(cfg, run_dir, model, opt,
                                 lambda line: print(prefix + line, file=sys.stderr, flush=True))
    if start:
        manifest["resumed_from_step"] = start
    runlog.write_json(run_dir / "manifest.json", manifest)
    rec = Recorder(cfg, run_dir, **clocks)

    step_fn, state = make_train_step(model, opt, cfg.grad_clip)

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

    display = Display(cfg.run_id, steps, cfg.tokens_per_step, start, verbose, prefix)
    display.begin((f"resuming from step {start} of {steps}; " if start else "")
                  + "compiling the train step (a first run on this machine also builds MLX's "
                    "kernels: up to a minute)", always=bool(start))
    pending: list[tuple[int, mx.array, mx.array, mx.array, mx.array]] = []
    batches = train_stream(train_tokens, cfg.data_seed, start, steps, cfg.batch_size,
                           cfg.block_size)
    try:
        t_sync = time.perf_counter()
        for step in range(start, steps):
            if guard is not None:  # the one place a signal stops the run: between steps
                guard.check()
            measure(step)
            probing = rec.update_probe_due(step)
            before = dict(tree_flatten(model.parameters())) if probing else None
            x, y = next(batches)
            loss, grad_norm, lr, z = step_fn(mx.array(x), mx.array(y))
            mx.async_eval(state, loss, grad_norm)
            pending.append((step, loss, grad_norm, lr, z))
            if probing:
                rec.record_probes(probe_lib.update_stats(step, before,
                                                         dict(tree_flatten(model.parameters()))))
            if not rec.sync_due(step):
                continue
            diverged = rec.sync(read(pending), t_sync, display)
            pending.clear()
            if diverged:  # probe the weights as they are when the run is declared diverged
                rec.record_probes(probe_lib.measure(model, px, py, step + 1))
                break
            if rec.checkpoint_due(step):
                checkpoint()
            t_sync = time.perf_counter()
    except KeyboardInterrupt:
        # keep the dispatched steps' rows; checkpoint where we are (or finish, if they diverged)
        if pending:
            rec.record_steps(read(pending))
        if rec.status == "diverged":
            summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path, meta)
            display.close(rec.closing_line(summary))
        else:
            display.close(f"interrupted; checkpointed at step {checkpoint()} of {steps}: the "
                          "same command resumes it")
        raise

    if rec.status == "completed":
        measure(steps)
    summary = _finish(cfg, run_dir, rec, model, manifest, ckpt_path, meta)
    display.close(rec.closing_line(summary))
    return summary


def _finish(cfg, run_dir, rec: Recorder, model: GPT, manifest: dict, ckpt_path: Path,
            meta: dict) -> dict:
    weights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    digest = runlog.save_tensors(run_dir / "final.safetensors", weights, {"run_id": cfg.run_id})
    summary = rec.finish({**summary_base(cfg), "final_weights_sha256": digest,
                          "unigram_entropy": meta["unigram_entropy"]}, manifest,
                         count_params(model))
    ckpt_path.unlink(missing_ok=True)
    # an earlier attempt's failure record: this summary has replaced its "failed"
    (run_dir / "traceback.txt").unlink(missing_ok=True)
    return summary


USAGE = keys_usage(
    "python -m mlx_gpt train [key=value ...]",
    "Trains one run into <runs_dir>/<sweep>/<run_id>/ (run_id: a hash of the config). The same\n"
    "command again resumes an interrupted run from its checkpoint and skips a finished one.\n"
    "repair=true (not part of the run): a finished run whose files are damaged is moved to\n"
    "<runs_dir>/<sweep>/.damaged/<run_id>-<UTC time>/, nothing deleted, and trained again.",
    TrainConfig)


def pop_repair(argv: list[str]) -> tuple[list[str], bool]:
    """(the other words, repair=true|false): a flag of the command, not a TrainConfig field,
    so it never changes the run id."""
    words = [w for w in argv if w.partition("=")[0].strip().replace("-", "_") != "repair"]
    values = [w.partition("=")[2].strip().lower() for w in argv if w not in words]
    if len(values) > 1:
        raise UsageError("repair is given twice")
    if values and values[0] not in ("true", "false"):
        raise UsageError(f"repair must be true or false, got {values[0]!r}")
    return words, values == ["true"]


def cli(argv: list[str]) -> int:
    argv, repair = pop_repair(argv)
    cfg = parse_train_config(argv)

    def repaired(moved_to: Path, why: str) -> None:
        print(f"repair: {why}; its files are kept in {moved_to}; training it again",
              flush=True)

    try:
        summary = train(cfg, repair=repaired if repair else None)
    except RunBusy as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt as e:  # the run's line says where it stopped and how to resume
        return interrupts.exit_code(e)
    print(f"run folder: {run_dir_of(cfg)}  status: {summary['status']}")
    return 0
