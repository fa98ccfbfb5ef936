"""The report's words: chart captions, the definitions, and the sentences generated from a
study's verdicts and numbers."""

from __future__ import annotations

import json

import polars as pl

from . import hypotheses as H
from . import metrics as M
from .study import Study


CHARTS = {
    "headline": "The answer at a glance: per depth, the seed-mean final-loss gap off minus on with "
                "its 95% t-interval over seeds at every LR run in both arms, coloured by the "
                "cell's decision (family-adjusted; docs/report.md); LRs without a test (neither "
                "arm learned, or one seed) are grey crosses at zero, labelled. The y axis spans "
                "the seed-mean gaps; an interval cut at its edge ends in a triangle. The "
                "necessity threshold (black rule) with its 95% bootstrap interval (grey band) "
                "and the LR where off first diverges (dashed orange) sit at their LR, or are "
                "written as beyond the axis. Above 0 means QK-norm off is worse.",
    "loss_vs_lr": "Final validation loss against learning rate, one panel per depth. The line is "
                  "the seed mean of the clipped loss (a diverged run counts as its initial loss), "
                  "the band spans the seeds, crosses mark diverged runs and open diamonds runs of "
                  "another framework; one colour per arm. Where the off curve rises above "
                  "an arm's curve is where that control starts to matter.",
    "training_curves": "Train loss (binned) and validation loss against step for a few learning "
                       "rates per depth: by default the off arm's optimal, max stable and first "
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
    "other_probes": "Further probes found in the runs (by default residual kurtosis, "
                    "output log-sum-exp (what z-loss pulls towards 0), the soft-capped max "
                    "attention logit, max |activation| / rms, output logit max, q and k rms "
                    "when present; dashes tell the arms apart; probes=NAME,NAME chooses), "
                    "reduced over layers (the whole-model value where there is one, else max "
                    "for peaks and outlier measures, min for minima, mean otherwise), seed "
                    "mean. Every probe's final value is in the runs table.",
    "gap_map": "Seed-mean final-loss gap, off minus the compared arm (one row per arm), for "
               "every LR run in both arms at each depth: red means off is worse, blue that "
               "it is better. Grey cells had no paired test: fewer than 2 paired seeds "
               "(labelled with their n), or neither arm learned (labelled so: every run of "
               "both diverged or degraded, so the gap says nothing about the control). Triangles: off worse (family-adjusted paired test, gap at "
               "least min_gap); dashes: no difference (equivalence test within min_gap). Crosses: "
               "off diverged; circles: the compared arm diverged; squares: both. The black "
               "bar is the necessity threshold of that depth (from there on the seed-mean gap "
               "is at least min_gap at every larger informative LR).",
    "lr_sensitivity": "LR sensitivity (Wortsman et al. 2023) per depth: dots are seeds, the "
                      "line joins seed means. Lower means the final loss depends less on the "
                      "learning rate over the base grid.",
    "lr_landmarks": "Optimal LR (circles) and max stable LR (triangles; open when no run "
                    "diverged, so only a lower bound) per arm with the range over seeds, and "
                    "the necessity threshold (diamonds) with its 95% bootstrap interval (a "
                    "censored threshold has no diamond; an interval end beyond the LRs run is "
                    "drawn to the edge, where a triangle marks it).",
}


DEFINITIONS = """
<dl>
<dt>Clipped loss</dt><dd>min(final val loss, loss at initialisation); a diverged run counts as
its initial loss (Wortsman et al. 2023, arXiv:2309.14322, Sec. 2.2).</dd>
<dt>LR sensitivity</dt><dd>Wortsman et al. 2023, Sec. 2.2: the mean over the base LR grid of
the clipped loss minus the best loss on the grid, per seed, then averaged over seeds. The base
grid of a depth is the set of LRs run for every (arm, seed) pair at that depth (or the runs
not marked <code>refine</code>, when such a marker exists); refinement LRs are left out so both
arms are scored on the same points.</dd>
<dt>Max stable LR</dt><dd>Per seed: the largest LR below the smallest diverged LR, using every
LR run (refinement points included); with no divergence it is the largest LR run and only a
lower bound (censored); when every LR diverged it is below the smallest LR run, which is kept
as an upper bound (below_grid). Reported as the geometric mean over seeds with the seed
range.</dd>
<dt>Optimal LR, best loss</dt><dd>Per seed, the LR with the lowest final val loss and that
loss; geometric mean of the LRs and mean of the losses over seeds.</dd>
<dt>Degraded run</dt><dd>A run that did not diverge but whose final loss is above the
training data's unigram entropy minus degraded_margin: it learned token frequencies and little
more. A (depth, LR) cell where every run of both arms diverged or degraded is uninformative and
is not tested.</dd>
<dt>Paired tests</dt><dd>One seed shares its initial weights and batches across arms and LRs,
so arms are compared seed by seed. Every gap is shown with its two-sided 95% t-interval over
seeds. Each cell has three claims fixed in advance: off worse (one-sided t-test), on worse
(one-sided t-test) and no difference (TOST against +-min_gap). Each hypothesis is one family
of tests, adjusted by Benjamini-Hochberg (q-values); a claim needs q &lt; alpha, and a worse
arm also a mean gap of at least min_gap. "Undetermined": none of the three claims passed.</dd>
<dt>Necessity threshold</dt><dd>Per depth: from the largest informative LR down, the LRs whose
seed-mean gap is at least min_gap; the threshold is where the gap, linear in log LR, crosses
min_gap below the last of them. Its 95% interval comes from a parametric bootstrap over seeds
(each LR's mean gap drawn from its t distribution). A depth whose largest informative LR is
under min_gap is censored ("&gt; largest LR"), one needed at every LR is "&lt;= smallest LR":
a censored threshold is never a number.</dd>
<dt>Steps to threshold</dt><dd>The first evaluation step at which the val loss is at or below
the loss threshold of the run's depth (by default: the largest, over arms and seeds, of the
best run's val loss at mid-training, a level every arm reaches well before the end).</dd>
</dl>
"""


MEASURED_HELP = ("measured: in how many of a hypothesis's parts (one per depth, and for H2 "
                 "its two measures per depth) the data decided for or against, out of the "
                 "parts in total, and in brackets how many parts had the data at all (enough "
                 "paired seeds and runs in both arms). \"2 of 3 depths decided (3 had the data)"
                 "\": every depth could be judged, at 2 the result was decided, at 1 it was "
                 "undecided.")


def _lr_list(lrs: list[float], among: list[float]) -> str:
    """The LRs `lrs` as runs of neighbours in `among` (every LR tested at that depth), so a
    range never spans an LR with another outcome: "0.001 and 0.0173-0.3"."""
    order = sorted(set(among) | set(lrs))
    chosen = {order.index(lr) for lr in lrs}
    runs, start = [], None
    for i in range(len(order) + 1):
        if i in chosen and start is None:
            start = i
        elif i not in chosen and start is not None:
            a, b = order[start], order[i - 1]
            runs.append(f"{a:.3g}" if a == b else f"{a:.3g}-{b:.3g}")
            start = None
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


def _threshold_text(row: dict) -> str | None:
    """A depth's threshold as a sentence can state it; None when its 95% interval spans every
    LR run (the seeds cannot place it)."""
    if row["ci_lo"] is None and row["ci_hi"] is None:
        return None
    return row["threshold"]


def _scale(values: pl.Series) -> str:
    lo, hi = values.min() / 1e6, values.max() / 1e6
    return f"{lo:.2f}M" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}M"


def headline(study: Study) -> list[str]:
    """Three to five plain sentences of the answer, generated from the verdicts and their
    numbers (each claim with error control, each "no difference" from the equivalence test)."""
    gaps, th = study.gaps, study.thresholds
    out = []
    for on in M.compared_arms(study.points):
        g = gaps.filter(pl.col("compared_arm") == on)
        who = f"QK-norm ({on})" if on in M.QK_NORM_ARMS else M.arm_words(on)
        worse, calm = [], []
        for d in sorted(g["depth"].unique().to_list()):
            cells = g.filter(pl.col("depth") == d)
            tested = cells.filter(pl.col("decision").is_in(
                [H.OFF_WORSE, H.ON_WORSE, H.NO_DIFFERENCE, H.UNDETERMINED]))["lr"].to_list()
            w = cells.filter(pl.col("decision") == H.OFF_WORSE)
            if w.height:
                low, high = w["mean_gap"].min(), w["mean_gap"].max()
                size = f"{low:.2f} nats" if f"{low:.2f}" == f"{high:.2f}" else \
                    f"{low:.2f}-{high:.2f} nats"
                worse.append(f"at LR {_lr_list(w['lr'].to_list(), tested)} at depth {d} "
                             f"({size})")
            c = cells.filter(pl.col("decision") == H.NO_DIFFERENCE)
            if c.height:
                calm.append(f"LR {_lr_list(c['lr'].to_list(), tested)} at depth {d}")
        margin = f"{th['min_gap'][0]:g}" if th.height else "the margin's"
        out.append((f"Without {who} the final loss is worse by more than {margin} nats, with "
                    "error control, " + "; ".join(worse) + ".") if worse else
                   f"No LR shows {who} off worse by more than {margin} nats with error control.")
        out.append(("No difference within the margin (equivalence test) at "
                    + "; ".join(calm) + ".") if calm else
                   "No LR passes the equivalence test: \"no difference\" is shown nowhere.")
        t = th.filter(pl.col("compared_arm") == on).filter(pl.col("threshold").is_not_null())
        placed = [(r["depth"], _threshold_text(r), r["rule"]) for r in t.iter_rows(named=True)]
        stated = [f"{text} at depth {d}" for d, text, _ in placed if text]
        vague = [str(d) for d, text, _ in placed if not text]
        if stated and worse:  # the practitioner's line per depth (threshold.practitioner_line)
            out += [rule + "." for _, text, rule in placed if text and rule]
        elif stated:  # the fitted gap reaches the margin, but no cell passes its test
            out.append("No threshold is claimed: the fitted gaps alone would put it at "
                       + ", ".join(stated) + ", but no LR passes the off-worse test.")
        if vague:
            out.append(f"Too few seeds to place the threshold at depth {', '.join(vague)}: its "
                       "95% interval spans every LR run.")
        v = study.verdicts.filter(pl.col("compared_arm") == on)
        out.append("Verdicts: " + "; ".join(
            f"{r['hypothesis']} {r['verdict']} ({r['family_size']} tests, n={r['seeds']})"
            for r in v.iter_rows(named=True)) + ".")
    p = study.per_run
    params = p["params_total"].drop_nulls() if "params_total" in p.columns else pl.Series([])
    tokens = p["tokens_seen"].drop_nulls().max() if "tokens_seen" in p.columns else None
    data = json.loads(study.setting).get("data", "?") if study.setting else "?"
    if params.len() and tokens:
        out.append(f"Scale: {_scale(params)} parameters, at "
                   f"most {tokens / 1e6:.2g}M tokens a run, on {data}: this says nothing "
                   f"directly about larger models, longer training or other corpora.")
    return out

