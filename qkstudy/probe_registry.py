"""The probe registry, one row a probe (name, reduction, words), parameter groups, outliers."""

from __future__ import annotations

import re
from dataclasses import dataclass

WHOLE_MODEL = -1
OUTLIER_SIGMAS = 6.0  # "massive" threshold for the outlier share (Sun et al. 2024 use far more)

@dataclass(frozen=True)
class Probe:
    """One probe: its reduction, worse direction, per-run summary, words, per-head rows."""

    name: str
    over_layers: str
    worse: str | None
    words: str
    tracked: bool = False
    per_head: bool = False


# every probe either engine writes (before the `/<group>` suffix)
PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("attention_entropy_min_head", "min", "smaller", "the lowest head's mean attention "
          "entropy (nats)", tracked=True),
    Probe("attention_entropy_mean", "mean", "smaller", "attention entropy (nats), mean over "
          "queries, heads and the batch", tracked=True),
    Probe("max_attention_logit", "max", "larger", "largest scaled q.k logit over causal pairs, "
          "before any soft-cap", tracked=True),
    Probe("max_attention_logit_capped", "max", "larger", "the same after the soft-cap "
          "(attn_softcap > 0)"),
    Probe("attention_sink_share", "max", None, "attention probability on the first position, "
          "mean over queries and the batch", per_head=True),
    Probe("q_rms", "mean", None, "RMS of q before QK-norm"),
    Probe("k_rms", "mean", None, "RMS of k before QK-norm"),
    Probe("q_rms_normed", "mean", None, "RMS of q after QK-norm (QK-norm on)"),
    Probe("k_rms_normed", "mean", None, "RMS of k after QK-norm (QK-norm on)"),
    Probe("q_norm_gain_max_abs", "max", "larger", "largest |gain| of q's norm (rmsnorm, "
          "layernorm)"),
    Probe("k_norm_gain_max_abs", "max", "larger", "largest |gain| of k's norm (rmsnorm, "
          "layernorm)"),
    Probe("qk_scale", "max", "larger", "|g|, the learnable softmax scale (l2norm)"),
    Probe("max_attention_logit_bound", "max", "larger", "the bound QK-norm puts on |logit|: "
          "max|g_q| max|g_k| sqrt(head_dim), or |g| for l2norm"),
    Probe("residual_rms", "mean", None, "RMS of the residual stream after the block"),
    Probe("residual_kurtosis", "max", "larger", "kurtosis of the residual stream's entries "
          "(3 for a Gaussian)", tracked=True),
    Probe("residual_max_abs_over_rms", "max", "larger", "largest |entry| of the residual "
          "stream over its RMS", tracked=True),
    Probe("residual_outlier_share", "max", "larger", f"share of residual entries beyond "
          f"{OUTLIER_SIGMAS:g} standard deviations"),
    Probe("loss", "mean", "larger", "cross-entropy on the probe batch (whole model)"),
    Probe("grad_norm", "mean", "larger", "global gradient norm on the probe batch (whole "
          "model)"),
    Probe("output_logit_max", "max", "larger", "largest output logit (whole model)",
          tracked=True),
    Probe("output_logsumexp_mean", "mean", "larger", "mean log-sum-exp of the output logits "
          "(whole model; what z-loss penalises)"),
    Probe("grad_rms", "mean", None, "RMS of a parameter group's gradient"),
    Probe("param_rms", "mean", None, "RMS of a parameter group"),
    Probe("update_rms_ratio", "mean", None, "RMS of an update over the RMS of the parameters "
          "it changes, per group"),
)}


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_GROUP_ALIASES = {"ln1": "ln", "ln2": "ln", "ln_f": "ln", "attn.q_norm": "qk_norm",
                  "attn.k_norm": "qk_norm", "attn.qk_scale": "qk_norm"}


def parameter_group(name: str) -> tuple[str, int]:
    """'blocks.3.attn.qkv.weight' -> ('attn.qkv', 3); the norms merged into ln, qk_norm."""
    layer = WHOLE_MODEL
    match = _BLOCK.match(name)
    if match:
        layer, name = int(match.group(1)), match.group(2)
    module = name.rsplit(".", 1)[0]
    return _GROUP_ALIASES.get(module, module), layer
