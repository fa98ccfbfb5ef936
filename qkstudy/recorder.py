"""The framework-free bookkeeping of one run: rows, evaluations, divergence, summary."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from . import files
from .config import TrainConfig
from .run_folder import RunFolder


def divergence(cfg: TrainConfig, step: int, loss: float, grad_norm: float,
               init_loss: float | None, recent: Sequence[float]) -> str | None:
    """Why this step counts as diverged (non-finite, or median loss over init + margin), or None."""
    if not math.isfinite(loss):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return "non-finite gradient norm"
    window = cfg.divergence_window
    if init_loss is None or step < cfg.warmup_steps or len(recent) < window:
        return None
    smoothed = statistics.median_low(recent[-window:])
    if smoothed > init_loss + cfg.divergence_margin:
        return (f"median loss {smoothed:.3f} of the last {window} steps above initial loss "
                f"{init_loss:.3f} + {cfg.divergence_margin:g}")
    return None


@dataclass
class Health:
    """The loss history for divergence and spikes (above the running minimum); checkpointed."""

    recent: list[float] = field(default_factory=list)  # the last divergence_window losses
    running_min: float | None = None
    loss_spikes: int = 0
    in_spike: bool = False
    max_spike: float = 0.0
    max_spike_step: int | None = None

    def observe(self, cfg: TrainConfig, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            return
        self.recent = [*self.recent, loss][-cfg.divergence_window:]
        if self.running_min is not None:
            excess = loss - self.running_min
            if excess > self.max_spike:
                self.max_spike, self.max_spike_step = excess, step
            spiking = excess > cfg.spike_margin
            self.loss_spikes += spiking and not self.in_spike
            self.in_spike = spiking
        self.running_min = loss if self.running_min is None else min(self.running_min, loss)


def finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


class Recorder:
    def __init__(self, cfg: TrainConfig, folder: RunFolder, *, init_loss: float | None = None,
                 elapsed: float = 0.0, train_seconds: float = 0.0, measure_seconds: float = 0.0,
                 health: dict | None = None):
        self.cfg, self.folder = cfg, folder
        self.metric_rows: list[dict] = []
        self.probe_rows: list[dict] = []
        self.val_by_step: dict[int, float] = {}
        self.init_loss = init_loss
        self.last_val: float | None = None
        self.wall0 = time.perf_counter() - elapsed
        self.train_seconds = train_seconds  # the update steps (batches and read-backs included)
        self.measure_seconds = measure_seconds  # evaluation and probes
        self.health = Health(**(health or {}))
        self.status, self.diverged_step, self.reason = "completed", None, None

    def record_val(self, step: int, loss: float) -> None:
        self.val_by_step[step] = self.last_val = loss
        if self.init_loss is None:
            self.init_loss = loss

    def record_probes(self, rows: Iterable[dict]) -> None:
        self.probe_rows.extend(rows)

    def sync(self, values: list[tuple], since: float, display) -> bool:
        """One sync's clock, rows and progress line; True if a step of it diverged."""
        self.train_seconds += time.perf_counter() - since
        diverged = self.record_steps(values)
        display.update(values[-1][0] + 1, values[-1][1], self.train_seconds, self.last_val)
        return diverged

    def record_steps(self, values: Iterable[tuple]) -> bool:
        """Append (step, loss, grad_norm, lr[, z_loss]) rows; True once a step diverged."""
        if self.status == "diverged":
            return True
        logged = {r["step"] for r in self.metric_rows}
        for step, loss, grad_norm, lr, *z_loss in values:
            if step in logged:
                continue
            self.metric_rows.append(self._row(step, loss, grad_norm, lr, *z_loss))
            self.health.observe(self.cfg, step, loss)
            self.reason = divergence(self.cfg, step, loss, grad_norm, self.init_loss,
                                     self.health.recent)
            if self.reason:
                self.status, self.diverged_step = "diverged", step
                return True
        return False

    def _row(self, step: int, loss, grad_norm, lr, z_loss=None) -> dict:
        val = self.val_by_step.pop(step, None)
        return {"step": step, "tokens": step * self.cfg.tokens_per_step, "lr": lr,
                "train_loss": loss, "grad_norm": grad_norm, "val_loss": val,
                "val_ppl": math.exp(min(val, 700.0)) if val is not None else None,
                "elapsed_s": self.elapsed(), "z_loss": z_loss}

    def elapsed(self) -> float:
        return time.perf_counter() - self.wall0

    def state(self) -> dict:
        return {"init_loss": self.init_loss, "elapsed": self.elapsed(),
                "train_seconds": self.train_seconds, "measure_seconds": self.measure_seconds,
                "health": asdict(self.health)}

    def flush(self) -> None:
        self.folder.write_rows(self.metric_rows, self.probe_rows)
        self.metric_rows.clear()
        self.probe_rows.clear()

    def finish(self, summary_base: dict, manifest: dict, params: dict) -> dict:
        """Write the last rows, the manifest's end time and summary.json (last)."""
        cfg = self.cfg
        last_row = self.status == "completed"  # a row at step == steps with only the val loss
        if last_row:
            final_val = self.val_by_step.get(cfg.steps)
            self.metric_rows.append(self._row(cfg.steps, None, None, None))
            if final_val is not None and not math.isfinite(final_val):
                # the last update broke the weights: checked like every other update
                self.status, self.diverged_step = "diverged", cfg.steps - 1
                self.reason = "non-finite validation loss after the last update"
        self.flush()
        final_step = cfg.steps if self.status == "completed" else self.diverged_step + 1
        metrics = self.folder.read_metrics().to_pydict()
        vals = [v for v in metrics["val_loss"] if v is not None]
        finite_vals = [v for v in vals if math.isfinite(v)]
        summary = {
            **summary_base, "status": self.status, "loss_spikes": self.health.loss_spikes,
            "max_spike": self.health.max_spike, "max_spike_step": self.health.max_spike_step,
            "init_loss": self.init_loss, "min_val_loss": min(finite_vals, default=None),
            "final_val_loss": finite(vals[-1]) if self.status == "completed" and vals else None,
            "final_train_loss": finite(metrics["train_loss"][-2 if last_row else -1]),
            "diverged_step": self.diverged_step, "diverged_reason": self.reason,
            "steps": final_step, "tokens_seen": final_step * cfg.tokens_per_step,
            "wall_seconds": self.elapsed(), "train_seconds": self.train_seconds,
            "measure_seconds": self.measure_seconds,
            "tokens_per_second": final_step * cfg.tokens_per_step / max(self.train_seconds, 1e-9),
            "params": params, "peak_max_attention_logit": self.peak_logit(),
        }
        manifest["ended"] = files.now()
        self.folder.write_manifest(manifest)
        self.folder.write_summary(summary)
        return summary

    def peak_logit(self) -> float | None:
        table = self.folder.read_probes()
        if table is None:
            return None
        rows = table.select(["name", "value"]).to_pydict()
        return max((v for n, v in zip(rows["name"], rows["value"])
                    if n == "max_attention_logit" and v is not None and math.isfinite(v)),
                   default=None)

    def closing_line(self, summary: dict) -> str:
        if self.status == "completed":
            return f"completed at step {summary['steps']}: val {summary['final_val_loss'] or math.nan:.4f}"
        return f"diverged at step {self.diverged_step} ({self.reason})"
