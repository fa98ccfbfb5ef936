"""The MLX model and its updates: the QK-norm arms share every other weight, the parameter
count, per-head RMSNorm, AdamW against a hand-computed step, weight decay and clipping."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_gpt.engine import make_optimizer, update
from mlx_gpt.model import GPT, ModelArgs, init_weights
from qkstudy.config import TrainConfig
from qkstudy.parameters import count_params


def test_qk_norm_arms_share_every_other_weight():
    kwargs = dict(vocab_size=257, depth=2, d_model=32, n_heads=2, block_size=16)
    off, on = GPT(ModelArgs(**kwargs)), GPT(ModelArgs(**kwargs, qk_norm="rmsnorm"))
    init_weights(off, 3)
    init_weights(on, 3)
    off_params, on_params = dict(tree_flatten(off.parameters())), dict(tree_flatten(on.parameters()))
    assert set(on_params) - set(off_params) == {
        f"blocks.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    for name, p in off_params.items():
        assert mx.array_equal(p, on_params[name]).item(), name
    idx = mx.array(np.random.default_rng(0).integers(0, 257, (2, 16)), dtype=mx.int32)
    assert off(idx).shape == (2, 16, 320)  # vocabulary padded to a multiple of 64


def test_param_count_formula():
    model = GPT(ModelArgs(vocab_size=50257, depth=6, d_model=192, n_heads=3, block_size=256))
    d = 192
    per_block = 12 * d * d + 2 * d  # qkv + proj + fc + proj, two LayerNorm gains (no bias)
    expected = 50304 * d + 256 * d + 6 * per_block + d
    assert count_params(model.args)["total"] == expected


def test_rmsnorm_qk_norm_normalises_each_head():
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=32, n_heads=2, block_size=8,
                          qk_norm="rmsnorm"))
    init_weights(model, 0)
    x = mx.random.normal((2, 8, 32), key=mx.random.key(1)) * 5
    attn = model.blocks[0].attn
    q, k = attn.normed(*attn.heads(x)[:2])
    rms = mx.sqrt(mx.mean(q * q, axis=-1))
    assert mx.allclose(rms, mx.ones_like(rms), atol=1e-3).item()
    assert q.shape == (2, 2, 8, 16)


def test_adamw_matches_hand_computed_step():
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=1000, weight_decay=0.5, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    grads = {k: np.full(v.shape, 0.5, np.float32) for k, v in before.items()}
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    norm, used = update(opt, model, tree_unflatten([(k, mx.array(v)) for k, v in grads.items()]),
                        cfg.grad_clip)
    assert norm.item() == pytest.approx(0.5 * math.sqrt(sum(v.size for v in grads.values())))
    assert used.item() == pytest.approx(0.1)
    after = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    lr = 0.1  # step 0 of a cosine with no warmup
    for name, p in before.items():
        # first bias-corrected Adam step is g / (|g| + eps) = ~1; decay only for matrices
        expected = p * (1 - lr * 0.5 if p.ndim >= 2 else 1.0) - lr * 0.5 / (0.5 + 1e-8)
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_independent_weight_decay_is_not_scaled_by_lr():
    cfg = TrainConfig(lr=1e-3, warmup_steps=0, max_steps=1000, weight_decay=0.1,
                      independent_wd=True, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    w = np.array(model.wte.weight)
    opt = make_optimizer(cfg, model.parameters())
    zeros = {k: mx.zeros_like(v) for k, v in tree_flatten(model.parameters())}
    from mlx.utils import tree_unflatten
    update(opt, model, tree_unflatten(list(zeros.items())), cfg.grad_clip)
    np.testing.assert_allclose(np.array(model.wte.weight), w * (1 - 0.1), rtol=1e-6)


# Every parameter with ndim >= 2 decays (as nanoGPT): both embeddings (wte is also the tied
# output head) and the linear weights; gains and biases (QK-norm gains included) do not.
DECAYED = ["wte.weight", "wpe.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
           "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight"]


def test_weight_decay_hits_exactly_the_embeddings_and_linear_weights():
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=1000, weight_decay=0.5, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4, bias=True,
                          qk_norm="layernorm"))
    init_weights(model, 0)
    before = dict(tree_flatten(model.parameters()))
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    update(opt, model, tree_unflatten([(k, mx.zeros_like(v)) for k, v in before.items()]), 0.0)
    after = dict(tree_flatten(model.parameters()))  # zero gradients: only the decay moves
    moved = [k for k in before if not mx.array_equal(before[k], after[k]).item()]
    assert moved == DECAYED
    for name in DECAYED:
        np.testing.assert_allclose(np.array(after[name]), np.array(before[name]) * 0.95, rtol=1e-6)
    # the first AdamW group (weight_decay > 0) holds exactly these parameters' moments
    assert sorted(k.rsplit(".", 1)[0] for k, _ in tree_flatten(opt.state["states"][0])
                  if k.endswith(".m")) == sorted(DECAYED)


@pytest.mark.parametrize("grad_clip, scale", [(1.0, 1.0 / (6.0 + 1e-6)), (0.0, 1.0), (10.0, 1.0)])
def test_clipping_scales_the_gradient_and_reports_the_norm_before(grad_clip, scale):
    """The first moment after one step is (1 - beta1) x the gradient actually used."""
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=10, grad_clip=grad_clip)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    params = tree_flatten(model.parameters())
    total = sum(v.size for _, v in params)
    grads = {k: mx.full(v.shape, 6.0 / math.sqrt(total)) for k, v in params}  # global norm 6
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    norm, _ = update(opt, model, tree_unflatten(list(grads.items())), grad_clip)
    assert norm.item() == pytest.approx(6.0, rel=1e-6)
    m = np.array(opt.state["states"][0]["wte"]["weight"]["m"])
    np.testing.assert_allclose(m, 0.1 * scale * 6.0 / math.sqrt(total), rtol=1e-6)
