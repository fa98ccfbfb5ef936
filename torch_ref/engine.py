"""The PyTorch engine of a run (docs/torch_ref.md): its step never waits for the device."""

from __future__ import annotations

import functools
import logging
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch

from qkstudy import denormals, probes
from qkstudy.config import TrainConfig, model_args
from qkstudy.optimizer import decay_coefficient, decays, learning_rates
from qkstudy.parameters import count_params, initial_weights

from .device import describe, place, resolve_device, runs_per_device, set_determinism, set_precision
from .model import GPT

SYNC_CHECK = "QKSTUDY_SYNC_CHECK"
GRAPHS = 64  # graphs per function: 32 (depth, arm) shapes, training and evaluation each
FELL_BACK = ("torch.compile: a process of this sweep met more than {limit} shapes and runs the "
             "rest eagerly (same maths, slower); fewer depths or arms a process avoid it")


class Schedule:
    """The rate of every update, set on the optimizer's groups before each step. Each rate is
    base x (rate / base), as LambdaLR computes it, so runs keep their numbers to the bit."""

    def __init__(self, opt: torch.optim.AdamW, cfg: TrainConfig):
        self.opt, self.base = opt, cfg.lr
        self.rates = [self.base * (r / self.base) for r in learning_rates(cfg).tolist()]
        self.resume(0)

    def rate(self, update: int) -> float:  # past the last update, the last one's
        return self.rates[min(update, len(self.rates) - 1)]

    def resume(self, updates: int) -> None:
        """Continue after `updates` updates (the next one uses rate(updates))."""
        self.updates = updates
        for group in self.opt.param_groups:
            group["lr"] = self.rate(updates)


def make_optimizer(cfg: TrainConfig, named_params: dict[str, torch.nn.Parameter]
                   ) -> tuple[torch.optim.AdamW, Schedule]:
    decay = [p for name, p in named_params.items() if decays(name, tuple(p.shape))]
    other = [p for name, p in named_params.items() if not decays(name, tuple(p.shape))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": decay_coefficient(cfg)},
                             {"params": other, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return opt, Schedule(opt, cfg)


def clip_and_step(opt: torch.optim.AdamW, schedule: Schedule, grad_clip: float
                  ) -> torch.Tensor:
    """Clip to global norm and step; the pre-clip norm as a 0-d tensor, not read."""
    params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)
    opt.step()
    schedule.resume(schedule.updates + 1)
    return norm


def objective(model, x: torch.Tensor, y: torch.Tensor, bf16: bool):
    """GPT.loss of one batch, the forward in bfloat16 under bf16, the loss in float32."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    return model.loss(logits.float(), y)


def val_loss(model, x: torch.Tensor, y: torch.Tensor, bf16: bool) -> torch.Tensor:
    return objective(model, x, y, bf16)[1]


class FallbackNotice(logging.Filter):
    """Replaces torch's multi-line warning on reaching the recompile limit with FELL_BACK."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "hit config." not in str(record.msg):
            return True
        limit = record.args[1] if isinstance(record.args, tuple) and len(record.args) > 1 \
            else GRAPHS
        print(FELL_BACK.format(limit=limit), file=sys.stderr, flush=True)
        return False


@functools.cache
def configure() -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), GRAPHS))
    # torch 2.x: the limit over all of a function's graphs; kept above the per-function one
    for total in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, total):
            setattr(config, total, max(getattr(config, total), 4 * GRAPHS))
            break
    logging.getLogger("torch._dynamo.convert_frame").addFilter(FallbackNotice())


@functools.cache
def functions(compile_: bool):
    """(objective, val_loss), compiled once a process when `compile_`."""
    if not compile_:
        return objective, val_loss
    configure()
    return torch.compile(objective), torch.compile(val_loss)


PROBE_OPS = SimpleNamespace(  # MPS has no float64: the numbers leave the device as float32
    where=torch.where, f32=lambda x: x.float(),
    numbers=lambda values: torch.cat([v.float().reshape(-1) for v in values]).cpu().double()
    .tolist())


def collect(model: GPT, x: torch.Tensor, y: torch.Tensor, step: int) -> list[dict]:
    """Every probe on the batch (x, y) after `step` updates; .grad is left alone."""
    named = dict(model.named_parameters())
    with torch.enable_grad():
        captures: list[dict] = []
        logits = model(x, captures)
        total, ce, _ = model.loss(logits, y)
        grads = dict(zip(named, torch.autograd.grad(total, list(named.values()))))
    captures = [{k: v.detach() for k, v in c.items()} for c in captures]
    return probes.collected(step, model.args, captures, logits.detach(), ce.detach(),
                            snapshot(model, copy=False), grads, PROBE_OPS)


def snapshot(model: GPT, copy: bool = True) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() if copy else p.detach() for k, p in model.named_parameters()}


def preflight(cfg: TrainConfig) -> None:
    set_determinism(cfg.deterministic)
    set_precision(cfg.precision, resolve_device(cfg.device))


def stage(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """Token ids on `device`; to a GPU asynchronously from pinned memory."""
    host = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class Engine:
    framework = "torch"

    def __init__(self, cfg: TrainConfig, vocab_size: int, val, probe):
        self.cfg = cfg
        preflight(cfg)  # determinism before this engine's first CUDA call
        self.dev = place(cfg.device)
        share = runs_per_device()
        if self.dev.type == "cpu" and share > 1:  # K runs on one CPU: K x threads would thrash
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))
        args = model_args(cfg, vocab_size)
        self.model = GPT(args).to(self.dev)
        self.model.load_state_dict({k: torch.from_numpy(v)
                                    for k, v in initial_weights(args, cfg.seed).items()})
        self.names = [n for n, _ in self.model.named_parameters()]
        self.opt, self.schedule = make_optimizer(cfg, dict(self.model.named_parameters()))
        # every update's rate on the device (past the last step, the schedule's end)
        self.lr_table = torch.tensor([self.schedule.rate(s) for s in range(cfg.steps + 1)],
                                     dtype=torch.float32).to(self.dev)
        # the first step of a process compiles and allocates: the check starts after it
        self.sync_check = self.dev.type == "cuda" and os.environ.get(SYNC_CHECK) == "1"
        self.steps_run = 0
        self.bf16 = cfg.precision == "bf16"
        self.objective, self.val_loss = functions(cfg.compile)
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

    def state_spec(self):
        return {k: (v.shape, v.dtype) for k, v in self.state_arrays().items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, p in self.model.named_parameters():
            state = self.opt.state.get(p, {})
            out[f"model.{name}"] = p.detach().cpu().numpy().copy()
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"opt.{name}.{key}"] = state[key].detach().cpu().numpy().copy() \
                    if key in state else np.zeros(tuple(p.shape), np.float32)
            out[f"opt.{name}.step"] = np.array(float(state.get("step", 0.0)), np.float32)
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(torch.from_numpy(arrays[f"model.{name}"]))
                self.opt.state[p] = {
                    "step": torch.tensor(float(arrays[f"opt.{name}.step"]), dtype=torch.float32),
                    **{k: torch.from_numpy(arrays[f"opt.{name}.{k}"].copy()).to(self.dev)
                       for k in ("exp_avg", "exp_avg_sq")}}
        self.schedule.resume(int(arrays[f"opt.{self.names[0]}.step"]))

    def step(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        checked = self.sync_check and self.steps_run > 0
        self.steps_run += 1
        if checked:
            torch.cuda.set_sync_debug_mode("error")
        try:
            self.model.zero_grad(set_to_none=True)
            total, loss, z = self.objective(self.model, stage(x, self.dev), stage(y, self.dev),
                                            self.bf16)
            total.backward()
            lr = self.lr_table[min(self.schedule.updates, len(self.lr_table) - 1)]
            grad_norm = clip_and_step(self.opt, self.schedule, self.cfg.grad_clip)
            return torch.stack([loss.detach(), grad_norm.float(), lr, z.detach()])
        finally:
            if checked:
                torch.cuda.set_sync_debug_mode("default")

    def read(self, pending: list[torch.Tensor]) -> list[tuple[float, float, float, float]]:
        return torch.stack(pending).cpu().double().tolist()  # one sync; MPS has no float64

    @torch.no_grad()
    def evaluate(self) -> float:
        losses = [self.val_loss(self.model, x, y, self.bf16) for x, y in self.val]
        return torch.stack(losses).mean().item()

    def probes(self, step: int) -> list[dict]:
        return collect(self.model, self.px, self.py, step)

    def snapshot(self):
        return snapshot(self.model)

    def update_stats(self, step: int, before) -> list[dict]:
        return probes.update_ratios(step, before, snapshot(self.model), PROBE_OPS)

    def weights(self) -> dict[str, np.ndarray]:
        return {n: p.cpu().numpy().copy() for n, p in snapshot(self.model, copy=False).items()}

