"""mlx_gpt's probes computed in torch: the same names, formulas and rows (docs/probes.md).

Rows are long format {"step", "layer", "name", "value"}, so a torch run's probes/ parts read like
an MLX run's and parity compares them name by name. Grouping of parameters and the layer index
of whole-model values come from mlx_gpt.probes itself.
"""

from __future__ import annotations

import math

import torch

from qkstudy.probe_names import OUTLIER_SIGMAS, WHOLE_MODEL, parameter_group, probe_rows

from qkstudy.variants import VARIANTS

from .model import GPT, objective_terms


def rms(x: torch.Tensor) -> torch.Tensor:
    return x.float().square().mean().sqrt()


def kurtosis(x: torch.Tensor) -> torch.Tensor:
    """E[(x-mu)^4] / E[(x-mu)^2]^2 over all entries (3 for a Gaussian)."""
    centred = x.float() - x.float().mean()
    return centred.square().square().mean() / centred.square().mean().square()


def outlier_share(x: torch.Tensor, sigmas: float = OUTLIER_SIGMAS) -> torch.Tensor:
    """Share of entries with |x - mean| > sigmas * std (std over all entries, ddof 0)."""
    centred = x.float() - x.float().mean()
    std = centred.square().mean().sqrt()
    return (centred.abs() > sigmas * std).float().mean()


def attention_entropy(logits: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each query's attention distribution: (B, nh, T) from (B, nh, T, T)."""
    masked = logits.masked_fill(~causal, float("-inf"))
    log_p = masked - torch.logsumexp(masked, dim=-1, keepdim=True)
    return -torch.where(causal, log_p.exp() * log_p, torch.zeros_like(log_p)).sum(dim=-1)


def attention_sink_share(logits: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """Each head's attention probability on the first position, mean over the batch and the
    queries: (nh,) from (B, nh, T, T) logits."""
    masked = logits.masked_fill(~causal, float("-inf"))
    first = (masked[..., 0] - torch.logsumexp(masked, dim=-1)).exp()  # (B, nh, T)
    return first.mean(dim=(0, 2))


def max_attention_logit_bound(q_gain: torch.Tensor, k_gain: torch.Tensor) -> torch.Tensor:
    """max|g_q| * max|g_k| * sqrt(head_dim): the ceiling QK-norm puts on |logit|."""
    return q_gain.abs().max() * k_gain.abs().max() * math.sqrt(q_gain.shape[-1])


def layer_probes(layer: int, attn, c: dict) -> list[tuple[int, str, torch.Tensor]]:
    """One block's forward probes from its capture (GPT.hidden), detached."""
    logits, capped, q, k, qn, kn, residual = (c[n].detach() for n in (
        "logits", "capped", "q", "k", "q_normed", "k_normed", "residual"))
    causal = c["causal"]
    entropy_per_head = attention_entropy(capped, causal).mean(dim=(0, 2))  # (nh,)
    values = []
    if attn.softcap:
        values.append((layer, "max_attention_logit_capped",
                       capped.masked_fill(~causal, float("-inf")).max()))
    values += [
        (layer, "max_attention_logit", logits.masked_fill(~causal, float("-inf")).max()),
        (layer, "attention_entropy_mean", entropy_per_head.mean()),
        (layer, "attention_entropy_min_head", entropy_per_head.min()),
        (layer, "attention_sink_share", attention_sink_share(capped, causal)),  # per head
        (layer, "q_rms", rms(q)),
        (layer, "k_rms", rms(k)),
    ]
    if attn.qk_norm != "none":
        values += [(layer, "q_rms_normed", rms(qn)), (layer, "k_rms_normed", rms(kn))]
    if VARIANTS.get(attn.qk_norm) and VARIANTS[attn.qk_norm].bound == "gains":
        q_gain, k_gain = attn.q_norm.weight.detach(), attn.k_norm.weight.detach()
        values += [
            (layer, "q_norm_gain_max_abs", q_gain.abs().max()),
            (layer, "k_norm_gain_max_abs", k_gain.abs().max()),
            (layer, "max_attention_logit_bound", max_attention_logit_bound(q_gain, k_gain)),
        ]
    elif VARIANTS.get(attn.qk_norm):  # "scale": unit vectors, |logit| <= |g|
        g = attn.qk_scale.weight.detach().abs().max()
        values += [(layer, "qk_scale", g), (layer, "max_attention_logit_bound", g)]
    residual_rms = rms(residual)
    return values + [
        (layer, "residual_rms", residual_rms),
        (layer, "residual_kurtosis", kurtosis(residual)),
        (layer, "residual_max_abs_over_rms", residual.abs().max() / residual_rms),
        (layer, "residual_outlier_share", outlier_share(residual)),
    ]


def _forward_with_probes(model: GPT, x: torch.Tensor, y: torch.Tensor):
    """The model's own forward with its captures (its attention written out): (objective,
    [(layer, name, value)]), values detached; the objective is the cross-entropy plus the
    z-loss term when z_loss > 0."""
    captures: list[dict] = []
    out_logits = model(x, captures)  # (B, T, padded_vocab)
    values: list[tuple[int, str, torch.Tensor]] = []
    for layer, (c, block) in enumerate(zip(captures, model.blocks)):
        values += layer_probes(layer, block.attn, c)
    objective, loss, _ = objective_terms(out_logits, y, model.args.z_loss)
    out_logits = out_logits.detach()
    values += [
        (WHOLE_MODEL, "loss", loss.detach()),
        (WHOLE_MODEL, "output_logit_max", out_logits.max()),
        (WHOLE_MODEL, "output_logsumexp_mean", torch.logsumexp(out_logits, dim=-1).mean()),
    ]
    return objective, values


def _group_rms(tensors: dict[str, torch.Tensor]) -> list[tuple[int, str, torch.Tensor]]:
    """(layer, group, RMS) per group in each layer and pooled over layers (layer -1)."""
    sums: dict[tuple[int, str], list] = {}
    for name, t in tensors.items():
        group, layer = parameter_group(name)
        square_sum = t.float().square().sum()
        for key in {(layer, group), (WHOLE_MODEL, group)}:
            entry = sums.setdefault(key, [0.0, 0])
            entry[0] = entry[0] + square_sum
            entry[1] += t.numel()
    return [(layer, group, (total / count).sqrt())
            for (layer, group), (total, count) in sorted(sums.items())]


def _rows(step: int, values: list[tuple[int, str, torch.Tensor]]) -> list[dict]:
    """One device sync for all values (scalars, or one entry per head)."""
    flat = torch.cat([v.float().reshape(-1) for *_, v in values])
    numbers = flat.cpu().double().tolist()  # MPS: no float64
    heads = [v.shape[0] if v.dim() == 1 else None for *_, v in values]
    return probe_rows(step, [(layer, name) for layer, name, _ in values], heads, numbers)


def collect(model: GPT, x: torch.Tensor, y: torch.Tensor, step: int) -> list[dict]:
    """Every forward and gradient probe on the batch (x, y), for params after `step` updates.

    Gradients come from torch.autograd.grad, so the parameters' .grad is left alone.
    """
    named = dict(model.named_parameters())
    with torch.enable_grad():
        loss, values = _forward_with_probes(model, x, y)
        grads = dict(zip(named, torch.autograd.grad(loss, list(named.values()))))
    grad_norm = torch.sqrt(sum(g.float().square().sum() for g in grads.values()))
    values.append((WHOLE_MODEL, "grad_norm", grad_norm))
    params = {k: p.detach() for k, p in named.items()}
    for prefix, tensors in (("grad_rms", grads), ("param_rms", params)):
        values += [(layer, f"{prefix}/{group}", v) for layer, group, v in _group_rms(tensors)]
    return _rows(step, values)


def snapshot(model: GPT) -> dict[str, torch.Tensor]:
    """A copy of the parameters, for update_stats."""
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def update_stats(step: int, before: dict[str, torch.Tensor],
                 after: dict[str, torch.Tensor]) -> list[dict]:
    """update_rms_ratio/<group>: RMS(after - before) / RMS(before) of update `step`, per group."""
    update = _group_rms({name: after[name] - before[name] for name in before})
    param = _group_rms(before)
    return _rows(step, [(layer, f"update_rms_ratio/{group}", u / p)
                        for (layer, group, u), (*_, p) in zip(update, param)])
