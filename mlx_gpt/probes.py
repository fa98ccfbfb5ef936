"""Mechanistic probes on a fixed probe batch, outside the hot train step.

`collect` runs one forward with intermediates and one backward on the probe batch; `update_stats`
compares the parameters before and after one update. Both return long rows
{"step", "layer", "name", "value"}: layer is the block index, or -1 for whole-model values and for
per-group values pooled over all layers. Per-parameter-group names carry the group after a slash
(`grad_rms/attn.qkv`). Every name, formula and source is in docs/probes.md.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

from qkstudy.probe_names import OUTLIER_SIGMAS, WHOLE_MODEL, parameter_group, probe_rows

from qkstudy.variants import VARIANTS

from .model import GPT, cross_entropy, objective_terms

# --- statistics (each a scalar array; shared by the probes and their tests) -----------------------

def rms(x: mx.array) -> mx.array:
    return mx.sqrt(mx.mean(mx.square(x.astype(mx.float32))))


def kurtosis(x: mx.array) -> mx.array:
    """Fourth standardised moment over all entries, E[(x-mu)^4] / E[(x-mu)^2]^2 (3 for a Gaussian)."""
    x = x.astype(mx.float32)
    centred = x - mx.mean(x)
    var = mx.mean(mx.square(centred))
    return mx.mean(mx.square(mx.square(centred))) / mx.square(var)


def outlier_share(x: mx.array, sigmas: float = OUTLIER_SIGMAS) -> mx.array:
    """Share of entries with |x - mean| > sigmas * std (std over all entries, ddof 0)."""
    x = x.astype(mx.float32)
    centred = x - mx.mean(x)
    std = mx.sqrt(mx.mean(mx.square(centred)))
    return mx.mean((mx.abs(centred) > sigmas * std).astype(mx.float32))


def attention_entropy(logits: mx.array, causal: mx.array) -> mx.array:
    """Entropy in nats of each query's attention distribution: (B, nh, T) from (B, nh, T, T)."""
    masked = mx.where(causal, logits, -mx.inf)
    log_p = masked - mx.logsumexp(masked, axis=-1, keepdims=True)
    return -mx.sum(mx.where(causal, mx.exp(log_p) * log_p, 0.0), axis=-1)


def attention_sink_share(logits: mx.array, causal: mx.array) -> mx.array:
    """Each head's attention probability on the first position, mean over the batch and the
    queries: (nh,) from (B, nh, T, T) logits."""
    masked = mx.where(causal, logits, -mx.inf)
    first = mx.exp(masked[..., 0] - mx.logsumexp(masked, axis=-1))  # (B, nh, T)
    return first.mean(axis=(0, 2))


def max_attention_logit_bound(q_gain: mx.array, k_gain: mx.array) -> mx.array:
    """Upper bound on |scaled logit| under QK-norm: max|g_q| * max|g_k| * sqrt(head_dim).

    Each normalised vector before its gain has norm <= sqrt(head_dim) (RMS 1 over head_dim
    entries; mean-centring only shrinks it), so |q.k| <= max|g_q| max|g_k| head_dim, and the
    softmax scale 1/sqrt(head_dim) leaves sqrt(head_dim).
    """
    head_dim = q_gain.shape[-1]
    return mx.max(mx.abs(q_gain)) * mx.max(mx.abs(k_gain)) * math.sqrt(head_dim)


# --- collect -------------------------------------------------------------------------------------

def layer_probes(layer: int, attn, c: dict) -> list[tuple[int, str, mx.array]]:
    """One block's forward probes from its capture (GPT.hidden), under stop_gradient."""
    logits, capped, q, k, qn, kn, residual = (mx.stop_gradient(c[n]) for n in (
        "logits", "capped", "q", "k", "q_normed", "k_normed", "residual"))
    causal = c["causal"]
    entropy_per_head = attention_entropy(capped, causal).mean(axis=(0, 2))  # (nh,)
    values = []
    if attn.softcap:
        values.append((layer, "max_attention_logit_capped",
                       mx.max(mx.where(causal, capped, -mx.inf))))
    values += [
        (layer, "max_attention_logit", mx.max(mx.where(causal, logits, -mx.inf))),
        (layer, "attention_entropy_mean", entropy_per_head.mean()),
        (layer, "attention_entropy_min_head", entropy_per_head.min()),
        (layer, "attention_sink_share", attention_sink_share(capped, causal)),  # per head
        (layer, "q_rms", rms(q)),
        (layer, "k_rms", rms(k)),
    ]
    if attn.qk_norm != "none":
        values += [(layer, "q_rms_normed", rms(qn)), (layer, "k_rms_normed", rms(kn))]
    if VARIANTS.get(attn.qk_norm) and VARIANTS[attn.qk_norm].bound == "gains":
        q_gain, k_gain = attn.q_norm.weight, attn.k_norm.weight
        values += [
            (layer, "q_norm_gain_max_abs", mx.max(mx.abs(q_gain))),
            (layer, "k_norm_gain_max_abs", mx.max(mx.abs(k_gain))),
            (layer, "max_attention_logit_bound", max_attention_logit_bound(q_gain, k_gain)),
        ]
    elif VARIANTS.get(attn.qk_norm):  # "scale": unit vectors, |logit| <= |g|
        g = mx.max(mx.abs(attn.qk_scale.weight))
        values += [(layer, "qk_scale", g), (layer, "max_attention_logit_bound", g)]
    residual_rms = rms(residual)
    return values + [
        (layer, "residual_rms", residual_rms),
        (layer, "residual_kurtosis", kurtosis(residual)),
        (layer, "residual_max_abs_over_rms", mx.max(mx.abs(residual)) / residual_rms),
        (layer, "residual_outlier_share", outlier_share(residual)),
    ]


def _forward_with_probes(model: GPT, x: mx.array, y: mx.array):
    """The model's own forward with its captures (its attention written out: the explicit
    softmax instead of the fused kernel), returning (objective, probe values, their labels).
    The objective is GPT.objective's (the cross-entropy, plus the z-loss term when z_loss > 0)
    and its gradient the model's; probe values are taken under stop_gradient."""
    captures: list[dict] = []
    out_logits = model(x, captures)  # (B, T, padded_vocab)
    values: list[tuple[int, str, mx.array]] = []
    for layer, (c, block) in enumerate(zip(captures, model.blocks)):
        values += layer_probes(layer, block.attn, c)
    if model.args.z_loss:
        objective, loss, _ = objective_terms(out_logits, y, model.args.z_loss, model.kernels)
    else:
        objective = loss = cross_entropy(out_logits, y, model.kernels)
    out_logits = mx.stop_gradient(out_logits)
    values += [
        (WHOLE_MODEL, "loss", mx.stop_gradient(loss)),
        (WHOLE_MODEL, "output_logit_max", mx.max(out_logits)),
        (WHOLE_MODEL, "output_logsumexp_mean", mx.mean(mx.logsumexp(out_logits, axis=-1))),
    ]
    return objective, [value for *_, value in values], [label for *label, _ in values]


def _group_rms(arrays: dict[str, mx.array]) -> list[tuple[int, str, mx.array]]:
    """(layer, group, RMS) per group in each layer and pooled over layers (layer -1):
    sqrt(sum of squares / number of entries) over the group's parameters."""
    sums: dict[tuple[int, str], list] = {}
    for param_name, a in arrays.items():
        group, layer = parameter_group(param_name)
        square_sum = mx.sum(mx.square(a.astype(mx.float32)))
        for key in {(layer, group), (WHOLE_MODEL, group)}:
            entry = sums.setdefault(key, [0.0, 0])
            entry[0] = entry[0] + square_sum
            entry[1] += a.size
    return [(layer, group, mx.sqrt(total / count))
            for (layer, group), (total, count) in sorted(sums.items())]


def collect(model: GPT, x: mx.array, y: mx.array, step: int) -> list[dict]:
    """Every forward and gradient probe on the batch (x, y), for params after `step` updates."""
    labels: list[tuple[int, str]] = []

    def loss_with_values(x: mx.array, y: mx.array):
        loss, values, probe_labels = _forward_with_probes(model, x, y)
        labels.extend(probe_labels)
        return loss, values

    (_, values), grads = nn.value_and_grad(model, loss_with_values)(x, y)
    flat_grads = dict(tree_flatten(grads))
    grad_norm = mx.sqrt(sum(mx.sum(mx.square(g.astype(mx.float32))) for g in flat_grads.values()))
    extra = [(WHOLE_MODEL, "grad_norm", grad_norm)]
    for name, arrays in (("grad_rms", flat_grads),
                         ("param_rms", dict(tree_flatten(model.parameters())))):
        extra += [(layer, f"{name}/{group}", value) for layer, group, value in _group_rms(arrays)]
    labels += [(layer, name) for layer, name, _ in extra]
    return _rows(step, labels, [*values, *(value for *_, value in extra)])


def update_stats(step: int, before: dict[str, mx.array], after: dict[str, mx.array]) -> list[dict]:
    """update_rms_ratio/<group>: RMS(after - before) / RMS(before) of update `step`, per group."""
    update = _group_rms({name: after[name] - before[name] for name in before})
    param = _group_rms(before)
    labels = [(layer, f"update_rms_ratio/{group}") for layer, group, _ in update]
    return _rows(step, labels, [u / p for (*_, u), (*_, p) in zip(update, param)])


def _rows(step: int, labels: list[tuple[int, str]], values: list[mx.array]) -> list[dict]:
    """One device sync for all values (scalars, or one entry per head)."""
    flat = mx.concatenate([v.reshape(-1) for v in values]).astype(mx.float32)
    heads = [v.shape[0] if v.ndim == 1 else None for v in values]
    return probe_rows(step, labels, heads, np.array(flat, dtype=np.float64).tolist())
