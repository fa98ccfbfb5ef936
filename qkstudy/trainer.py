"""`python -m qkstudy train`: one run with either backend's Engine, the rest shared."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import backends, files, forensics, interrupts, memory, provenance, run_folder
from .backends import Engine
from .batches import probe_batch, train_stream, val_batches
from .cli import keys_usage
from .config import TrainConfig, apply_overrides, split_key_values, take
from .data.load import DataChanged, data_identity, load_tokens
from .errors import UsageError
from .locks import RunBusy
from .progress import Display
from .recorder import Recorder
from .run_folder import RunFolder

def load_data(cfg: TrainConfig):
    """(train tokens, val tokens, meta) after every check that needs the data, memory included."""
    train_tokens, val_tokens, meta = load_tokens(cfg.data)
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < cfg.block_size + 2:
            raise UsageError(f"block_size={cfg.block_size} is above the {split} data of {cfg.data} "
                             f"({len(tokens)} tokens)")
    memory.check(cfg, meta["vocab_size"], limit=backends.device_memory(cfg))
    return train_tokens, val_tokens, meta


def data_check(cfg: TrainConfig, meta: dict | None = None) -> tuple[dict | None, str | None]:
    """(cfg.data's identity now, why cfg's run was trained on other data or None)."""
    if meta is None:
        try:
            meta = load_tokens(cfg.data)[2]
        except UsageError:
            return None, None
    now = data_identity(meta)
    return now, RunFolder.of(cfg).data_problem(now, cfg.data)


Repair = Callable[[Path, str], None]  # told (where the damaged folder went, what was damaged)


def train(cfg: TrainConfig, *, verbose: bool = True, prefix: str = "",
          repair: Repair | None = None, started: Callable[[], None] | None = None) -> dict:
    """Run, resume or skip one config (`repair` retrains a damaged one); its summary."""
    cfg.validate()
    backends.load(cfg.backend).preflight(cfg)
    train_tokens, val_tokens, meta = load_data(cfg)
    folder = RunFolder.of(cfg)
    changed = data_check(cfg, meta)[1]
    if changed:
        raise DataChanged(changed)
    try:
        done = folder.intact_summary()
    except run_folder.DamagedRun:
        if repair is None:
            raise
        moved = set_aside_damaged(folder)
        if moved:
            repair(*moved)
        done = folder.intact_summary()  # None, unless another process retrained it meanwhile
    if done:
        folder.tidy()  # what a process killed in the run's last writes left
        if started:
            started()
        if verbose:
            print(f"{prefix}{cfg.run_id} already {done['status']}; skipping", flush=True)
        return done
    files.make_folder(folder.path, "run folder")
    with folder.lock() as acquired:
        if not acquired:
            raise RunBusy(f"{folder} is being trained by another process")
        if started:
            started()
        return folder.intact_summary() or _train_guarded(
            cfg, folder, (train_tokens, val_tokens, meta), verbose, prefix)


class RunCrashed(RuntimeError):
    """The run's previous process died by a fatal signal."""


def _train_guarded(cfg: TrainConfig, folder: RunFolder, data: tuple, verbose: bool,
                   prefix: str) -> dict:
    """_train_locked with signals deferred; a failure is recorded, a storage failure resumable."""
    with interrupts.Deferred() as guard:
        try:
            crashes = forensics.clean_leftovers(
                [folder.path, folder.metrics_dir, folder.probes_dir])
            if crashes:
                error = RunCrashed("an earlier attempt died by a fatal signal: "
                                   + crashes[-1].splitlines()[0])
                folder.record_failure(summary_base(cfg), error, crashes[-1], fatal_signal=True)
                raise error
            with forensics.fatal_signal_log(folder.path):
                return _train_locked(cfg, folder, *data, verbose, prefix, guard)
        except (KeyboardInterrupt, UsageError, RunCrashed):
            raise
        except Exception as e:
            if guard.signum is not None:  # e.g. Ctrl-C also killed a kernel compiler:
                raise interrupts.Interrupted(guard.signum) from e  # the last checkpoint stays
            if files.io_failure(e):  # the last checkpoint stays: the run can resume
                where = e.filename or folder.path
                raise files.cannot_write(e, where, " to resume the run") from None
            folder.record_failure(summary_base(cfg), e)
            raise


def set_aside_damaged(folder: RunFolder) -> tuple[Path, str] | None:
    """Move a damaged run aside under its lock: (where it went, the damage), or None."""
    try:
        with folder.lock() as acquired:
            if not acquired:
                raise RunBusy(f"{folder} is being trained or repaired by another process")
            try:
                folder.intact_summary()  # checked again under the lock
                return None
            except run_folder.DamagedRun as e:
                damage = str(e).split("; ")[0]  # what is damaged; the rest is the advice
                return folder.set_aside(damage), damage
    except FileNotFoundError:  # moved aside by another process before we took the lock
        return None


def summary_base(cfg: TrainConfig) -> dict:
    return {"run_id": cfg.run_id, "framework": cfg.backend, "lr": cfg.lr, "depth": cfg.depth,
            "qk_norm": cfg.qk_norm, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "d_model": cfg.d_model, "sweep": cfg.sweep, "config": cfg.identity()}


def resume_point(cfg: TrainConfig, folder: RunFolder, engine: Engine, warn) -> tuple[int, dict]:
    """(step, recorder clocks) of a checkpoint that verifies and agrees with the rows."""
    path = folder.checkpoint_file
    if path.exists():
        try:
            step, arrays, extra = folder.read_checkpoint(engine.state_spec())
            folder.drop_rows_from(step)
            why = folder.resume_problem(step, cfg.probe_every)
        except files.DamagedFile as e:
            why = str(e)
        if why is None:
            engine.load_state(arrays)
            return step, extra
        warn(f"warning: {folder.name}: {why}; restarting the run from step 0")
        path.unlink()
    folder.drop_rows_from(0)
    return 0, {}


def _start(cfg: TrainConfig, folder: RunFolder, val_tokens, meta: dict,
           prefix: str) -> tuple[Engine, dict, int, Recorder]:
    """Write config and manifest, build and resume the engine: (engine, manifest, start, rec)."""
    folder.write_config({**cfg.identity(), "run_id": cfg.run_id, "framework": cfg.backend})
    val = val_batches(val_tokens, cfg.data_seed, cfg.eval_batches, cfg.batch_size, cfg.block_size)
    probe = probe_batch(val_tokens, cfg.data_seed, cfg.batch_size, cfg.block_size)
    engine = backends.load(cfg.backend).Engine(cfg, meta["vocab_size"], val, probe)
    manifest = provenance.manifest(cfg.data, engine.framework, engine.device, engine.manifest_extra)
    manifest["data"] = data_identity(meta)  # checked when the run is resumed or skipped
    manifest["pid"] = os.getpid()
    start, clocks = resume_point(cfg, folder, engine,
                                 lambda line: print(prefix + line, file=sys.stderr, flush=True))
    if start:
        manifest["resumed_from_step"] = start
    folder.write_manifest(manifest)
    return engine, manifest, start, Recorder(cfg, folder, **clocks)


def _train_locked(cfg: TrainConfig, folder: RunFolder, train_tokens, val_tokens, meta: dict,
                  verbose: bool, prefix: str, guard: interrupts.Deferred) -> dict:
    engine, manifest, start, rec = _start(cfg, folder, val_tokens, meta, prefix)
    display = Display(cfg.run_id, cfg.steps, cfg.tokens_per_step, verbose, prefix)
    display.begin((f"resuming from step {start} of {cfg.steps}; " if start else "")
                  + engine.warmup_note, always=bool(start))
    batches = train_stream(train_tokens, cfg.data_seed, start, cfg.steps, cfg.batch_size,
                           cfg.block_size)
    pending: list[tuple[int, Any]] = []  # (step, the engine's handle on its values), unread
    try:
        t_sync = time.perf_counter()
        for step in range(start, cfg.steps):
            guard.check()  # the one place a signal stops the run: between steps
            t_measure = time.perf_counter()
            _measure(cfg, rec, engine, step)
            probing = step % cfg.probe_every == 0
            before = engine.snapshot() if probing else None
            spent = time.perf_counter() - t_measure
            pending.append((step, engine.step(*next(batches))))
            if probing:
                t_measure = time.perf_counter()
                rec.record_probes(engine.update_stats(step, before))
                spent += time.perf_counter() - t_measure
            # evaluation and probes are not training time: the interval's clock skips them
            rec.measure_seconds += spent
            t_sync += spent
            if (step + 1) % cfg.log_every and step + 1 != cfg.steps:
                continue
            diverged = rec.sync(_read(cfg, engine, pending), t_sync, display)
            pending.clear()
            if diverged:  # probe the weights as they are when the run is declared diverged
                rec.record_probes(engine.probes(step + 1))
                break
            if (step + 1) % cfg.ckpt_every == 0 and step + 1 != cfg.steps:
                _checkpoint(folder, engine, rec)
            t_sync = time.perf_counter()
    except KeyboardInterrupt as stop:
        # keep the dispatched steps' rows and checkpoint where we are, unless they diverged: an
        # uninterrupted run trains to the end of the interval before it reads the divergence
        # and probes there, so the run is left at its last checkpoint, whose resume does that
        if pending:
            rec.record_steps(_read(cfg, engine, pending))
        display.close("interrupted; " + ("the same command resumes it from its last checkpoint"
                                         if rec.status == "diverged" else
                                         f"checkpointed at step {_checkpoint(folder, engine, rec)}"
                                         f" of {cfg.steps}: the same command resumes it"))
        stop.said = True  # the line above is the run's last word: cli adds none
        raise
    if rec.status == "completed":
        _measure(cfg, rec, engine, cfg.steps)
    return _finish(cfg, folder, rec, engine, manifest, meta, display)


def _measure(cfg: TrainConfig, rec: Recorder, engine: Engine, step: int) -> None:
    if step % cfg.eval_every == 0 or step == cfg.steps:
        rec.record_val(step, engine.evaluate())
    if step % cfg.probe_every == 0 or step == cfg.steps:
        rec.record_probes(engine.probes(step))


def _read(cfg: TrainConfig, engine: Engine, pending: list[tuple[int, Any]]) -> list[tuple]:
    """One device sync for a log interval: (step, loss, grad norm, lr, z-loss term) rows."""
    values = engine.read([handle for _, handle in pending])
    return [(s, a, b, c, z if cfg.z_loss else None)
            for (s, _), (a, b, c, z) in zip(pending, values)]


def _checkpoint(folder: RunFolder, engine: Engine, rec: Recorder) -> int:
    rec.flush()
    return folder.save_checkpoint(engine.state_arrays(), rec.state())


def _finish(cfg: TrainConfig, folder: RunFolder, rec: Recorder, engine: Engine, manifest: dict,
            meta: dict, display: Display) -> dict:
    digest = files.save_tensors(folder.final_file, engine.weights(), {"run_id": cfg.run_id})
    summary = rec.finish({**summary_base(cfg), "final_weights_sha256": digest,
                          "unigram_entropy": meta["unigram_entropy"]}, manifest, engine.params)
    folder.drop_finished_leftovers()
    display.close(rec.closing_line(summary))
    return summary


USAGE = keys_usage(
    "python -m qkstudy train [key=value ...]",
    "Trains one run into <runs_dir>/<sweep>/<run_id>/ (run_id: a hash of the config) with\n"
    "backend=mlx (mlx_gpt/) or backend=torch (torch_ref/; device=auto|cpu|cuda|mps). The same\n"
    "command again resumes an interrupted run from its checkpoint and skips a finished one.\n"
    "repair=true (not part of the run): a finished run whose files are damaged is moved to\n"
    "<runs_dir>/<sweep>/.damaged/<run_id>-<UTC time>/, nothing deleted, and trained again.",
    TrainConfig)


def parse_args(argv: list[str]) -> tuple[TrainConfig, bool]:
    """(the run's config, repair=true|false): repair is no TrainConfig field, so not in the run id."""
    pairs = split_key_values(argv)
    repair = take(pairs, "repair", bool, False)
    return apply_overrides(TrainConfig(), pairs).validate(), repair


def cli(argv: list[str]) -> int:
    cfg, repair = parse_args(argv)
    try:
        summary = train(cfg, repair=(lambda moved_to, why: print(
            f"repair: {why}; its files are kept in {moved_to}; training it again", flush=True))
            if repair else None)
    except RunBusy as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt as e:  # the run's line says where it stopped and how to resume
        if not getattr(e, "said", False):  # stopped before its first step or in its last writes
            try:
                done = RunFolder.of(cfg).finished()
            except run_folder.DamagedRun:
                done = None
            print("interrupted; " + (f"the run had {done['status']}: the same command skips it"
                                     if done else "the same command resumes the run"),
                  file=sys.stderr)
        return interrupts.exit_code(e)
    print(f"run folder: {RunFolder.of(cfg)}  status: {summary['status']}")
    return 0
