"""torch_ref against mlx_gpt: parity, the optimizer, the initial weights, the rival controls."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mlx.utils import tree_flatten

from mlx_gpt.engine import build_model
from qkstudy.optimizer import learning_rates
from qkstudy.config import TrainConfig, model_args
from qkstudy.parameters import initial_weights
from torch_ref import engine as torch_optim
from torch_ref.model import GPT as TorchGPT

from crosscheck import parity
from crosscheck.__main__ import main


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models: one thread is as fast and does not spin against the other test workers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return parity.byte_tokens()


def assert_within(rows: list[parity.Deviation]) -> None:
    broken = [r for r in rows if not r.ok]
    assert not broken, "\n" + parity.format_table(broken)


@pytest.mark.needs_openblas("parity's tolerances hold on OpenBLAS; MLX's reference BLAS rounds "
                            "l2norm's grad_rms/qk_norm probe to 1.3e-4 of torch's")
@pytest.mark.parametrize("cfg", parity.step_cases(), ids=parity.case_name)
def test_logits_loss_gradients_probes_match(cfg, tokens):
    rows = parity.compare_step(cfg, tokens, 257)
    assert_within(rows)
    kinds = {r.quantity.split(" (")[0] for r in rows}
    assert {"logits", "loss", "gradients", "probes"} <= kinds
    # really two computations (a scalar loss may round to the same float32; a tensor does not)
    assert all(r.value > 0 for r in rows if r.quantity == "logits")


@pytest.mark.parametrize("cfg", parity.trajectory_cases(), ids=parity.case_name)
def test_fifty_step_trajectory_matches(cfg, tokens):
    assert_within(parity.compare_trajectory(cfg, tokens, 257))


def test_parity_detects_a_wrong_model(tokens, monkeypatch):
    """The tanh GELU (max error ~1e-3) instead of the exact one must break the tolerances."""
    from torch_ref.model import MLP

    monkeypatch.setattr(MLP, "forward",
                        lambda self, x: self.proj(F.gelu(self.fc(x), approximate="tanh")))
    cfg = dataclasses.replace(parity.BASE, depth=1)
    rows = parity.compare_step(cfg, tokens, 257)
    assert not next(r for r in rows if r.quantity == "logits").ok


def test_parity_steps_each_engine_as_training_does(tokens, monkeypatch):
    """A rate that only the torch engine's own step reads (its device table, one update
    ahead) must break the Engine.step row."""
    from torch_ref.engine import Engine

    real_init = Engine.__init__

    def one_ahead(self, *args):
        real_init(self, *args)
        self.lr_table = self.lr_table.roll(-1)

    monkeypatch.setattr(Engine, "__init__", one_ahead)
    rows = parity.compare_step(dataclasses.replace(parity.BASE, depth=1), tokens, 257)
    assert [r.quantity for r in rows if not r.ok] == ["Engine.step"]


def test_parity_cli_exits_nonzero_on_a_broken_tolerance(monkeypatch, capsys):
    broken = parity.Deviation("d1 none", "logits", "(1, 2, 3)", 3e-5, parity.LOGITS_RTOL)
    monkeypatch.setattr(parity, "run_all", lambda: [broken])
    assert main(["parity"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["parity", "extra"]) == 2


@pytest.mark.parametrize("independent_wd", [False, True])
def test_mlx_and_torch_adamw_agree_with_warmup_cosine_and_clipping(independent_wd):
    """mlx.optimizers.AdamW in its MultiOptimizer and torch.optim.AdamW with LambdaLR take the
    same steps from the same gradients: every parameter, the learning rate and the pre-clip
    norm, over a schedule that warms up and decays, clipping every other step."""
    from mlx import nn
    from mlx.utils import tree_unflatten

    from mlx_gpt import engine as mlx_optim
    from qkstudy.config import TrainConfig

    cfg = TrainConfig(lr=1e-2, warmup_steps=3, max_steps=12, grad_clip=3.0,
                      weight_decay=1e-3 if independent_wd else 0.1, independent_wd=independent_wd)
    rng = np.random.default_rng(0)
    shapes = {"w": (5, 4), "emb": (7, 4), "b": (4,)}
    start = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    ours = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in start.items()}
    opt, schedule = torch_optim.make_optimizer(cfg, ours)

    mlx_params = nn.Module()
    for k, v in start.items():
        setattr(mlx_params, k, mx.array(v))
    mlx_opt = mlx_optim.make_optimizer(cfg, mlx_params.parameters())
    clipped = 0
    for step in range(cfg.steps):
        scale = 1.0 if step % 2 else 0.3  # global norm ~7 (clipped to 3) or ~2 (not clipped)
        grads = {k: (scale * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
        for k in shapes:
            ours[k].grad = torch.from_numpy(grads[k].copy())
        lr = schedule.rate(schedule.updates)
        norm = torch_optim.clip_and_step(opt, schedule, cfg.grad_clip)
        mlx_norm, mlx_lr = mlx_optim.update(mlx_opt, mlx_params, tree_unflatten(
            [(k, mx.array(v)) for k, v in grads.items()]), cfg.grad_clip)
        clipped += norm.item() > cfg.grad_clip
        assert lr == pytest.approx(float(learning_rates(cfg)[step]), rel=1e-7)
        assert lr == pytest.approx(mlx_lr.item(), rel=1e-6)  # MLX: float32 cosine
        assert norm.item() == pytest.approx(mlx_norm.item(), rel=1e-6)
        for k in shapes:
            np.testing.assert_allclose(ours[k].detach().numpy(), np.array(mlx_params[k]),
                                       rtol=1e-6, atol=1e-7, err_msg=f"{k} at step {step}")
    assert 0 < clipped < cfg.steps  # clipping happened on some steps, not all
    for k in shapes:  # the parameters did move, so the comparison above was not vacuous
        assert np.abs(ours[k].detach().numpy() - start[k]).max() > 1e-3, k
    # the schedule reached its floor after the cosine
    assert schedule.rate(cfg.steps) == pytest.approx(cfg.lr * cfg.min_lr_ratio)


@pytest.mark.parametrize("grad_clip, expected", [(1.0, 1.0 * 6.0 / (6.0 + 1e-6)), (0.0, 6.0)])
def test_clipping_scales_to_the_clip_norm(grad_clip, expected):
    from qkstudy.config import TrainConfig

    cfg = TrainConfig(grad_clip=grad_clip)
    params = {"w": torch.nn.Parameter(torch.zeros(2, 2))}
    params["w"].grad = torch.full((2, 2), 3.0)  # norm 6
    opt, schedule = torch_optim.make_optimizer(cfg, params)
    norm = torch_optim.clip_and_step(opt, schedule, cfg.grad_clip)
    assert norm.item() == pytest.approx(6.0)
    assert params["w"].grad.norm().item() == pytest.approx(expected, rel=1e-6)


def test_both_frameworks_start_from_the_numpy_initial_weights_bit_for_bit():
    from torch_ref.engine import Engine as TorchEngine

    cfg = dataclasses.replace(TrainConfig(), depth=2, d_model=32, n_heads=2, block_size=16,
                              qk_norm="layernorm", bias=True, seed=7)
    expected = initial_weights(model_args(cfg, 257), cfg.seed)
    probe = (np.zeros((2, 16), np.int64), np.zeros((2, 16), np.int64))
    mlx_weights = {k: np.array(v) for k, v in tree_flatten(build_model(cfg, 257).parameters())}
    torch_cfg = dataclasses.replace(cfg, backend="torch", device="cpu")
    torch_weights = TorchEngine(torch_cfg, 257, [], probe).weights()
    assert mlx_weights.keys() == torch_weights.keys() == expected.keys()
    for name, value in expected.items():
        assert value.dtype == np.float32
        assert np.array_equal(mlx_weights[name], value) and np.array_equal(torch_weights[name], value)
    # the arms share every weight but the QK-norm gains; another seed draws other weights
    off = initial_weights(model_args(dataclasses.replace(cfg, qk_norm="none"), 257), cfg.seed)
    assert all(np.array_equal(off[k], expected[k]) for k in off)
    other = initial_weights(model_args(cfg, 257), cfg.seed + 1)
    assert not np.array_equal(other["wte.weight"], expected["wte.weight"])
    assert np.std(expected["blocks.0.attn.qkv.weight"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(expected["blocks.1.mlp.proj.weight"]) == pytest.approx(0.01, rel=0.05)


def test_torch_rival_controls_match_the_hand_derivation():
    """torch_ref's soft-cap bounds every logit by C; its z-loss adds W * 2 lse softmax / N to
    the gradient of the output logits, as mlx_gpt's does (tests/test_model.py)."""
    weight = 1e-2
    args = model_args(dataclasses.replace(parity.BASE, attn_softcap=2.0, z_loss=weight), 257)
    model = TorchGPT(args)
    attn = model.blocks[0].attn
    raw = torch.linspace(-1e5, 1e5, 20001)
    assert attn.capped(raw).abs().max().item() <= 2.0

    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(2, 5, 64, generator=gen, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, 64, (2, 5), generator=gen)
    total, ce, z = model.loss(logits, targets)
    (g_total,) = torch.autograd.grad(total, logits)
    (g_ce,) = torch.autograd.grad(F.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1)),
                                  logits)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True).detach()
    by_hand = weight * 2 * lse * torch.softmax(logits.detach(), dim=-1) / lse.numel()
    assert by_hand.abs().max() > 1e-4
    torch.testing.assert_close(g_total - g_ce, by_hand, rtol=1e-9, atol=1e-12)


def test_the_deterministic_engine_skips_nan_fills_and_trains_bit_identically_without_them():
    """Deterministic mode's NaN fill of new tensors is off (torch_ref/device.py): it only guards
    against kernels reading memory they did not write, and no kernel of this model does, so a
    run's weights are the same bit for bit with and without it."""
    import hashlib

    import torch

    from qkstudy import backends
    from qkstudy.batches import random_batch
    from qkstudy.config import TrainConfig

    def weights(fill: bool) -> str:
        cfg = TrainConfig(backend="torch", device="cpu", d_model=64, n_heads=2, depth=2,
                          block_size=32, batch_size=4, qk_norm="rmsnorm", lr=3e-2,
                          max_steps=20, warmup_steps=2).validate()
        probe = random_batch(cfg, 257, 1)
        engine = backends.load("torch").Engine(cfg, 257, [probe], probe)
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        torch.utils.deterministic.fill_uninitialized_memory = fill
        for i in range(6):
            engine.read([engine.step(*random_batch(cfg, 257, 10 + i))])
        digest = hashlib.sha256()
        for p in engine.model.parameters():
            digest.update(p.detach().numpy().tobytes())
        return digest.hexdigest()

    try:
        assert weights(True) == weights(False)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = False
