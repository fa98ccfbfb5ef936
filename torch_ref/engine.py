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
the weights stay float32). compile=true compiles the forward and the loss with torch.compile
(compiled.py: one compiled function for every run of the process). deterministic (default
true): device.py. QKSTUDY_RUNS_PER_DEVICE=K (set by a sweep with jobs=K): this process takes
1/K of the CPU's threads, or its share of a GPU (device.py).

The step never waits for the device: the batch is staged in pinned memory and copied
asynchronously, the learning rate comes from a table on the device, and the numbers of a step
stay on the device until the trainer reads a batch of steps (`read`, every log_every steps).
With QKSTUDY_SYNC_CHECK=1 on CUDA (gpu-check's throughput rows), every step after the first
runs under torch.cuda.set_sync_debug_mode("error"): one that makes the host wait raises.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from qkstudy import denormals
from qkstudy.config import TrainConfig, model_args
from qkstudy.parameters import count_params, initial_weights

from . import compiled
from . import probes as probe_lib
from .device import describe, place, resolve_device, runs_per_device, set_determinism, set_precision
from .model import GPT
from .optim import clip_and_step, make_optimizer

SYNC_CHECK = "QKSTUDY_SYNC_CHECK"


def preflight(cfg: TrainConfig) -> None:
    """The checks that need torch, before the run folder is made; and the determinism
    settings, before the memory check starts CUDA."""
    set_determinism(cfg.deterministic)
    set_precision(cfg.precision, resolve_device(cfg.device))


def stage(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """Token ids on `device`. To a GPU from pinned memory, asynchronously: a copy from pageable
    memory would make the host wait for the device (the pinned block is not reused before its
    copy is done: torch's host allocator records the copy)."""
    host = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class Engine:
    """qkstudy.trainer.Engine for PyTorch."""

    framework = "torch"

    def __init__(self, cfg: TrainConfig, vocab_size: int, val, probe):
        self.cfg = cfg
        set_determinism(cfg.deterministic)  # before this engine's first CUDA call
        self.dev = place(cfg.device)
        set_precision(cfg.precision, self.dev)
        share = runs_per_device()
        if self.dev.type == "cpu" and share > 1:  # K runs on one CPU: K x threads would thrash
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))
        args = model_args(cfg, vocab_size)
        self.model = GPT(args).to(self.dev)
        self.model.load_state_dict({k: torch.from_numpy(v)
                                    for k, v in initial_weights(args, cfg.seed).items()})
        self.names = [n for n, _ in self.model.named_parameters()]
        self.opt, self.schedule = make_optimizer(cfg, dict(self.model.named_parameters()))
        self.lr_table = self._lr_table()
        # the first step of a process compiles and allocates: the check starts after it
        self.sync_check = self.dev.type == "cuda" and os.environ.get(SYNC_CHECK) == "1"
        self.steps_run = 0
        self.bf16 = cfg.precision == "bf16"
        self.objective, self.val_loss = compiled.functions(cfg.compile)
        self.device = describe(self.dev)
        self.params = count_params(args)
        self.manifest_extra = {"torch_threads": torch.get_num_threads(),
                               "precision": cfg.precision, "compile": cfg.compile,
                               "deterministic": cfg.deterministic,
                               "flush_denormals": denormals.flushing(),
                               "float32_matmul_precision": torch.get_float32_matmul_precision()}
        self.warmup_note = ("compiling the step with torch.compile (a minute or more)"
                            if cfg.compile else "first step")
        self.val = [(stage(x, self.dev), stage(y, self.dev)) for x, y in val]
        self.px, self.py = (stage(a, self.dev) for a in probe)

    def _lr_table(self) -> torch.Tensor:
        """The schedule's rate of every update, float32 on the device, so a step reads its rate
        without a copy from the host; past the last step the schedule stays at its end."""
        rates = [self.schedule.rate(s) for s in range(self.cfg.steps + 1)]
        return torch.tensor(rates, dtype=torch.float32).to(self.dev)

    def state_spec(self):
        f32, spec = np.dtype("float32"), {}
        for name, p in self.model.named_parameters():
            for key in (f"model.{name}", f"opt.{name}.exp_avg", f"opt.{name}.exp_avg_sq"):
                spec[key] = (tuple(p.shape), f32)
            spec[f"opt.{name}.step"] = ((), f32)
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
        self.schedule.resume(int(arrays[f"opt.{self.names[0]}.step"]))

    def step(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        """Forward, backward of the objective (cross-entropy + z-loss term), clip, AdamW.
        Returns (cross-entropy, pre-clip grad norm, lr, z-loss term) stacked, not yet read:
        nothing here waits for the device."""
        checked = self.sync_check and self.steps_run > 0
        self.steps_run += 1
        if checked:
            torch.cuda.set_sync_debug_mode("error")
        try:
            return self._step(x, y)
        finally:
            if checked:
                torch.cuda.set_sync_debug_mode("default")

    def _step(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        total, loss, z = self.objective(self.model, stage(x, self.dev), stage(y, self.dev), self.bf16)
        total.backward()
        lr = self.lr_table[min(self.schedule.updates, len(self.lr_table) - 1)]
        grad_norm = clip_and_step(self.opt, self.schedule, self.cfg.grad_clip)
        return torch.stack([loss.detach(), grad_norm.float(), lr, z.detach()])

    def read(self, pending: list[torch.Tensor]) -> list[tuple[float, float, float, float]]:
        return torch.stack(pending).cpu().double().tolist()  # one sync; MPS has no float64

    @torch.no_grad()
    def evaluate(self) -> float:
        losses = [self.val_loss(self.model, x, y, self.bf16) for x, y in self.val]
        return torch.stack(losses).mean().item()

    def probes(self, step: int) -> list[dict]:
        return probe_lib.collect(self.model, self.px, self.py, step)

    def snapshot(self):
        return probe_lib.snapshot(self.model)

    def update_stats(self, step: int, before) -> list[dict]:
        return probe_lib.update_stats(step, before, probe_lib.snapshot(self.model))

    def weights(self) -> dict[str, np.ndarray]:
        return {n: p.detach().cpu().numpy().copy() for n, p in self.model.named_parameters()}

