"""The PyTorch engine of a run (qkstudy/trainer.py drives it): backend=torch on cuda, mps or cpu.

It trains the model of torch_ref/model.py from the core's numpy initial weights (the same as an
MLX run's), with torch.optim.AdamW and the schedule of torch_ref/optim.py, and hands its state
to the trainer as numpy arrays, so a torch run checkpoints, resumes, fails and finishes exactly
like an MLX run:

  model.<name>                parameters (float32 master weights in every precision)
  opt.<name>.exp_avg          AdamW's first and second moments
  opt.<name>.exp_avg_sq
  opt.<name>.step             its update count (the learning-rate schedule follows from it)

Precision (TrainConfig.precision): fp32 (default; no TF32 anywhere), tf32 (CUDA matmuls in
TF32), bf16 (autocast of the forward to bfloat16 on CUDA or CPU; the loss, the optimizer and
the weights stay float32). compile=true wraps the forward in torch.compile.
QKSTUDY_RUNS_PER_DEVICE=K (set by a sweep with jobs=K): this process takes 1/K of the CPU's
threads, or at most 1/K of the GPU's memory.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import torch

from qkstudy.config import TrainConfig, model_args
from qkstudy.errors import UsageError
from qkstudy.trainer import RUNS_PER_DEVICE
from qkstudy.parameters import count_params, initial_weights

from . import probes as probe_lib
from .model import GPT, cross_entropy, objective_terms
from .optim import lr_schedule, make_optimizer, update



def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda, else mps, else cpu; an unavailable device is a usage error."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available()}
    if name == "auto":
        name = next(d for d in ("cuda", "mps", "cpu") if available[d])
    if name not in available:
        raise UsageError(f"device must be one of auto, cuda, mps, cpu; got {name!r}")
    if not available[name]:
        raise UsageError(f"device {name} is not available to this torch build "
                         f"({torch.__version__}); use device=auto or device=cpu")
    return torch.device(name)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def set_precision(precision: str, device: torch.device) -> None:
    """fp32: no TF32 anywhere (the reference); tf32: CUDA matmuls and convolutions in TF32."""
    if precision == "tf32" and device.type != "cuda":
        raise UsageError(f"precision=tf32 is a CUDA mode; on {device.type} use fp32 or bf16")
    if precision == "bf16" and device.type == "mps":
        raise UsageError("precision=bf16 is not supported on mps here; use fp32")
    tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def runs_per_device() -> int:
    """K of a sweep with jobs=K (RUNS_PER_DEVICE in the environment), else 1."""
    try:
        return max(1, int(os.environ.get(RUNS_PER_DEVICE, "1") or 1))
    except ValueError:
        return 1


def preflight(cfg: TrainConfig) -> None:
    """The checks that need torch, before the run folder is made."""
    set_precision(cfg.precision, resolve_device(cfg.device))


class Engine:
    """qkstudy.trainer.Engine for PyTorch."""

    framework = "torch"

    def __init__(self, cfg: TrainConfig, vocab_size: int, val, probe):
        self.cfg = cfg
        self.dev = resolve_device(cfg.device)
        set_precision(cfg.precision, self.dev)
        share = runs_per_device()
        if self.dev.type == "cuda" and share > 1:
            torch.cuda.set_per_process_memory_fraction(1 / share, self.dev)
        if self.dev.type == "cpu" and share > 1:  # K runs on one CPU: K x threads would thrash
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))
        args = model_args(cfg, vocab_size)
        self.model = GPT(args).to(self.dev)
        self._load_initial(args)
        self.names = [n for n, _ in self.model.named_parameters()]
        self.opt, self.schedule = make_optimizer(cfg, dict(self.model.named_parameters()))
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.device = describe(self.dev)
        self.params = count_params(args)
        self.manifest_extra = {"torch_threads": torch.get_num_threads(),
                               "precision": cfg.precision, "compile": cfg.compile,
                               "float32_matmul_precision": torch.get_float32_matmul_precision()}
        self.warmup_note = ("compiling the step with torch.compile (a minute or more)"
                            if cfg.compile else "first step")
        self.val = [(self._tokens(x), self._tokens(y)) for x, y in val]
        self.px, self.py = (self._tokens(a) for a in probe)

    def _load_initial(self, args) -> None:
        weights = initial_weights(args, self.cfg.seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(torch.from_numpy(weights[name]))

    def _tokens(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.dev)

    def _autocast(self):
        if self.cfg.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.dev.type, dtype=torch.bfloat16)

    # --- state ------------------------------------------------------------------------------

    def state_spec(self):
        spec = {}
        for name, p in self.model.named_parameters():
            shape = tuple(p.shape)
            spec[f"model.{name}"] = (shape, np.dtype("float32"))
            spec[f"opt.{name}.exp_avg"] = (shape, np.dtype("float32"))
            spec[f"opt.{name}.exp_avg_sq"] = (shape, np.dtype("float32"))
            spec[f"opt.{name}.step"] = ((), np.dtype("float32"))
        return spec

    def state_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, p in self.model.named_parameters():
            state = self.opt.state.get(p, {})
            out[f"model.{name}"] = p.detach().cpu().numpy().copy()
            for key in ("exp_avg", "exp_avg_sq"):
                value = state.get(key)
                out[f"opt.{name}.{key}"] = (value.detach().cpu().numpy().copy() if value is not None
                                            else np.zeros(tuple(p.shape), np.float32))
            out[f"opt.{name}.step"] = np.array(float(state.get("step", 0.0)), np.float32)
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(torch.from_numpy(arrays[f"model.{name}"]))
                self.opt.state[p] = {
                    "step": torch.tensor(float(arrays[f"opt.{name}.step"]), dtype=torch.float32),
                    "exp_avg": torch.from_numpy(arrays[f"opt.{name}.exp_avg"].copy()).to(self.dev),
                    "exp_avg_sq": torch.from_numpy(arrays[f"opt.{name}.exp_avg_sq"].copy()
                                                   ).to(self.dev)}
        step = int(arrays[f"opt.{self.names[0]}.step"])
        self.schedule.last_epoch = step  # LambdaLR's count of schedule steps taken
        for group, base in zip(self.opt.param_groups, self.schedule.base_lrs):
            group["lr"] = base * lr_schedule(step, self.cfg) / self.cfg.lr
        self.schedule._last_lr = [g["lr"] for g in self.opt.param_groups]

    # --- the step, evaluation, probes -------------------------------------------------------

    def step(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        """Forward, backward of the objective (cross-entropy + z-loss term), clip, AdamW.
        Returns (cross-entropy, pre-clip grad norm, lr, z-loss term) stacked, not yet read."""
        self.model.zero_grad(set_to_none=True)
        with self._autocast():
            logits = self.forward(self._tokens(x))
        total, loss, z = objective_terms(logits.float(), self._tokens(y), self.cfg.z_loss)
        total.backward()
        grad_norm, lr = update(self.opt, self.schedule, self.cfg.grad_clip)
        return torch.stack([loss.detach(), grad_norm.float(), lr.to(loss.dtype), z.detach()])

    def read(self, pending: list[torch.Tensor]) -> list[tuple[float, float, float, float]]:
        return torch.stack(pending).cpu().double().tolist()  # one sync; MPS has no float64

    @torch.no_grad()
    def evaluate(self) -> float:
        losses = []
        for x, y in self.val:
            with self._autocast():
                logits = self.forward(x)
            losses.append(cross_entropy(logits.float(), y))
        return torch.stack(losses).mean().item()

    def probes(self, step: int) -> list[dict]:
        return probe_lib.measure(self.model, self.px, self.py, step)

    def snapshot(self):
        return probe_lib.snapshot(self.model)

    def update_stats(self, step: int, before) -> list[dict]:
        return probe_lib.update_stats(step, before, probe_lib.snapshot(self.model))

    def weights(self) -> dict[str, np.ndarray]:
        return {n: p.detach().cpu().numpy().copy() for n, p in self.model.named_parameters()}


def calibrate(cfg: TrainConfig, vocab: int, steps: int = 3, max_seconds: float = 10.0
              ) -> tuple[float, int]:
    """(tokens/s, steps timed): train steps of this exact shape after one warm-up step."""
    rng = np.random.default_rng(0)
    batch = (cfg.batch_size, cfg.block_size)
    engine = Engine(cfg, vocab, [], (rng.integers(0, vocab, batch), rng.integers(0, vocab, batch)))
    x, y = rng.integers(0, vocab, batch), rng.integers(0, vocab, batch)
    engine.read([engine.step(x, y)])
    start, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - start < max_seconds):
        engine.read([engine.step(x, y)])
        timed += 1
    return timed * cfg.tokens_per_step / (time.perf_counter() - start), timed
