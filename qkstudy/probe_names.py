"""The probes' vocabulary, free of any framework: the names both trainers write, the parameter
groups, the outlier threshold, and reading a run's probe rows back (docs/probes.md)."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UsageError

WHOLE_MODEL = -1
OUTLIER_SIGMAS = 6.0  # "massive" threshold for the outlier share (Sun et al. 2024 use far more)

# Names that `measure` and `update_stats` write (before the `/<group>` suffix where there is one).
ATTENTION_NAMES = ("max_attention_logit", "attention_entropy_mean", "attention_entropy_min_head",
                   "q_rms", "k_rms")
SOFTCAP_NAMES = ("max_attention_logit_capped",)  # attn_softcap > 0
QK_NORM_NAMES = ("q_rms_normed", "k_rms_normed", "q_norm_gain_max_abs", "k_norm_gain_max_abs",
                 "qk_scale", "max_attention_logit_bound")
RESIDUAL_NAMES = ("residual_rms", "residual_kurtosis", "residual_max_abs_over_rms",
                  "residual_outlier_share")
OUTPUT_NAMES = ("loss", "grad_norm", "output_logit_max", "output_logsumexp_mean")
GROUP_NAMES = ("grad_rms", "param_rms")  # from `measure`
UPDATE_NAMES = ("update_rms_ratio",)  # from `update_stats`
GROUPS = ("wte", "wpe", "attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "ln", "qk_norm")

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_GROUP_ALIASES = {"ln1": "ln", "ln2": "ln", "ln_f": "ln", "attn.q_norm": "qk_norm",
                  "attn.k_norm": "qk_norm", "attn.qk_scale": "qk_norm"}


def parameter_group(name: str) -> tuple[str, int]:
    """'blocks.3.attn.qkv.weight' -> ('attn.qkv', 3); 'ln_f.bias' -> ('ln', -1).

    A group is the parameter's module path without the block index and without .weight/.bias,
    with the norms merged: ln1, ln2, ln_f -> ln; attn.q_norm, attn.k_norm -> qk_norm.
    """
    layer = WHOLE_MODEL
    match = _BLOCK.match(name)
    if match:
        layer, name = int(match.group(1)), match.group(2)
    module = name.rsplit(".", 1)[0]
    return _GROUP_ALIASES.get(module, module), layer



def read_probes(run_dir: str | Path):
    """All probe rows of a run folder as a pyarrow Table (step, layer, name, value)."""
    from .run_folder import RunFolder

    folder = RunFolder(Path(run_dir))
    table = folder.read_probes()
    if table is None:
        raise UsageError(f"{run_dir} has no probe rows (no {folder.probes_dir.name}/part-*.parquet)")
    return table
