"""A run's checkpoint: weights ("model.<name>") and optimizer state ("opt.<key>") with a
checksum. The update count in "opt.<...>.step" is the whole data cursor (batches.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from . import files
from .backends import Engine
from .config import TrainConfig
from .run_folder import RunFolder


def checkpoint_step(arrays: dict[str, np.ndarray]) -> int | None:
    """The updates applied; None unless every "opt.<...>.step" entry holds the same count."""
    steps = [v for k, v in arrays.items() if k.startswith("opt.") and k.endswith(".step")]
    if not steps or any(s.shape != () for s in steps) or len({int(s) for s in steps}) != 1:
        return None
    return int(steps[0])


def save_checkpoint(path: Path, engine: Engine, extra: dict) -> int:
    """Write the engine's state and `extra` (the recorder's clocks); returns the step."""
    arrays = engine.state_arrays()
    step = checkpoint_step(arrays)
    files.save_tensors(path, arrays, {"step": str(step), **{k: repr(v) for k, v in extra.items()}})
    return step


def read_checkpoint(path: Path, engine: Engine) -> tuple[int, dict[str, np.ndarray], dict]:
    """(step, arrays, extra), verified against its checksum and this engine's state spec."""
    arrays, metadata = files.read_tensors(path)
    want = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in engine.state_spec().items()}
    got = {k: (v.shape, v.dtype) for k, v in arrays.items()}
    step = checkpoint_step(arrays)
    if got != want or step is None or metadata.get("step") != str(step):
        raise files.DamagedFile(f"{path.name} does not match this run's model and step")
    try:
        extra = {k: ast.literal_eval(v) for k, v in metadata.items() if k not in ("step", "sha256")}
    except (ValueError, SyntaxError):
        raise files.DamagedFile(f"{path.name} has unreadable metadata") from None
    return step, arrays, extra


def resume_point(cfg: TrainConfig, folder: RunFolder, engine: Engine, warn) -> tuple[int, dict]:
    """(step, recorder clocks) of a checkpoint that verifies and agrees with the rows on disk;
    else (0, {}), the checkpoint removed."""
    path = folder.checkpoint_file
    if path.exists():
        try:
            step, arrays, extra = read_checkpoint(path, engine)
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
