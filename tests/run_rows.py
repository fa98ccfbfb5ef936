"""A run's loss rows as the train tests compare them: each column's values, read from its
metrics parts."""

from __future__ import annotations

from qkstudy import run_folder
from qkstudy.config import TrainConfig
from qkstudy.run_folder import RunFolder


LOSS_COLUMNS = ["step", "tokens", "lr", "train_loss", "grad_norm", "val_loss"]


def rows(cfg: TrainConfig) -> dict:
    return run_folder.read_parts(RunFolder.of(cfg).path / "metrics").select(LOSS_COLUMNS).to_pydict()
