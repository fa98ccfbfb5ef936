"""The two kernel paths of mlx_gpt.model (kernels=cpu and kernels=library) compute one function.

The library path (mx.fast.scaled_dot_product_attention, nn.gelu, nn.losses.cross_entropy) is
the one MLX runs on Apple GPUs; here it runs on the CPU device, against the CPU kernels."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_gpt.config import TrainConfig, parse_train_config
from mlx_gpt.errors import UsageError
from mlx_gpt.model import GPT, ModelArgs, init_weights, resolve_kernels
from mlx_gpt.train import model_args

LOSS_RTOL = 1e-6
GRAD_RTOL = 1e-5


def sharpened(model: GPT, seed: int) -> GPT:
    """Init weights scaled to unit-variance activations, vectors (gains, biases) moved off 1
    and 0: attention is sharp and GELU sees its whole range, so agreement is not an artefact of
    tiny activations."""
    init_weights(model, seed)
    key = mx.random.key(seed)
    model.update(tree_map(lambda p: p * (50 / math.sqrt(p.shape[1])) if p.ndim == 2
                          else p + 0.2 * mx.random.normal(p.shape, key=key), model.parameters()))
    return model


def relative(a: mx.array, b: mx.array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("qk_norm, bias", [("none", False), ("rmsnorm", True), ("layernorm", False)])
def test_cpu_and_library_kernels_agree(qk_norm, bias):
    args = ModelArgs(vocab_size=257, depth=2, d_model=64, n_heads=4, block_size=32, bias=bias,
                     qk_norm=qk_norm)
    cpu = GPT(dataclasses.replace(args, kernels="cpu"))
    library = GPT(dataclasses.replace(args, kernels="library"))
    assert (cpu.kernels, library.kernels) == ("cpu", "library")
    sharpened(cpu, 1)
    library.update(cpu.parameters())
    rng = np.random.default_rng(0)
    x, y = (mx.array(rng.integers(0, 257, (4, 32)), dtype=mx.int32) for _ in range(2))

    results = {}
    for name, model in (("cpu", cpu), ("library", library)):
        loss_and_grad = nn.value_and_grad(model, lambda m, a, b: m.loss(a, b))
        loss, grads = loss_and_grad(model, x, y)
        logits = model(x)
        mx.eval(loss, grads, logits)
        results[name] = loss, dict(tree_flatten(grads)), logits
    (loss_c, grads_c, logits_c), (loss_l, grads_l, logits_l) = results["cpu"], results["library"]
    assert 3.0 < loss_l.item() < 30.0  # a real, far-from-trivial loss
    assert abs(loss_c.item() - loss_l.item()) <= LOSS_RTOL * abs(loss_l.item())
    assert relative(logits_c, logits_l) <= 1e-5
    assert grads_c.keys() == grads_l.keys()
    worst = max(grads_l, key=lambda k: relative(grads_c[k], grads_l[k]))
    assert relative(grads_c[worst], grads_l[worst]) <= GRAD_RTOL, worst
    # and the two really are different computations (not one path twice)
    assert not mx.array_equal(logits_c, logits_l).item()


def test_kernels_resolve_once_and_never_change_the_run_id():
    assert resolve_kernels("auto") == "cpu"  # the test suite runs on MLX's CPU device
    assert GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2)).kernels == "cpu"
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve_kernels("metal")
    base = TrainConfig(depth=3, lr=1e-2)
    for kernels in ("library", "cpu"):
        cfg = parse_train_config([f"kernels={kernels}"], base)
        assert cfg.run_id == base.run_id and "kernels" not in cfg.identity()
        assert GPT(model_args(cfg, 64)).kernels == kernels
    with pytest.raises(UsageError, match="kernels must be one of"):
        parse_train_config(["kernels=metal"])


def test_training_on_either_kernel_path_gives_the_same_curve(tiny_cfg):
    """The whole trainer (compiled step, eval, probes) on each path: one run id, one curve."""
    from mlx_gpt.runlog import read_parts
    from mlx_gpt.train import run_dir_of, train

    curves = {}
    for kernels in ("cpu", "library"):
        cfg = tiny_cfg(kernels=kernels, sweep=kernels, max_steps=20, qk_norm="layernorm")
        assert train(cfg, verbose=False)["status"] == "completed"
        curves[kernels] = read_parts(run_dir_of(cfg) / "metrics").to_pydict()
    assert run_dir_of(tiny_cfg(kernels="cpu")).name == run_dir_of(tiny_cfg(kernels="library")).name
    cpu, library = curves["cpu"], curves["library"]
    assert cpu["step"] == library["step"]
    for column in ("train_loss", "val_loss"):
        pairs = [(a, b) for a, b in zip(cpu[column], library[column]) if b is not None]
        assert pairs and all(abs(a - b) <= 1e-5 * abs(b) for a, b in pairs), column
    assert library["train_loss"][-2] < library["train_loss"][0] - 0.5  # it trained
