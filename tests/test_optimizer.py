"""The optimizer's rule is the core's (qkstudy/optimizer.py), and both engines apply it: the same
learning rate at every update, the same parameters decayed by the same coefficient."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from qkstudy.config import TrainConfig, model_args
from qkstudy.optimizer import decay_coefficient, decays, learning_rates
from qkstudy.parameters import parameter_shapes

# warmup over 3 updates, the cosine over the next 9, then the floor
SCHEDULE = TrainConfig(lr=1e-2, warmup_steps=3, max_steps=12, min_lr_ratio=0.1, grad_clip=0.0)
# Every parameter with ndim >= 2 decays (as nanoGPT): both embeddings (wte is also the tied
# output head) and the linear weights; gains and biases (QK-norm gains included) do not.
MODEL = TrainConfig(depth=1, d_model=8, n_heads=2, block_size=4, bias=True, qk_norm="layernorm")
DECAYED = {"wte.weight", "wpe.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
           "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight"}


def _with_model(cfg: TrainConfig) -> TrainConfig:
    """`cfg`'s optimizer settings on MODEL's tiny model."""
    return dataclasses.replace(cfg, **{k: getattr(MODEL, k) for k in
                                       ("depth", "d_model", "n_heads", "block_size", "bias",
                                        "qk_norm")})


def test_learning_rates_warm_up_then_follow_the_cosine_to_the_floor():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    rates = learning_rates(cfg)
    assert rates.dtype == np.float32 and rates.shape == (111,)
    assert rates[0] == pytest.approx(1 / 11) and rates[9] == pytest.approx(10 / 11)
    assert rates[10] == pytest.approx(1.0)
    assert rates[60] == pytest.approx(0.55)  # halfway down the cosine to 0.1
    assert rates[109] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.99)))
    assert rates[110] == pytest.approx(0.1)
    assert np.all(np.diff(rates[:11]) > 0) and np.all(np.diff(rates[10:]) < 0)


def test_the_rule_decays_the_embeddings_and_linear_weights_only():
    shapes = parameter_shapes(model_args(MODEL, 64))
    assert {name for name, shape in shapes.items() if decays(name, shape)} == DECAYED
    assert decay_coefficient(MODEL) == MODEL.weight_decay
    independent = TrainConfig(lr=1e-3, weight_decay=0.1, independent_wd=True)
    assert decay_coefficient(independent) == pytest.approx(100.0)


def test_the_mlx_engine_applies_the_core_rule():
    pytest.importorskip("mlx")
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    from mlx_gpt.engine import build_model
    from mlx_gpt.engine import make_optimizer, update

    for cfg in (SCHEDULE, TrainConfig(lr=1e-3, weight_decay=0.1, independent_wd=True)):
        model = build_model(_with_model(cfg), 64)
        opt = make_optimizer(cfg, model.parameters())
        params = dict(tree_flatten(model.parameters()))
        zeros = tree_unflatten([(k, mx.zeros_like(v)) for k, v in params.items()])
        used = [update(opt, model, zeros, 0.0)[1].item() for _ in range(cfg.steps + 2)]
        assert used == learning_rates(cfg).tolist() + [learning_rates(cfg)[-1]]
        decay_group, other_group = opt.optimizers
        assert decay_group.weight_decay == pytest.approx(decay_coefficient(cfg))
        assert other_group.weight_decay == 0.0
        moments = {k.rsplit(".", 1)[0] for k, _ in tree_flatten(opt.state["states"][0])
                   if k.endswith(".m")}
        assert moments == DECAYED


def test_the_torch_engine_applies_the_core_rule():
    """The rates its Engine.step reports (from its device table) and applies (its groups')."""
    pytest.importorskip("torch")

    from torch_ref.engine import Engine

    batch = (np.zeros((1, 4), np.int64), np.ones((1, 4), np.int64))
    for cfg in (SCHEDULE, TrainConfig(lr=1e-3, weight_decay=0.1, independent_wd=True)):
        engine = Engine(dataclasses.replace(_with_model(cfg), device="cpu"), 64, [], batch)
        applied, reported = [], []
        for _ in range(cfg.steps + 2):
            applied.append(engine.opt.param_groups[0]["lr"])
            reported += [row[2] for row in engine.read([engine.step(*batch)])]
        rates = learning_rates(cfg).tolist()
        assert reported == rates + [rates[-1]]
        assert applied == pytest.approx(rates + [rates[-1]], rel=1e-7)
        names = {id(p): name for name, p in engine.model.named_parameters()}
        decay_group, other_group = engine.opt.param_groups
        assert {names[id(p)] for p in decay_group["params"]} == DECAYED
        assert decay_group["weight_decay"] == pytest.approx(decay_coefficient(cfg))
        assert other_group["weight_decay"] == 0.0
