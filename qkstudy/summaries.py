"""summary.json's keys: what each holds, which runs' summaries hold it, and their checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

FINISHED = ("completed", "diverged")  # a run with a result: its summary.json says so
STATUSES = (*FINISHED, "failed")  # every status a summary.json may hold
# nats below the unigram entropy: a run that ends above it learned token frequencies and little
# more (degraded); the sweep, the analysis and its simulations score runs by this one rule
DEGRADED_MARGIN = 0.2


def is_whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SummaryField(NamedTuple):
    kind: str  # number | whole number | step | count | step count | text | object | flag
    runs: str  # the summaries that hold it: every | finished (completed, diverged) | failed
    words: str  # what it is (docs/outputs.md shows the table: analysis/doc_tables.py)
    column: bool = False  # copied as it is into the analysis's runs table (analysis/load.py)


_F = SummaryField
SUMMARY_FIELDS = {  # summary.json's keys: all the recorder writes (tests/test_train_runs.py)
    "run_id": _F("text", "every", "the run's id, its folder's name"),
    "framework": _F("text", "every", "the engine that trained it: mlx or torch"),
    "sweep": _F("text", "every", "the sweep it belongs to, its parent folder's name"),
    "config": _F("object", "every", "its identity: the config keys that change what it computes"),
    "lr": _F("number", "every", "the peak learning rate"),
    "depth": _F("whole number", "every", "transformer blocks"),
    "qk_norm": _F("text", "every", "the QK-norm variant (none: off)"),
    "seed": _F("whole number", "every", "the seed of the initial weights"),
    "data_seed": _F("whole number", "every", "the seed of the batch order and the eval batches"),
    "d_model": _F("whole number", "every", "the model width"),
    "status": _F("text", "every", "completed, diverged or failed"),
    "error": _F("text", "failed", "the error it raised, in one line"),
    "fatal_signal": _F("flag", "failed", "true: an earlier attempt died by a fatal signal"),
    "init_loss": _F("number", "finished", "the validation loss before the first update", True),
    "final_val_loss": _F("number", "finished", "the last validation loss; null if diverged", True),
    "min_val_loss": _F("number", "finished", "the lowest finite validation loss", True),
    "final_train_loss": _F("number", "finished", "the training loss of the last update", True),
    "diverged_step": _F("step", "finished", "the update judged diverged; null if completed", True),
    "diverged_reason": _F("text", "finished", "why it diverged, in words; null if completed", True),
    "loss_spikes": _F("count", "finished", "excursions of the training loss more than "
                      "spike_margin above its running minimum", True),
    "max_spike": _F("number", "finished", "the largest such excursion (nats)", True),
    "unigram_entropy": _F("number", "finished", "the training tokens' unigram entropy, nats", True),
    "max_spike_step": _F("step", "finished", "the step where max_spike peaked", True),
    "steps": _F("step count", "finished", "updates done", True),
    "tokens_seen": _F("count", "finished", "steps x batch_size x block_size", True),
    "wall_seconds": _F("number", "finished", "start to the last write", True),
    "tokens_per_second": _F("number", "finished", "tokens_seen over train_seconds", True),
    "train_seconds": _F("number", "finished", "the update steps, their batches and read-backs"),
    "measure_seconds": _F("number", "finished", "evaluation and probes"),
    "params": _F("object", "finished", "parameter counts: total, non_embedding, embedding"),
    "peak_max_attention_logit": _F("number", "finished", "the largest max_attention_logit "
                                   "probe value; null if none"),
    "final_weights_sha256": _F("text", "finished", "the sha256 of the final weights' file"),
}
_CHECKS = {"number": lambda v: is_whole(v) or isinstance(v, float), "whole number": is_whole,
           "step": is_whole, **dict.fromkeys(("count", "step count"), lambda v: is_whole(v) and v >= 0)}


def summary_problem(summary: dict, run_dir: Path) -> str | None:
    status = summary.get("status")
    if status not in STATUSES:
        return f"has status {status!r}, not one of completed, diverged, failed"
    if "run_id" in summary and summary["run_id"] != run_dir.name:
        return f"belongs to run {summary['run_id']!r}, not to this folder"
    # a finished run must say its steps; its other keys may be null or missing (older runs)
    for key in ("steps", *SUMMARY_FIELDS) if status in FINISHED else ():
        check, value = _CHECKS.get(SUMMARY_FIELDS[key].kind), summary.get(key)
        if check and (value is not None or key == "steps") and not check(value):
            return f"has {key}={value!r}, not a {SUMMARY_FIELDS[key].kind}"
    return None


def scored_loss(final: Any, init: Any, diverged: Any, unigram_entropy: Any,
                margin: float = DEGRADED_MARGIN) -> tuple[np.ndarray, np.ndarray]:
    """(the loss a run is scored at, whether it degraded), elementwise over arrays or scalars
    (NaN: unknown). The loss is the final validation loss clipped at the initial loss (Wortsman
    et al. 2023, Sec. 2.2), the initial loss where the run diverged or ended without a finite
    loss (+inf there when the initial loss is unknown too); degraded: it trained to a finite
    loss above the unigram entropy minus `margin` (never where the entropy is unknown)."""
    final = np.asarray(final, dtype=float)
    failed = np.asarray(diverged, dtype=bool) | ~np.isfinite(final)
    loss = np.fmin(np.where(failed, np.inf, final), np.asarray(init, dtype=float))
    with np.errstate(invalid="ignore"):
        degraded = ~failed & (final > np.asarray(unigram_entropy, dtype=float) - margin)
    return loss, degraded
