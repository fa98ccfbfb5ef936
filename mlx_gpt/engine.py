"""The MLX engine of a run (qkstudy/trainer.py drives it): compiled AdamW step, evaluation,
probes, and the state as numpy arrays for checkpoints: the weights ("model.<name>") and the
optimizer's whole state ("opt.<key>" of tree_flatten(opt.state): moments, learning rate, step).
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from qkstudy import denormals
from qkstudy.config import TrainConfig, model_args
from qkstudy.parameters import count_params

from . import probes as probe_lib
from .blas import loaded as blas
from .model import GPT, init_weights
from .optim import make_optimizer, update


def build_model(cfg: TrainConfig, vocab_size: int) -> GPT:
    """The run's model with its initial weights (qkstudy/parameters.py)."""
    model = GPT(model_args(cfg, vocab_size))
    init_weights(model, cfg.seed)
    return model


def make_train_step(model: GPT, opt: optim.MultiOptimizer, grad_clip: float):
    """The compiled update: (x, y) -> (loss, pre-clip grad norm, lr, z-loss term), mutating
    model and opt (optim.make_optimizer's). The gradient is that of GPT.loss's objective
    (cross-entropy plus the z-loss term when z_loss > 0); `loss` is the cross-entropy alone, so
    every arm logs the same quantity.

    Returns it with the state list to pass to mx.eval / mx.async_eval after each call."""
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: m.loss(m(x), y))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x: mx.array, y: mx.array):
        (_, loss, z), grads = loss_and_grad(model, x, y)
        grad_norm, lr = update(opt, model, grads, grad_clip)
        return loss, grad_norm, lr, z

    return step_fn, state


def checkpoint_arrays(model: GPT, opt: optim.MultiOptimizer) -> dict[str, mx.array]:
    arrays = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    arrays.update({f"opt.{k}": v for k, v in tree_flatten(opt.state)})
    return arrays


def apply_checkpoint(arrays: dict[str, np.ndarray], model: GPT, opt: optim.MultiOptimizer) -> None:
    """Load the weights and the optimizer state. Before make_train_step: the compiled step
    holds the optimizer's state dicts."""
    model.update(tree_unflatten([(k[6:], mx.array(v)) for k, v in arrays.items()
                                 if k.startswith("model.")]))
    opt.state = tree_unflatten([(k[4:], mx.array(v)) for k, v in arrays.items()
                                if k.startswith("opt.")])
    opt.init(model.parameters())  # marks it initialised; every entry is already there


class Engine:
    """qkstudy.trainer.Engine for MLX on its default device (Apple GPU, else the CPU)."""

    framework = "mlx"
    warmup_note = ("compiling the train step (a first run on this machine also builds MLX's "
                   "kernels: up to a minute)")

    def __init__(self, cfg: TrainConfig, vocab_size: int, val, probe):
        self.cfg = cfg
        self.model = build_model(cfg, vocab_size)
        self.opt = make_optimizer(cfg, self.model.parameters())
        self.device = f"{mx.default_device()}"
        self.manifest_extra = {"blas": blas, "flush_denormals": denormals.flushing()}
        self.params = count_params(self.model.args)
        self.val = [(mx.array(x), mx.array(y)) for x, y in val]
        self.px, self.py = (mx.array(a) for a in probe)
        self._step = None  # compiled at the first step, after any checkpoint is loaded

        @partial(mx.compile, inputs=self.model.state)
        def eval_fn(x, y):
            return self.model.loss(self.model(x), y)[1]

        self._eval = eval_fn

    def state_spec(self):
        return {k: (tuple(v.shape), np.dtype(str(v.dtype).split(".")[-1]))
                for k, v in checkpoint_arrays(self.model, self.opt).items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in checkpoint_arrays(self.model, self.opt).items()}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        apply_checkpoint(arrays, self.model, self.opt)

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
        return probe_lib.collect(self.model, self.px, self.py, step)

    def snapshot(self):
        return dict(tree_flatten(self.model.parameters()))

    def update_stats(self, step: int, before) -> list[dict]:
        return probe_lib.update_stats(step, before, self.snapshot())

    def weights(self) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in tree_flatten(self.model.parameters())}
