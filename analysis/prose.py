"""The report's words: chart captions and the sentences generated from a study's numbers."""

from __future__ import annotations

import json

import polars as pl

from . import metrics as M
from .study import Study
from .threshold import ABOVE, BELOW

CHARTS = {
    "headline": "The answer at a glance: per depth, the seed-mean final-loss gap off minus on with "
                "its 95% t-interval over seeds at every LR run in both arms, coloured by the "
                "cell's decision (family-adjusted; docs/report.md); LRs without a test (neither "
                "arm learned, or one seed) are grey crosses at zero, labelled. The y axis spans "
                "the seed-mean gaps; an interval cut at its edge ends in a triangle. The onset "
                "(black rule) with its 95% interval (grey band) and the LR where off first "
                "diverges (dashed orange) sit at their LR, or are written as beyond the axis. "
                "Above 0 means QK-norm off is worse.",
    "loss_vs_lr": "Final validation loss against learning rate, one panel per depth. The line is "
                  "the seed mean of the clipped loss (a diverged run counts as its initial loss), "
                  "the band spans the seeds, crosses mark diverged runs and open diamonds runs of "
                  "another framework; one colour per arm.",
    "training_curves": "Train loss (binned) and validation loss against step for a few learning "
                       "rates per depth: by default the off arm's optimal, max usable and first "
                       "divergent LR. One line per seed and framework; each panel has its own "
                       "step axis. The loss axis ends a little above the initial loss: a "
                       "triangle on the top edge marks where a run's loss leaves it, a cross "
                       "where a diverged run stopped.",
    "max_attention_logit": "The largest pre-softmax attention logit (over heads and layers) on a "
                           "fixed probe batch, before any soft-cap, seed mean, log scale, one "
                           "row per arm. Logit growth without QK-norm is the instability "
                           "QK-norm removes (Dehghani et al. 2023; Wortsman et al. 2023).",
    "attention_entropy": "Attention entropy on the probe batch: mean over heads and layers "
                         "(solid) and the lowest head (dashed). Entropy collapse towards 0 "
                         "goes with logit growth (Zhai et al. 2023).",
    "other_probes": "Further probes found in the runs (by default residual kurtosis, output "
                    "log-sum-exp, the soft-capped max attention logit, max |activation| / rms, "
                    "output logit max, q and k rms when present; probes=NAME,NAME chooses), "
                    "reduced over layers, seed mean. Every probe's final value is in the runs "
                    "table.",
    "lr_sensitivity": "LR sensitivity (Wortsman et al. 2023) per depth: dots are seeds, the "
                      "line joins seed means. Lower means the final loss depends less on the "
                      "learning rate over the base grid.",
    "lr_landmarks": "Optimal LR (circles) and max usable LR (triangles; open when no run above "
                    "the best LR failed, so only a lower bound) per arm with the range over "
                    "seeds, and the onset (diamonds) with its 95% interval (an interval end "
                    "beyond the LRs run is drawn to the edge, where a triangle marks it).",
}


def span(values, fmt: str = ".3g") -> str:
    """The smallest and largest value as `fmt` writes them: "lo", or "lo-hi" where they differ."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _onset_words(r: dict) -> str:
    if r["onset"] is None:
        return f"no onset ({r['note']})"
    where = {BELOW: f" ({BELOW})", ABOVE: f" ({ABOVE})"}.get(r["outside"], "")
    return f"onset LR {r['onset']}{where}"


def headline(study: Study) -> list[str]:
    """The answer in sentences: per arm and depth the onset and tested rule; verdicts; scale."""
    th = study.thresholds
    out = []
    for on in M.compared_arms(study.points):
        t = th.filter(pl.col("compared_arm") == on).sort("depth")
        margin = f"{t['min_gap'][0]:g}" if t.height else "0.1"
        out.append(f"{M.arm_words(on)} against {M.arm_words(M.OFF)}: the onset is the LR at "
                   f"which the seed-mean final-loss gap (off minus on) reaches {margin} nats, "
                   "with its 95% interval over resampled seeds; the tested rule is what the "
                   "paired tests decide, LR by LR (Benjamini-Hochberg within H1's family).")
        for r in t.iter_rows(named=True):
            rule = r["tested_rule"].split(": ", 1)[1]
            out.append(f"Depth {r['depth']}: {_onset_words(r)}; tested: {rule}.")
    several = study.verdicts["compared_arm"].n_unique() > 1
    out.append("Verdicts: " + "; ".join(
        r["hypothesis"] + (f" ({M.arm_words(r['compared_arm'])})" if several else "")
        + f" {r['verdict']} ({r['family_size']} tests, {r['correction']}, n={r['seeds']})"
        for r in study.verdicts.iter_rows(named=True)) + ".")
    p = study.per_run
    params = p["params_total"].drop_nulls() if "params_total" in p.columns else pl.Series([])
    tokens = p["tokens_seen"].drop_nulls().max() if "tokens_seen" in p.columns else None
    data = json.loads(study.setting).get("data", "?") if study.setting else "?"
    if params.len() and tokens:
        out.append(f"Scale: {span(params / 1e6, '.2f')}M parameters, at most {tokens / 1e6:.2g}M tokens a "
                   f"run, on {data}: this says nothing directly about larger models, longer "
                   f"training or other corpora.")
    return out
