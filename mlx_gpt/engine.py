"""The MLX engine of a run; checkpoint state: "model.<name>" and "opt.<key>" arrays."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from qkstudy import denormals, probes
from qkstudy.config import TrainConfig, model_args
from qkstudy.optimizer import decay_coefficient, decays, learning_rates
from qkstudy.parameters import count_params

from . import blas
from .model import GPT, init_weights


PROBE_OPS = SimpleNamespace(
    where=mx.where, f32=lambda x: x.astype(mx.float32),
    numbers=lambda values: np.array(mx.concatenate([v.reshape(-1) for v in values])
                                    .astype(mx.float32), dtype=np.float64).tolist())


def collect(model: GPT, x: mx.array, y: mx.array, step: int) -> list[dict]:
    def objective(x: mx.array, y: mx.array):
        captures: list[dict] = []
        logits = model(x, captures)
        total, ce, _ = model.loss(logits, y)
        return total, ce, logits, captures

    (_, ce, logits, captures), grads = nn.value_and_grad(model, objective)(x, y)
    return probes.collected(step, model.args, captures, logits, ce,
                            dict(tree_flatten(model.parameters())), dict(tree_flatten(grads)), PROBE_OPS)


def make_optimizer(cfg: TrainConfig, params: dict) -> optim.MultiOptimizer:
    rates = mx.array(learning_rates(cfg))
    last = rates.size - 1

    def adamw(weight_decay: float) -> optim.AdamW:
        # the schedule gets the update count before the optimizer increments it
        return optim.AdamW(learning_rate=lambda step: rates[mx.minimum(step, last)],
                           betas=[cfg.beta1, cfg.beta2], eps=cfg.eps,
                           weight_decay=weight_decay, bias_correction=True)

    opt = optim.MultiOptimizer([adamw(decay_coefficient(cfg)), adamw(0.0)],
                               [lambda name, param: decays(name, param.shape)])
    opt.init(params)
    return opt


def update(opt: optim.MultiOptimizer, model, grads: dict, grad_clip: float
           ) -> tuple[mx.array, mx.array]:
    clipped, norm = optim.clip_grad_norm(grads, grad_clip if grad_clip > 0 else math.inf)
    opt.update(model, clipped if grad_clip > 0 else grads)
    return norm, opt.learning_rate


def build_model(cfg: TrainConfig, vocab_size: int) -> GPT:
    model = GPT(model_args(cfg, vocab_size))
    init_weights(model, cfg.seed)
    return model


def make_train_step(model: GPT, opt: optim.MultiOptimizer, grad_clip: float):
    """The compiled update (x, y) -> (loss, grad norm, lr, z), and its state list."""
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: m.loss(m(x), y))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array):
        (_, loss, z), grads = loss_and_grad(model, x, y)
        grad_norm, lr = update(opt, model, grads, grad_clip)
        return loss, grad_norm, lr, z

    return step_fn, state


class Engine:
    framework = "mlx"
    warmup_note = ("compiling the train step (a first run on this machine also builds MLX's "
                   "kernels: up to a minute)")

    def __init__(self, cfg: TrainConfig, vocab_size: int, val, probe):
        blas.warn_slow_blas()
        self.cfg = cfg
        self.model = build_model(cfg, vocab_size)
        self.opt = make_optimizer(cfg, self.model.parameters())
        self.device = f"{mx.default_device()}"
        self.manifest_extra = {"blas": blas.loaded, "flush_denormals": denormals.flushing()}
        self.params = count_params(self.model.args)
        self.val = [(mx.array(x), mx.array(y)) for x, y in val]
        self.px, self.py = (mx.array(a) for a in probe)
        self._step = None  # compiled at the first step, after any checkpoint is loaded

        @partial(mx.compile, inputs=self.model.state)
        def eval_fn(x, y):
            return self.model.loss(self.model(x), y)[1]

        self._eval = eval_fn

    def state_spec(self):
        return {k: (v.shape, v.dtype) for k, v in self.state_arrays().items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {**{f"model.{k}": np.array(v) for k, v in tree_flatten(self.model.parameters())},
                **{f"opt.{k}": np.array(v) for k, v in tree_flatten(self.opt.state)}}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Before the first step: the compiled step holds the optimizer's state dicts."""
        self.model.update(tree_unflatten([(k[6:], mx.array(v)) for k, v in arrays.items()
                                          if k.startswith("model.")]))
        self.opt.state = tree_unflatten([(k[4:], mx.array(v)) for k, v in arrays.items()
                                         if k.startswith("opt.")])
        self.opt.init(self.model.parameters())  # marks it initialised; its entries are there

    def step(self, x: np.ndarray, y: np.ndarray):
        if self._step is None:
            self._step = make_train_step(self.model, self.opt, self.cfg.grad_clip)
        step_fn, state = self._step
        loss, grad_norm, lr, z = step_fn(mx.array(x), mx.array(y))
        mx.async_eval(state, loss, grad_norm)
        return loss, grad_norm, lr, z

    def read(self, pending) -> list[tuple[float, float, float, float]]:
        return np.array(mx.stack([mx.stack(list(v)) for v in pending])).tolist()

    def evaluate(self) -> float:
        return mx.stack([self._eval(x, y) for x, y in self.val]).mean().item()

    def probes(self, step: int) -> list[dict]:
        return collect(self.model, self.px, self.py, step)

    def snapshot(self):
        return dict(tree_flatten(self.model.parameters()))

    def update_stats(self, step: int, before) -> list[dict]:
        return probes.update_ratios(step, before, self.snapshot(), PROBE_OPS)

    def weights(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.snapshot().items()}
