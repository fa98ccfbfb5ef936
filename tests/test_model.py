"""mlx_gpt.model: its fused attention against the written-out one, the rival logit controls, the
QK-norm variants of both engines."""

from __future__ import annotations

import dataclasses
import json
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_gpt.model import GPT, ModelArgs, init_weights
from qkstudy.config import TrainConfig, load_config, parse_train_config
from qkstudy.errors import UsageError

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
def test_fused_and_written_out_attention_agree(qk_norm, bias):
    """mx.fast.scaled_dot_product_attention (no capture) and attention written out (a probe
    capture) give one loss, one set of logits and one gradient."""
    args = ModelArgs(vocab_size=257, depth=2, d_model=64, n_heads=4, block_size=32, bias=bias,
                     qk_norm=qk_norm)
    model = sharpened(GPT(args), 1)
    rng = np.random.default_rng(0)
    x, y = (mx.array(rng.integers(0, 257, (4, 32)), dtype=mx.int32) for _ in range(2))

    results = {}
    for name in ("fused", "written"):
        def forward(m: GPT, a: mx.array, written: bool = name == "written") -> mx.array:
            return m(a, [] if written else None)  # a capture list writes attention out

        loss, grads = nn.value_and_grad(model, lambda m, a, b: m.loss(forward(m, a), b)[1])(
            model, x, y)
        logits = forward(model, x)
        mx.eval(loss, grads, logits)
        results[name] = loss, dict(tree_flatten(grads)), logits
    (loss_w, grads_w, logits_w), (loss_f, grads_f, logits_f) = results["written"], results["fused"]
    assert 3.0 < loss_f.item() < 30.0  # a real, far-from-trivial loss
    assert abs(loss_w.item() - loss_f.item()) <= LOSS_RTOL * abs(loss_f.item())
    assert relative(logits_w, logits_f) <= 1e-5
    worst = max(grads_f, key=lambda k: relative(grads_w[k], grads_f[k]))
    assert relative(grads_w[worst], grads_f[worst]) <= GRAD_RTOL, worst


# --- rival logit controls: attention soft-cap and z-loss -------------------------------------

def test_softcap_bounds_every_attention_logit_by_c():
    """C*tanh(logit/C): every logit the softmax sees lies within (-C, C), however large the raw
    logit; small logits pass nearly unchanged. The sharpened model's raw logits exceed C, so
    the bound is not met by chance."""
    from mlx_gpt import engine as probes

    cap = 1.0
    args = ModelArgs(vocab_size=257, depth=2, d_model=64, n_heads=4, block_size=32,
                     attn_softcap=cap)
    model = sharpened(GPT(args), 2)
    raw = mx.concatenate([mx.linspace(-1e6, 1e6, 10001), mx.linspace(-30, 30, 10001)])
    capped = model.blocks[0].attn.capped(raw)
    assert mx.max(mx.abs(capped)).item() <= cap
    assert mx.all(capped[1:10001] >= capped[:10000]).item()  # monotone: order is kept
    small = mx.array([1e-3, -0.01, 0.03])
    assert np.allclose(model.blocks[0].attn.capped(small), small, rtol=1e-3)

    rng = np.random.default_rng(0)
    x, y = (mx.array(rng.integers(0, 257, (4, 32)), dtype=mx.int32) for _ in range(2))
    rows = {(r["layer"], r["name"]): r["value"] for r in probes.collect(model, x, y, 0)}
    for layer in range(args.depth):
        assert rows[(layer, "max_attention_logit")] > 2 * cap  # before the cap
        assert rows[(layer, "max_attention_logit_capped")] <= cap  # after it
    captures: list[dict] = []
    model(x, captures)  # every logit the softmax sees, not only the max, is within the cap
    assert all(mx.max(mx.abs(c["capped"])).item() <= cap for c in captures)
    uncapped = GPT(dataclasses.replace(args, attn_softcap=0.0))
    uncapped.update(model.parameters())
    assert relative(model(x), uncapped(x)) > 1e-2  # the cap changes the model's output


def test_z_loss_adds_the_hand_derived_gradient_to_the_output_logits():
    """d/dz_i of W * mean_n lse_n^2 is W * 2 lse_n softmax(z_n)_i / N for position n's logits:
    the objective's gradient is the cross-entropy's plus exactly that; the loss is unchanged."""
    weight = 1e-2
    args = ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2)
    with_z, without = GPT(dataclasses.replace(args, z_loss=weight)), GPT(args)
    rng = np.random.default_rng(3)
    logits = mx.array(rng.normal(0, 4, (2, 5, 64)).astype(np.float32))
    targets = mx.array(rng.integers(0, 64, (2, 5)), dtype=mx.int32)
    total, ce, z = with_z.loss(logits, targets)
    lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))  # (2, 5)
    assert ce.item() == pytest.approx(without.loss(logits, targets)[0].item(), rel=1e-6)
    assert without.loss(logits, targets)[2].item() == 0.0
    assert z.item() == pytest.approx(weight * np.mean(lse ** 2), rel=1e-5)
    assert total.item() == pytest.approx(ce.item() + z.item(), rel=1e-6)

    g_total = mx.grad(lambda a: with_z.loss(a, targets)[0])(logits)
    g_ce = mx.grad(lambda a: without.loss(a, targets)[0])(logits)
    n = lse.size
    softmax = np.exp(np.asarray(logits, np.float64) - lse[..., None])
    by_hand = weight * 2 * lse[..., None] * softmax / n
    assert np.abs(by_hand).max() > 1e-4  # a visible change, not rounding
    np.testing.assert_allclose(np.asarray(g_total - g_ce), by_hand, rtol=1e-4, atol=1e-8)


def test_rival_keys_validate_and_leave_old_run_ids_alone(tmp_path):
    # attn_softcap, z_loss, backend and precision are left out of the identity at their
    # values of the runs made before they existed, so those run ids stay
    assert TrainConfig().run_id == "d4-noqk-lr0.003-s0-25c494c633"
    old = tmp_path / "config.json"
    old.write_text(json.dumps({k: v for k, v in TrainConfig(backend="mlx").identity().items()
                               if k not in ("attn_softcap", "z_loss")}))
    assert load_config(str(old)).run_id == "d4-noqk-lr0.003-s0-25c494c633"
    # a config.json may hold "kernels" (MLX's CPU kernels, a setting this version lacks)
    old.write_text(json.dumps({**TrainConfig(backend="mlx").identity(), "kernels": "cpu"}))
    assert load_config(str(old)).run_id == "d4-noqk-lr0.003-s0-25c494c633"
    with pytest.raises(UsageError, match="unknown key 'kernels'"):
        parse_train_config(["kernels=cpu"])
    torch_run = TrainConfig(backend="torch", device="cuda", precision="bf16")
    assert torch_run.run_id.startswith("d4-noqk-torch-bf16-lr0.003-s0-")
    assert {"backend", "device", "precision"} <= torch_run.identity().keys()
    assert "compile" not in TrainConfig(backend="torch", compile=True).identity()
    with pytest.raises(UsageError, match="options of backend=torch"):
        TrainConfig(device="cuda").validate()
    capped, z = TrainConfig(attn_softcap=50), TrainConfig(z_loss=1e-4)
    assert capped.run_id.startswith("d4-noqk-softcap50-lr0.003-s0-")
    assert z.run_id.startswith("d4-noqk-zloss1e-4-lr0.003-s0-")
    assert capped.identity()["attn_softcap"] == 50 and "attn_softcap" not in z.identity()
    for bad in ("attn_softcap=-1", "z_loss=nan", "z_loss=inf", "attn_softcap=-0.5"):
        with pytest.raises(UsageError, match="must be a finite number >= 0"):
            parse_train_config([bad])


@pytest.mark.parametrize("engine", ["mlx", "torch"])
def test_every_qk_norm_variant_is_implemented_by_each_engine_and_an_unknown_one_is_refused(engine):
    """The config's choices are the registry's (qkstudy/variants.py); each engine builds every
    row with the parameters the core names; an unknown kind is refused in one line."""
    from typing import get_args

    from qkstudy.config import ModelArgs, QKNorm
    from qkstudy.parameters import parameter_shapes
    from qkstudy.variants import VARIANTS

    model = pytest.importorskip({"mlx": "mlx_gpt.model", "torch": "torch_ref.model"}[engine])
    assert get_args(QKNorm) == ("none", *VARIANTS)
    assert {v.norm for v in VARIANTS.values()} == set(model.NORMS)
    for kind in VARIANTS:
        args = ModelArgs(vocab_size=257, depth=1, d_model=32, n_heads=2, block_size=16,
                         qk_norm=kind)
        gpt = model.GPT(args)
        names = ({n for n, _ in gpt.named_parameters()} if engine == "torch" else
                 {n for n, _ in __import__("mlx.utils").utils.tree_flatten(gpt.parameters())})
        assert names == set(parameter_shapes(args)), kind
    with pytest.raises(UsageError, match="qk_norm must be one of none, rmsnorm, layernorm, l2norm"):
        parse_train_config(["qk_norm=cosine"])


@pytest.mark.parametrize("engine", ["mlx", "torch"])
def test_a_variant_the_engine_lacks_is_refused_when_the_model_is_built(engine, monkeypatch):
    """A row whose norm the engine does not have, or that does not name the engine, is refused
    by GPT(...) in one line naming the variants the engine implements."""
    from qkstudy import variants

    model = pytest.importorskip({"mlx": "mlx_gpt.model", "torch": "torch_ref.model"}[engine])
    other = "torch" if engine == "mlx" else "mlx"
    monkeypatch.setitem(variants.VARIANTS, "cosine", variants.Variant(
        "cosine", "QK-norm on (cosine)", "#000000", variants.ENGINES, "cos"))
    monkeypatch.setitem(variants.VARIANTS, "elsewhere", variants.Variant(
        "elsewhere", "QK-norm on (elsewhere)", "#000000", (other,), "rms", gains=True))
    for kind in ("cosine", "elsewhere"):
        with pytest.raises(UsageError) as refused:
            model.GPT(ModelArgs(vocab_size=257, depth=1, d_model=32, n_heads=2, block_size=16,
                                qk_norm=kind))
        assert str(refused.value) == (f"qk_norm={kind} is not implemented by the {engine} "
                                      "engine; it implements: none, rmsnorm, layernorm, l2norm")


def test_rms_without_gains_trains_the_same_in_both_engines(monkeypatch):
    """A row with the rms norm and no gains: both engines build it and agree on its logits."""
    import torch

    from qkstudy import variants
    from torch_ref.model import GPT as TorchGPT

    monkeypatch.setitem(variants.VARIANTS, "rms-bare", variants.Variant(
        "rms-bare", "QK-norm on (rms, no gains)", "#000000", variants.ENGINES, "rms"))
    args = ModelArgs(vocab_size=257, depth=2, d_model=32, n_heads=2, block_size=16,
                     qk_norm="rms-bare")
    mlx_model = GPT(args)
    init_weights(mlx_model, 0)
    torch_model = TorchGPT(args)
    weights = dict(tree_flatten(mlx_model.parameters()))
    assert not any("norm" in name for name in weights)
    torch_model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    idx = np.random.default_rng(0).integers(0, 257, (2, 16))
    ours = np.array(mlx_model(mx.array(idx, dtype=mx.int32)))
    theirs = torch_model(torch.from_numpy(idx)).detach().numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ["mlx", "torch"])
def test_l2norm_logits_match_a_float64_reference_and_stay_within_the_probe_bound(engine):
    """Henry et al. (2020): q and k L2-normalised per head, logits g * cos(q, k) with g
    initialised to log2(L^2 - L); |logit| <= |g|, the bound the probes report."""
    import math

    import numpy as np

    from qkstudy.config import NORM_EPS, ModelArgs
    from qkstudy.parameters import initial_weights

    args = ModelArgs(vocab_size=257, depth=1, d_model=32, n_heads=2, block_size=16,
                     qk_norm="l2norm")
    w = initial_weights(args, 3)
    g = float(w["blocks.0.attn.qk_scale.weight"][0])
    assert g == pytest.approx(math.log2(16 * 16 - 16))
    x = np.random.default_rng(0).standard_normal((2, 16, 32))  # the attention's input
    qkv = x @ w["blocks.0.attn.qkv.weight"].astype(np.float64).T
    q, k = (a.reshape(2, 16, 2, 16).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, -1)[:2])
    unit = [a / np.sqrt((a ** 2).sum(-1, keepdims=True) + NORM_EPS) for a in (q, k)]
    expected = g * unit[0] @ unit[1].transpose(0, 1, 3, 2)
    capture: dict = {}
    if engine == "mlx":
        import mlx.core as mx

        from mlx_gpt.model import GPT
        model = GPT(args)
        model.load_weights([(n, mx.array(v)) for n, v in w.items()])
        model.blocks[0].attn(mx.array(x.astype(np.float32)), capture)
        got = np.array(capture["logits"])
    else:
        import torch

        from torch_ref.model import GPT
        model = GPT(args)
        model.load_state_dict({n: torch.from_numpy(v) for n, v in w.items()})
        with torch.no_grad():
            model.blocks[0].attn(torch.from_numpy(x.astype(np.float32)), capture)
        got = capture["logits"].numpy()
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    assert np.abs(got).max() <= g * (1 + 1e-6)
