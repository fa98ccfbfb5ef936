"""The probes' statistics, written once for both engines through their `ops` (docs/probes.md)."""

from __future__ import annotations

import math

from .config import ModelArgs
from .probe_registry import OUTLIER_SIGMAS, WHOLE_MODEL, parameter_group
from .variants import PARAMETER_PROBES, variant

NEG_INF = float("-inf")


def rms(x, ops):
    return ops.f32(x).square().mean().sqrt()


def kurtosis(x, ops):
    """E[(x-mu)^4] / E[(x-mu)^2]^2 over all entries (3 for a Gaussian)."""
    centred = ops.f32(x) - ops.f32(x).mean()
    return centred.square().square().mean() / centred.square().mean().square()


def outlier_share(x, ops, sigmas: float = OUTLIER_SIGMAS):
    """Share of entries with |x - mean| > sigmas * std (std over all entries, ddof 0)."""
    centred = ops.f32(x) - ops.f32(x).mean()
    return ops.f32(centred.abs() > sigmas * centred.square().mean().sqrt()).mean()


def layer_probes(layer: int, c: dict, args: ModelArgs, params: dict, ops) -> list[tuple]:
    row, causal = variant(args.qk_norm), c["causal"]
    masked = ops.where(causal, c["capped"], NEG_INF)  # (B, nh, T, T)
    log_p = masked - masked.logsumexp(axis=-1, keepdims=True)
    # each query's attention entropy in nats, mean over the batch and the queries: (nh,)
    entropy = (-ops.where(causal, log_p.exp() * log_p, 0.0).sum(axis=-1)).mean(axis=(0, 2))
    # each head's attention probability on the first position, mean likewise
    sink = (masked[..., 0] - masked.logsumexp(axis=-1)).exp().mean(axis=(0, 2))
    values = [("max_attention_logit_capped", masked.max())] if args.attn_softcap else []
    values += [("max_attention_logit", ops.where(causal, c["logits"], NEG_INF).max()),
               ("attention_entropy_mean", entropy.mean()),
               ("attention_entropy_min_head", entropy.min()), ("attention_sink_share", sink),
               ("q_rms", rms(c["q"], ops)), ("k_rms", rms(c["k"], ops))]
    if row.norm:
        values += [("q_rms_normed", rms(c["q_normed"], ops)),
                   ("k_rms_normed", rms(c["k_normed"], ops))]
    attn, head_dim = f"blocks.{layer}.attn", args.d_model // args.n_heads
    largest = {name: params[f"{attn}.{name}.weight"].abs().max()
               for name in row.parameters(args.block_size, head_dim)}
    values += [(PARAMETER_PROBES[name], value) for name, value in largest.items()]
    if row.logit_bound:
        values.append(("max_attention_logit_bound", row.logit_bound(largest, head_dim)))
    residual = c["residual"]
    residual_rms = rms(residual, ops)
    values += [("residual_rms", residual_rms), ("residual_kurtosis", kurtosis(residual, ops)),
               ("residual_max_abs_over_rms", residual.abs().max() / residual_rms),
               ("residual_outlier_share", outlier_share(residual, ops))]
    return [(layer, name, value) for name, value in values]


def group_rms(arrays: dict, ops) -> list[tuple]:
    """(layer, group, RMS) per parameter group in each layer and pooled over layers (-1)."""
    sums: dict[tuple[int, str], list] = {}
    for name, a in arrays.items():
        group, layer = parameter_group(name)
        square_sum = ops.f32(a).square().sum()
        for key in {(layer, group), (WHOLE_MODEL, group)}:
            entry = sums.setdefault(key, [0.0, 0])
            entry[0] = entry[0] + square_sum
            entry[1] += math.prod(a.shape)
    return [(layer, group, (total / count).sqrt())
            for (layer, group), (total, count) in sorted(sums.items())]


def collected(step: int, args: ModelArgs, captures: list[dict], logits, loss, params: dict,
              grads: dict, ops) -> list[dict]:
    """The rows of every probe of one forward and its backward, for params after `step` updates."""
    values = [v for layer, c in enumerate(captures)
              for v in layer_probes(layer, c, args, params, ops)]
    values += [(WHOLE_MODEL, "loss", loss), (WHOLE_MODEL, "output_logit_max", logits.max()),
               (WHOLE_MODEL, "output_logsumexp_mean", logits.logsumexp(axis=-1).mean()),
               (WHOLE_MODEL, "grad_norm",
                sum(ops.f32(g).square().sum() for g in grads.values()).sqrt())]
    for name, arrays in (("grad_rms", grads), ("param_rms", params)):
        values += [(layer, f"{name}/{group}", v) for layer, group, v in group_rms(arrays, ops)]
    return rows(step, values, ops)


def update_ratios(step: int, before: dict, after: dict, ops) -> list[dict]:
    """The rows of update_rms_ratio/<group>: RMS(after - before) / RMS(before)."""
    update = group_rms({name: after[name] - before[name] for name in before}, ops)
    return rows(step, [(layer, f"update_rms_ratio/{group}", u / p)
                       for (layer, group, u), (*_, p) in zip(update, group_rms(before, ops))], ops)


def rows(step: int, values: list[tuple], ops) -> list[dict]:
    """The rows {step, layer, head, name, value}: one per scalar, one per head of a head value."""
    numbers = iter(ops.numbers([v for *_, v in values]))
    return [{"step": step, "layer": layer, "head": head, "name": name, "value": next(numbers)}
            for layer, name, v in values
            for head in (range(v.shape[0]) if v.ndim == 1 else (None,))]
