"""Probes against an independent recomputation: a numpy float64 forward written here from the
weights exported with tree_flatten, and float64 torch autograd for the gradient probes."""

from __future__ import annotations

import math
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlx_gpt import engine as probes
from mlx_gpt.model import GPT, ModelArgs, init_weights
from qkstudy import probe_registry
from qkstudy.probes import kurtosis, outlier_share, update_ratios

DOCS = Path(__file__).resolve().parents[1] / "docs" / "probes.md"
EPS = 1e-5
RTOL, ATOL = 1e-4, 1e-7
ARGS = {"vocab_size": 256, "depth": 2, "d_model": 32, "n_heads": 2, "block_size": 32}
GROUPS = {"wte", "wpe", "attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "ln", "qk_norm"}


def make_model(qk_norm: str = "none", bias: bool = False, qkv_scale: float = 10.0,
               seed: int = 0, attn_softcap: float = 0.0) -> GPT:
    """A tiny model with peaked attention (scaled q/k/v weights) and gains and biases moved off
    1 and 0, so every term of every probe matters."""
    model = GPT(ModelArgs(**ARGS, bias=bias, qk_norm=qk_norm, attn_softcap=attn_softcap))
    init_weights(model, seed)
    rng = np.random.default_rng(seed + 1)

    def moved(name: str, p: mx.array) -> mx.array:
        if p.ndim == 1:  # gains off 1, biases off 0
            base = float(name.endswith("weight"))
            return mx.array((base + 0.3 * rng.standard_normal(p.shape)).astype(np.float32))
        return p * qkv_scale if name.endswith("attn.qkv.weight") else p

    model.update(tree_unflatten([(n, moved(n, p)) for n, p in tree_flatten(model.parameters())]))
    mx.eval(model.parameters())
    return model


def make_batch(seed: int = 0, B: int = 4, T: int = 32) -> tuple[mx.array, mx.array]:
    tokens = np.random.default_rng(seed).integers(0, ARGS["vocab_size"], (B, T + 1)).astype(np.int32)
    return mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:])


def weights64(model: GPT) -> dict[str, np.ndarray]:
    return {name: np.array(p, dtype=np.float64) for name, p in tree_flatten(model.parameters())}


def by_key(rows: list[dict]) -> dict[tuple, float]:
    """(layer, name), or (layer, name, head) for a per-head probe's rows -> value."""
    keyed = {(r["layer"], r["name"], *([] if r["head"] is None else [r["head"]])): r["value"]
             for r in rows}
    assert len(keyed) == len(rows), "duplicate (layer, name, head) in one probe call"
    assert all((r["head"] is not None) == probe_registry.PROBES[r["name"].split("/")[0]].per_head
               for r in rows)
    return keyed


# --- the independent numpy forward ---------------------------------------------------------------

erf = np.vectorize(math.erf)


def np_layer_norm(x, w, b=None):
    mu = x.mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS) * w
    return out if b is None else out + b


def np_rms_norm(x, w):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + EPS) * w


def np_linear(x, P, name):
    out = x @ P[f"{name}.weight"].T
    return out + P[f"{name}.bias"] if f"{name}.bias" in P else out


def np_forward(P: dict, qk_norm: str, x: np.ndarray, y: np.ndarray) -> dict:
    """nanoGPT forward in float64: per-layer attention internals and residuals, output logits."""
    B, T = x.shape
    C, nh = ARGS["d_model"], ARGS["n_heads"]
    hs = C // nh
    causal = np.tril(np.ones((T, T), dtype=bool))
    h = P["wte.weight"][x] + P["wpe.weight"][:T]
    layers = []
    for i in range(ARGS["depth"]):
        pre = f"blocks.{i}."
        a = np_layer_norm(h, P[pre + "ln1.weight"], P.get(pre + "ln1.bias"))
        qkv = np_linear(a, P, pre + "attn.qkv")
        q, k, v = (t.reshape(B, T, nh, hs).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
        norm = {"none": lambda t, w: t, "rmsnorm": np_rms_norm, "layernorm": np_layer_norm}[qk_norm]
        qn = norm(q, P.get(pre + "attn.q_norm.weight"))
        kn = norm(k, P.get(pre + "attn.k_norm.weight"))
        logits = np.where(causal, qn @ kn.transpose(0, 1, 3, 2) / math.sqrt(hs), -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        h = h + np_linear((p @ v).transpose(0, 2, 1, 3).reshape(B, T, C), P, pre + "attn.proj")
        m = np_linear(np_layer_norm(h, P[pre + "ln2.weight"], P.get(pre + "ln2.bias")), P,
                      pre + "mlp.fc")
        h = h + np_linear(0.5 * m * (1.0 + erf(m / math.sqrt(2.0))), P, pre + "mlp.proj")
        layers.append({"logits": logits, "p": p, "q": q, "k": k, "qn": qn, "kn": kn,
                       "residual": h})
    z = np_layer_norm(h, P["ln_f.weight"], P.get("ln_f.bias")) @ P["wte.weight"].T
    zmax = z.max(-1, keepdims=True)
    lse = (zmax + np.log(np.exp(z - zmax).sum(-1, keepdims=True)))[..., 0]
    loss = np.mean(lse - np.take_along_axis(z, y[..., None], -1)[..., 0])
    return {"layers": layers, "output_logits": z, "logsumexp": lse, "loss": loss}


def np_expected_forward(P: dict, qk_norm: str, x: np.ndarray, y: np.ndarray) -> dict:
    """Every forward probe, recomputed in numpy from the formulas in docs/probes.md."""
    out = np_forward(P, qk_norm, x, y)
    hs = ARGS["d_model"] // ARGS["n_heads"]
    expected = {}
    for i, L in enumerate(out["layers"]):
        p = L["p"]
        entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
        per_head = entropy.mean(axis=(0, 2))
        r = L["residual"]
        centred = r - r.mean()
        std = np.sqrt((centred**2).mean())
        expected |= {
            (i, "max_attention_logit"): L["logits"][np.isfinite(L["logits"])].max(),
            (i, "attention_entropy_mean"): per_head.mean(),
            (i, "attention_entropy_min_head"): per_head.min(),
            **{(i, "attention_sink_share", h): p[:, h, :, 0].mean() for h in range(p.shape[1])},
            (i, "q_rms"): np.sqrt(np.mean(L["q"] ** 2)),
            (i, "k_rms"): np.sqrt(np.mean(L["k"] ** 2)),
            (i, "residual_rms"): np.sqrt(np.mean(r**2)),
            (i, "residual_kurtosis"): np.mean(centred**4) / std**4,
            (i, "residual_max_abs_over_rms"): np.abs(r).max() / np.sqrt(np.mean(r**2)),
            (i, "residual_outlier_share"): np.mean(np.abs(centred) > 6 * std),
        }
        if qk_norm != "none":
            gq = np.abs(P[f"blocks.{i}.attn.q_norm.weight"]).max()
            gk = np.abs(P[f"blocks.{i}.attn.k_norm.weight"]).max()
            expected |= {
                (i, "q_rms_normed"): np.sqrt(np.mean(L["qn"] ** 2)),
                (i, "k_rms_normed"): np.sqrt(np.mean(L["kn"] ** 2)),
                (i, "q_norm_gain_max_abs"): gq,
                (i, "k_norm_gain_max_abs"): gk,
                (i, "max_attention_logit_bound"): gq * gk * math.sqrt(hs),
            }
    expected |= {
        (-1, "loss"): out["loss"],
        (-1, "output_logit_max"): out["output_logits"].max(),
        (-1, "output_logsumexp_mean"): out["logsumexp"].mean(),
    }
    return expected


def torch_gradients(P: dict, qk_norm: str, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean cross-entropy by float64 torch autograd (nothing shared with MLX)."""
    import torch
    import torch.nn.functional as F

    T = {name: torch.tensor(a, requires_grad=True) for name, a in P.items()}
    xt, yt = torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)
    B, S = xt.shape
    C, nh = ARGS["d_model"], ARGS["n_heads"]
    hs = C // nh
    h = T["wte.weight"][xt] + T["wpe.weight"][:S]
    for i in range(ARGS["depth"]):
        pre = f"blocks.{i}."
        a = F.layer_norm(h, (C,), T[pre + "ln1.weight"], T.get(pre + "ln1.bias"), EPS)
        qkv = F.linear(a, T[pre + "attn.qkv.weight"], T.get(pre + "attn.qkv.bias"))
        q, k, v = (t.view(B, S, nh, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        if qk_norm == "rmsnorm":
            q = F.rms_norm(q, (hs,), T[pre + "attn.q_norm.weight"], EPS)
            k = F.rms_norm(k, (hs,), T[pre + "attn.k_norm.weight"], EPS)
        elif qk_norm == "layernorm":
            q = F.layer_norm(q, (hs,), T[pre + "attn.q_norm.weight"], None, EPS)
            k = F.layer_norm(k, (hs,), T[pre + "attn.k_norm.weight"], None, EPS)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + F.linear(att.transpose(1, 2).reshape(B, S, C), T[pre + "attn.proj.weight"],
                         T.get(pre + "attn.proj.bias"))
        m = F.linear(F.layer_norm(h, (C,), T[pre + "ln2.weight"], T.get(pre + "ln2.bias"), EPS),
                     T[pre + "mlp.fc.weight"], T.get(pre + "mlp.fc.bias"))
        h = h + F.linear(F.gelu(m), T[pre + "mlp.proj.weight"], T.get(pre + "mlp.proj.bias"))
    z = F.layer_norm(h, (C,), T["ln_f.weight"], T.get("ln_f.bias"), EPS) @ T["wte.weight"].T
    loss = F.cross_entropy(z.reshape(B * S, -1), yt.reshape(-1))
    loss.backward()
    return {name: t.grad.numpy() for name, t in T.items()}


def np_group_rms(arrays: dict[str, np.ndarray]) -> dict[tuple[int, str], float]:
    """sqrt(sum of squares / count) per (layer, group) and pooled over layers (layer -1)."""
    totals: dict[tuple[int, str], list[float]] = {}
    for name, a in arrays.items():
        group, layer = probe_registry.parameter_group(name)
        for key in {(layer, group), (-1, group)}:
            entry = totals.setdefault(key, [0.0, 0])
            entry[0] += float(np.sum(a.astype(np.float64) ** 2))
            entry[1] += a.size
    return {key: math.sqrt(s / n) for key, (s, n) in totals.items()}


def assert_rows_match(actual: dict, expected: dict) -> None:
    assert set(actual) == set(expected), set(actual) ^ set(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, rel=RTOL, abs=ATOL), key


# --- probes against the recomputation ------------------------------------------------------------

@pytest.mark.parametrize("qk_norm,bias", [("none", False), ("rmsnorm", True), ("layernorm", False)])
def test_measure_matches_independent_recomputation(qk_norm, bias):
    model = make_model(qk_norm, bias=bias)
    x, y = make_batch()
    P = weights64(model)
    xn, yn = np.array(x), np.array(y)
    rows = probes.collect(model, x, y, step=7)
    assert {r["step"] for r in rows} == {7}
    actual = by_key(rows)

    expected = np_expected_forward(P, qk_norm, xn, yn)
    grads = torch_gradients(P, qk_norm, xn, yn)
    expected[(-1, "grad_norm")] = math.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
    for prefix, arrays in (("grad_rms", grads), ("param_rms", P)):
        expected |= {(layer, f"{prefix}/{group}"): v
                     for (layer, group), v in np_group_rms(arrays).items()}
    assert_rows_match(actual, expected)
    # the attention is peaked enough that the entropy and logit probes are not trivially uniform
    T = x.shape[1]
    assert actual[(0, "attention_entropy_mean")] < 0.9 * np.mean(np.log(np.arange(1, T + 1)))
    # the probe forward is the model's forward
    assert actual[(-1, "loss")] == pytest.approx(model.loss(model(x), y)[1].item(), rel=1e-5)


def test_update_stats_matches_numpy():
    model = make_model("rmsnorm")
    before = dict(tree_flatten(model.parameters()))
    rng = np.random.default_rng(3)
    after = {name: p + mx.array((rng.uniform(1e-4, 1e-1) * rng.standard_normal(p.shape))
                                .astype(np.float32)) for name, p in before.items()}
    rows = update_ratios(12, before, after, probes.PROBE_OPS)
    assert {r["step"] for r in rows} == {12}
    B = {k: np.array(v, dtype=np.float64) for k, v in before.items()}
    A = {k: np.array(v, dtype=np.float64) for k, v in after.items()}
    update = np_group_rms({k: A[k] - B[k] for k in B})
    param = np_group_rms(B)
    expected = {(layer, f"update_rms_ratio/{group}"): update[(layer, group)] / param[(layer, group)]
                for layer, group in update}
    # 8 groups pooled + 6 per block for depth 2
    assert len(expected) == 8 + 6 * ARGS["depth"]
    assert_rows_match(by_key(rows), expected)


def test_parameter_groups():
    assert probe_registry.parameter_group("wte.weight") == ("wte", -1)
    assert probe_registry.parameter_group("wpe.weight") == ("wpe", -1)
    assert probe_registry.parameter_group("ln_f.bias") == ("ln", -1)
    assert probe_registry.parameter_group("blocks.11.ln2.weight") == ("ln", 11)
    assert probe_registry.parameter_group("blocks.3.attn.qkv.weight") == ("attn.qkv", 3)
    assert probe_registry.parameter_group("blocks.3.attn.proj.bias") == ("attn.proj", 3)
    assert probe_registry.parameter_group("blocks.0.attn.k_norm.weight") == ("qk_norm", 0)
    assert probe_registry.parameter_group("blocks.0.mlp.fc.weight") == ("mlp.fc", 0)
    assert probe_registry.parameter_group("blocks.0.mlp.proj.weight") == ("mlp.proj", 0)
    names = [n for n, _ in tree_flatten(make_model("rmsnorm", bias=True).parameters())]
    assert {probe_registry.parameter_group(n)[0] for n in names} == GROUPS


# --- properties with known answers ---------------------------------------------------------------

@pytest.mark.parametrize("qk_norm", ["none", "rmsnorm", "layernorm"])
def test_uniform_causal_attention_entropy(qk_norm):
    """Zero q and k weights give uniform attention over the t+1 visible keys: entropy ln(t+1)."""
    model = make_model(qk_norm)
    C = ARGS["d_model"]
    for block in model.blocks:
        w = block.attn.qkv.weight
        block.attn.qkv.weight = mx.concatenate([mx.zeros((2 * C, C)), w[2 * C:]], axis=0)
    x, y = make_batch()
    rows = by_key(probes.collect(model, x, y, 0))
    T = x.shape[1]
    expected = float(np.mean(np.log(np.arange(1, T + 1))))
    for layer in range(ARGS["depth"]):
        assert rows[(layer, "attention_entropy_mean")] == pytest.approx(expected, rel=1e-5)
        assert rows[(layer, "attention_entropy_min_head")] == pytest.approx(expected, rel=1e-5)
        assert rows[(layer, "max_attention_logit")] == 0.0


def test_kurtosis_and_outliers_of_known_distributions():
    ops = probes.PROBE_OPS
    gaussian = mx.random.normal((1_000_000,), key=mx.random.key(0))
    assert kurtosis(gaussian, ops).item() == pytest.approx(3.0, abs=0.03)  # sd ~ sqrt(24/n)
    assert kurtosis(3.0 * gaussian + 5.0, ops).item() == pytest.approx(3.0, abs=0.03)
    uniform = mx.random.uniform(shape=(1_000_000,), key=mx.random.key(1))
    assert kurtosis(uniform, ops).item() == pytest.approx(1.8, abs=0.01)
    assert outlier_share(gaussian, ops).item() == 0.0  # P(|z| > 6) ~ 2e-9
    spiked = mx.concatenate([gaussian, mx.full((10,), 1e3)])
    assert outlier_share(spiked, ops).item() == pytest.approx(10 / spiked.size, rel=1e-3)


@pytest.mark.parametrize("qk_norm", ["rmsnorm", "layernorm"])
def test_max_attention_logit_respects_qk_norm_bound(qk_norm):
    """With QK-norm, |logit| <= max|g_q| max|g_k| sqrt(head_dim), however large q and k are."""
    model = make_model(qk_norm, qkv_scale=100.0)
    rng = np.random.default_rng(5)
    for block in model.blocks:  # large, uneven gains of both signs
        for norm in (block.attn.q_norm, block.attn.k_norm):
            norm.weight = mx.array(rng.normal(0.0, 3.0, norm.weight.shape).astype(np.float32))
    for seed in range(3):
        x, y = make_batch(seed)
        rows = by_key(probes.collect(model, x, y, 0))
        P = weights64(model)
        raw = np_forward(P, "none", np.array(x), np.array(y))  # the same q, k without the norm
        hs = ARGS["d_model"] // ARGS["n_heads"]
        for layer in range(ARGS["depth"]):
            bound = rows[(layer, "max_attention_logit_bound")]
            gq = np.abs(P[f"blocks.{layer}.attn.q_norm.weight"]).max()
            gk = np.abs(P[f"blocks.{layer}.attn.k_norm.weight"]).max()
            assert bound == pytest.approx(gq * gk * math.sqrt(hs), rel=1e-6)
            assert rows[(layer, "max_attention_logit")] <= bound
            assert rows[(layer, "max_attention_logit")] > 0.05 * bound  # the bound is not vacuous
        # without the norm the first layer's logits would break the bound
        assert raw["layers"][0]["logits"].max() > 2 * rows[(0, "max_attention_logit_bound")]


def documented_names() -> set[str]:
    """Row names: the first column of the docs/probes.md tables headed `| name | layer |`."""
    names, in_table = set(), False
    for line in DOCS.read_text().splitlines():
        if line.startswith("| name | layer |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and (match := re.match(r"^\| `([^`]+)` \|", line)):
            names.add(match.group(1))
    return names


def row_name_pattern(name: str) -> str:
    return name.split("/")[0] + "/<group>" if "/" in name else name


def test_documented_names_are_exactly_the_written_ones():
    written = set()
    for qk_norm, cap in (("none", 0.0), ("rmsnorm", 0.0), ("none", 5.0)):
        model = make_model(qk_norm, attn_softcap=cap)
        x, y = make_batch()
        params = dict(tree_flatten(model.parameters()))
        rows = probes.collect(model, x, y, 0) + update_ratios(0, params, params, probes.PROBE_OPS)
        written |= {row_name_pattern(r["name"]) for r in rows}
        groups = {r["name"].split("/")[1] for r in rows if "/" in r["name"]}
        assert groups == GROUPS - ({"qk_norm"} if qk_norm == "none" else set())
    assert written == documented_names()
    assert all(f"`{group}`" in DOCS.read_text() for group in GROUPS)


@pytest.mark.parametrize("qk_norm, softcap", [("none", 0.0), ("rmsnorm", 0.0), ("l2norm", 0.0),
                                               ("none", 5.0)])
def test_every_probe_either_engine_writes_is_in_the_registry(qk_norm, softcap):
    """The probe registry (qkstudy/probe_registry.py) is the one list the analysis reduces and the
    docs describe: a probe an engine writes outside it would be reduced by a default."""
    import torch

    from torch_ref.model import GPT as TorchGPT
    from torch_ref.engine import collect as torch_collect

    model = make_model(qk_norm, attn_softcap=softcap)
    twin = TorchGPT(model.args)
    twin.load_state_dict({n: torch.from_numpy(np.array(v)) for n, v in tree_flatten(model.parameters())})
    x, y = make_batch()
    names = {r["name"] for r in probes.collect(model, x, y, 0)}
    assert names == {r["name"] for r in torch_collect(
        twin, *(torch.from_numpy(np.array(a)).long() for a in (x, y)), 0)}
    assert [n for n in names if probe_registry.PROBES.get(n.split("/", 1)[0]) is None] == []
