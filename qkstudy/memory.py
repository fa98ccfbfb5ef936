"""How much memory one training step needs, checked before anything trains."""

from __future__ import annotations

import dataclasses
import os
import sys

from .config import TrainConfig, model_args
from .errors import UsageError
from .parameters import count_params

FLOAT32 = 4
HEADROOM = 0.9  # refuse above this share of the memory there is: the OS, data and caches need some

# Copies of each tensor family alive at the step's peak (a fit at 15 shapes: performance.md)
PARAM_COPIES = 7  # weights, gradients, AdamW's moments, and the update's new ones
LAYER_RESIDUAL_COPIES = 20  # per layer, kept for the backward (batch x block x d_model each)
LAYER_SCORE_COPIES = 3  # per layer, kept: scores, exponentials, probabilities (b x h x t^2)
BACKWARD_SCORE_COPIES = 5  # one layer's backward at a time (batch x heads x block^2)
BACKWARD_RESIDUAL_COPIES = 84  # one block's backward at a time, the MLP's unfused (b x t x c)
LOGIT_COPIES = 8  # logits, the log-sum-exp's temporaries, their gradient (b x t x vocab)

TERMS = {  # term -> (what it is; the knobs behind it; the knobs that shrink it)
    "state": ("the parameters, gradients and AdamW state",
              "{params} parameters (depth {depth}, d_model {d_model})", "lower d_model or depth"),
    "activations": ("the activations", "batch_size {batch_size} x block_size {block_size} x "
                    "d_model {d_model} x depth {depth}", "lower batch_size, block_size or d_model"),
    "attention": ("the attention scores", "block_size {block_size}",
                  "lower block_size or batch_size"),
    "logits": ("the output logits", "batch_size {batch_size} x block_size {block_size} x "
               "vocabulary {vocab}", "lower batch_size or block_size")}


@dataclasses.dataclass(frozen=True)
class Estimate:
    parameters: int
    terms: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def dominant(self) -> str:
        return max(self.terms, key=self.terms.__getitem__)


def estimate(cfg: TrainConfig, vocab_size: int) -> Estimate:
    """Peak bytes of one compiled training step (forward, backward, AdamW update)."""
    b, t, c, h, layers = cfg.batch_size, cfg.block_size, cfg.d_model, cfg.n_heads, cfg.depth
    params = count_params(model_args(cfg, vocab_size))["total"]
    residual, scores = b * t * c, b * h * t * t
    return Estimate(params, {
        "state": FLOAT32 * PARAM_COPIES * params,
        "activations": FLOAT32 * residual * (LAYER_RESIDUAL_COPIES * layers
                                             + BACKWARD_RESIDUAL_COPIES),
        "attention": FLOAT32 * scores * (LAYER_SCORE_COPIES * layers + BACKWARD_SCORE_COPIES),
        "logits": FLOAT32 * LOGIT_COPIES * b * t * model_args(cfg, vocab_size).padded_vocab})


def format_bytes(n: float, unit: str = "B", space: str = " ") -> str:
    """1.3 TB, 23 GB, 250 MB, 12 kB; with unit and space "", a count: 1.6T, 12M, 800k."""
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            value = f"{n / size:.1f}" if n / size < 10 else f"{n / size:,.0f}"
            return f"{value}{space}{prefix}{unit}"
    return f"{n:.0f}{space}{unit}".rstrip()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def available() -> tuple[int, str]:
    """(bytes this process can use, the words for it): unified memory, MemAvailable or RAM."""
    meminfo = [line.split() for line in _read("/proc/meminfo").splitlines()]
    size = next((int(w[1]) * 1024 for w in meminfo if w[:1] == ["MemAvailable:"]), None)
    words = "this machine has {} available"  # what can be allocated without swapping
    if size is None:
        try:
            size = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # macOS: hw.memsize
            words = ("this Mac has {} of unified memory" if sys.platform == "darwin"
                     else "this machine has {}")
        except (ValueError, OSError, AttributeError):
            return 1 << 62, "this machine's memory is unknown"
    limit, used = (_read(f"/sys/fs/cgroup/memory.{k}") for k in ("max", "current"))  # v2
    if limit.isdigit() and int(limit) < size:  # "max": no limit
        size = max(0, int(limit) - (int(used) if used.isdigit() else 0))
        words = "this process's cgroup has {} left"
    return size, words.format(format_bytes(size))


def check(cfg: TrainConfig, vocab_size: int, *, runs_at_once: int = 1, prefix: str = "",
          limit: tuple[int, str] | None = None) -> Estimate:
    """The step's estimate; UsageError when `runs_at_once` steps need over HEADROOM of `limit`."""
    est = estimate(cfg, vocab_size)
    size, there = limit if limit is not None else available()
    need = est.total * runs_at_once
    if need > HEADROOM * size:
        what, knobs, fix = TERMS[est.dominant]
        subject = knobs.format(params=format_bytes(est.parameters, "", ""), vocab=vocab_size,
                               **dataclasses.asdict(cfg))
        at_once = (f", {runs_at_once} runs at once (jobs={runs_at_once}): "
                   f"{format_bytes(need)}" if runs_at_once > 1 else "")
        raise UsageError(f"{prefix}{subject} needs about {format_bytes(est.total)} per "
                         f"training step ({format_bytes(est.terms[est.dominant])} of it for "
                         f"{what}){at_once}; {there}: {fix}")
    return est
