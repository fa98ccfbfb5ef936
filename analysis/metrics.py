"""Study metrics in Polars: LR sensitivity, max stable LR, optimal LR, necessity threshold,
verdicts.

Every function takes a "points" frame with one row per finished run of one setting and one
framework: depth, arm, lr, seed, status (completed | diverged), init_loss, final_val_loss
(and optionally refine). `arm == "none"` is the off arm (every logit control off); every other
arm (a QK-norm kind, softcap<C>, zloss<W>: analysis/load.py) is compared with it by the same
rules. A frame without an `arm` column takes its arms from `qk_norm`.
The arms are paired: one seed shares its initial weights and its batches across arms and LRs,
so arms are compared seed by seed. Every rule here is written out in docs/report.md.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from qkstudy.arms import OFF, QK_NORM_ARMS

from . import stats as S

ARM = "arm"
ARM_KEYS = ("depth", ARM)


def with_arm(points: pl.DataFrame) -> pl.DataFrame:
    """`points` with an `arm` column: kept if present, else the `qk_norm` column."""
    return points if ARM in points.columns else points.with_columns(pl.col("qk_norm").alias(ARM))


def arm_words(arm: str) -> str:
    """An arm in words, for legends and claims: "QK-norm off", "QK-norm on (rmsnorm)",
    "attention soft-cap 50", "z-loss 1e-4" (several controls: joined by " + ")."""
    if arm == OFF:
        return "QK-norm off"
    words = []
    for part in arm.split("+"):
        if part in QK_NORM_ARMS:
            words.append(f"QK-norm on ({part})")
        elif part.startswith("softcap"):
            words.append(f"attention soft-cap {part.removeprefix('softcap')}")
        elif part.startswith("zloss"):
            words.append(f"z-loss {part.removeprefix('zloss')}")
        else:
            words.append(part)
    return " + ".join(words)


def control_words(arm: str) -> str:
    """The compared arm as the subject of a claim: "QK-norm", "attention soft-cap 50", ..."""
    return "QK-norm" if arm in QK_NORM_ARMS else arm_words(arm)


@dataclass(frozen=True)
class Options:
    """Knobs of the study metrics and verdicts (all visible in the report; docs/report.md)."""

    alpha: float = 0.05  # each hypothesis's family: Benjamini-Hochberg at this level
    # the smallest gap in nats that counts as a difference (0.02 nats = 2% perplexity), and the
    # equivalence margin: "no difference" needs TOST to place the mean gap inside +-min_gap
    min_gap: float = 0.02
    # a stable run whose final loss is above the training data's unigram entropy minus this
    # learned no more than token frequencies: "degraded" (both arms degraded says nothing)
    degraded_margin: float = 0.2
    # max stable LR: on/off ratios within this factor either way are "equal" (TOST on log ratio)
    lr_ratio_margin: float = 1.5
    # H3: two depths' thresholds within this many decades are "equal" (a half-decade grid step)
    threshold_margin: float = 0.5
    bootstrap: int = 2000  # resamples of seeds for threshold intervals (fixed generator seed)


# --- scoring ------------------------------------------------------------------------------------

def with_losses(points: pl.DataFrame, degraded_margin: float = Options.degraded_margin
                ) -> pl.DataFrame:
    """Add `diverged`, `degraded`, `loss` (+inf for a diverged run or a non-finite final loss)
    and `loss_clipped` = min(loss, init_loss). No run is ever dropped.

    degraded: a stable run whose final loss is above unigram_entropy - degraded_margin (it
    learned token frequencies and little more); False where the unigram entropy is unknown
    (runs written before summary.json kept it).

    Wortsman et al. 2023 (arXiv:2309.14322, Sec. 2.2) clip each final loss at the loss at
    initialisation, so a diverged run counts as init_loss; so does a completed run whose final
    loss is missing or not finite (`nonfinite_final`). A run without its own init_loss borrows
    the mean init_loss of its (depth, arm) arm, then of its depth.
    """
    points = with_arm(points)
    init = pl.coalesce(pl.col("init_loss"), pl.col("init_loss").mean().over(ARM_KEYS),
                       pl.col("init_loss").mean().over("depth"))
    final = pl.col("final_val_loss").cast(pl.Float64)
    bad_final = final.is_null() | ~final.is_finite()
    diverged = pl.col("status") == "diverged"
    if "unigram_entropy" not in points.columns:
        points = points.with_columns(unigram_entropy=pl.lit(None, pl.Float64))
    degraded = (~diverged & ~bad_final & (final > pl.col("unigram_entropy") - degraded_margin)
                ).fill_null(False)
    return (points.with_columns(diverged=diverged, nonfinite_final=~diverged & bad_final,
                                degraded=degraded,
                                loss=pl.when(diverged | bad_final).then(pl.lit(math.inf))
                                .otherwise(final), init_loss=init)
            .with_columns(loss_clipped=pl.min_horizontal("loss", "init_loss")))


def full_curves(points: pl.DataFrame) -> pl.DataFrame:
    """The runs of the sweep's base seeds, which ran the whole grid (`added_seed` false).

    Adaptive seeds (sweep/adaptive.py) add a seed to single (depth, LR) cells; such a seed has
    no LR curve, so the per-seed curve metrics (LR sensitivity, max stable LR, optimal LR and
    best loss) leave it out, while the per-cell gaps use every seed. load.py marks them from
    the seeds sweep.json declares."""
    points = with_arm(points)
    if "added_seed" not in points.columns:
        return points
    return points.filter(~pl.col("added_seed").fill_null(False))


def mark_base_grid(points: pl.DataFrame) -> pl.DataFrame:
    """Add `in_grid` (the LR belongs to the base grid used by LR sensitivity) and `grid_rule`.

    Refinement runs are extra LRs between the last stable and first divergent grid point; they
    must not enter LR sensitivity, and both arms must be scored on the same points. In order:
    - "marked": some run carries a `refine` flag (config.json, summary.json, or the sweep
      folder's sweep.json grid): unmarked LRs run for every (arm, seed) of the depth;
    - "common": LRs run for every (depth, arm, seed) of the study, which also makes LR
      sensitivity comparable across depths (needs >= 2 such LRs);
    - "per depth": otherwise, LRs run for every (arm, seed) of that depth.
    """
    points = with_arm(points)
    marked = "refine" in points.columns and points["refine"].is_not_null().any()
    indexed = points.with_row_index("_row")
    full = full_curves(indexed)["_row"].implode()
    p = indexed.with_columns(_full=pl.col("_row").is_in(full))
    candidate = pl.col("_full") & (~pl.col("refine").fill_null(False) if marked else True)
    pairs, triples = pl.struct(ARM, "seed"), pl.struct("depth", ARM, "seed")
    p = p.with_columns(
        _per_depth=candidate & (pairs.filter(candidate).n_unique().over("depth", "lr")
                                == pairs.filter("_full").n_unique().over("depth")),
        _common=pl.col("_full") & (triples.filter("_full").n_unique().over("lr")
                                   == triples.filter("_full").n_unique()))
    scratch = ("_row", "_full", "_per_depth", "_common")
    if marked:
        return p.with_columns(in_grid="_per_depth", grid_rule=pl.lit("marked")).drop(scratch)
    common = p.filter("_common")["lr"].n_unique() >= 2
    return (p.with_columns(in_grid="_common" if common else "_per_depth",
                           grid_rule=pl.lit("common" if common else "per depth"))
            .drop(scratch))


def lr_sensitivity_per_seed(points: pl.DataFrame) -> pl.DataFrame:
    """Wortsman et al. 2023, Sec. 2.2: LR sensitivity = E_lr[min(loss(lr), init_loss)] - loss*.

    The expectation is the mean over the base-grid LRs (divide by the number of grid points) and
    loss* = min over the grid of loss(lr), computed for each (depth, arm, seed). Null when
    every grid point diverged (loss* undefined) or the grid has fewer than two points.
    """
    grid = with_losses(full_curves(points))
    if "in_grid" not in grid.columns:
        grid = mark_base_grid(grid)
    best = pl.col("loss").min()
    return (grid.filter("in_grid").group_by(*ARM_KEYS, "seed")
            .agg(grid_points=pl.len(), mean_clipped_loss=pl.col("loss_clipped").mean(),
                 best_loss=best, lr_min=pl.col("lr").min(), lr_max=pl.col("lr").max(),
                 grid_rule=pl.col("grid_rule").first())
            .with_columns(lr_sensitivity=pl.when(pl.col("best_loss").is_finite()
                                                 & (pl.col("grid_points") >= 2))
                          .then(pl.col("mean_clipped_loss") - pl.col("best_loss")))
            .sort(*ARM_KEYS, "seed"))


def lr_sensitivity(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm): LR sensitivity averaged over seeds, with the seed range."""
    return (lr_sensitivity_per_seed(points).group_by(ARM_KEYS)
            .agg(lr_sensitivity=pl.col("lr_sensitivity").mean(),
                 lr_sensitivity_lo=pl.col("lr_sensitivity").min(),
                 lr_sensitivity_hi=pl.col("lr_sensitivity").max(),
                 sensitivity_seeds=pl.col("lr_sensitivity").count(),
                 grid_points=pl.col("grid_points").max(),
                 grid_lr_min=pl.col("lr_min").min(), grid_lr_max=pl.col("lr_max").max(),
                 grid_rule=pl.col("grid_rule").first())
            .sort(ARM_KEYS))


def _geo_mean(col: str) -> pl.Expr:
    return pl.col(col).log().mean().exp()


def max_stable_lr_per_seed(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, arm, seed), over every LR run (grid and refinement points).

    first_divergent_lr: the smallest LR that diverged. max_stable_lr: the largest LR below it
    that did not diverge (so refinement runs between the last stable and first divergent grid
    point tighten it). Two kinds of censoring, both kept:
    - `censored` (above): no LR diverged; max_stable_lr is the largest LR run, a lower bound.
    - `below_grid`: every LR run diverged; the true value lies below the smallest LR run, and
      `max_stable_lr` holds that smallest LR as an upper bound (never left out).
    max_usable_lr: the same with "diverged or degraded" in place of "diverged" (a run that
    trained into a collapsed state is stable but not usable), censored the same way.
    """
    p = with_losses(full_curves(points), options.degraded_margin)
    first_div = pl.col("lr").filter(pl.col("diverged")).min()
    stable = pl.col("lr").filter(~pl.col("diverged") & (
        first_div.is_null() | (pl.col("lr") < first_div))).max()
    broken = pl.col("diverged") | pl.col("degraded")
    first_bad = pl.col("lr").filter(broken).min()
    usable = pl.col("lr").filter(~broken & (first_bad.is_null() | (pl.col("lr") < first_bad))).max()
    return (p.group_by(*ARM_KEYS, "seed")
            .agg(first_divergent_lr=first_div, _stable=stable, _lr_min=pl.col("lr").min(),
                 _usable=usable, first_degraded_lr=pl.col("lr").filter(pl.col("degraded")).min(),
                 lrs_run=pl.len())
            .with_columns(censored=pl.col("first_divergent_lr").is_null(),
                          below_grid=pl.col("_stable").is_null(),
                          max_stable_lr=pl.coalesce("_stable", "_lr_min"),
                          max_usable_lr=pl.coalesce("_usable", "_lr_min"),
                          usable_censored=pl.col("first_divergent_lr").is_null()
                          & pl.col("first_degraded_lr").is_null())
            .drop("_stable", "_lr_min", "_usable")
            .sort(*ARM_KEYS, "seed"))


def max_stable_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm): geometric mean over seeds of max stable LR (bounds included, see
    max_stable_lr_per_seed), the seed range, and how many seeds are censored either way."""
    return (max_stable_lr_per_seed(points).group_by(ARM_KEYS)
            .agg(max_stable_lr=_geo_mean("max_stable_lr"),
                 max_stable_lr_lo=pl.col("max_stable_lr").min(),
                 max_stable_lr_hi=pl.col("max_stable_lr").max(),
                 first_divergent_lr=_geo_mean("first_divergent_lr"),
                 max_usable_lr=_geo_mean("max_usable_lr"),
                 stable_seeds=pl.len(), censored_seeds=pl.col("censored").sum(),
                 below_grid_seeds=pl.col("below_grid").sum())
            .sort(ARM_KEYS))


def optimal_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm): the LR of lowest final loss per seed (geometric mean over seeds)
    and that best loss (mean and range over seeds). Diverged runs count as +inf, never best."""
    p = with_losses(full_curves(points)).filter(pl.col("loss").is_finite())
    per_seed = (p.group_by(*ARM_KEYS, "seed")
                .agg(optimal_lr=pl.col("lr").sort_by("loss").first(),
                     best_loss=pl.col("loss").min()))
    return (per_seed.group_by(ARM_KEYS)
            .agg(optimal_lr=_geo_mean("optimal_lr"), optimal_lr_lo=pl.col("optimal_lr").min(),
                 optimal_lr_hi=pl.col("optimal_lr").max(), best_loss=pl.col("best_loss").mean(),
                 best_loss_lo=pl.col("best_loss").min(), best_loss_hi=pl.col("best_loss").max(),
                 best_seeds=pl.len())
            .sort(ARM_KEYS))


def arm_table(points: pl.DataFrame) -> pl.DataFrame:
    """One row per (depth, arm): run counts, LR sensitivity, max stable LR, optimum."""
    p = with_losses(points)
    counts = p.group_by(ARM_KEYS).agg(runs=pl.len(), diverged=pl.col("diverged").sum(),
                                      nonfinite_final=pl.col("nonfinite_final").sum(),
                                      seeds=pl.col("seed").n_unique(), lrs=pl.col("lr").n_unique())
    out = counts
    for part in (lr_sensitivity(points), max_stable_lr(points), optimal_lr(points)):
        out = out.join(part, on=ARM_KEYS, how="left")
    return out.sort(ARM_KEYS)


def spike_table(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm, LR): how unstable training was short of diverging. loss_spikes in
    summary.json counts excursions of the training loss more than spike_margin above its running
    minimum; max_spike is the largest in nats. Runs written before spikes were counted give
    nulls (`counted` says how many runs had the count)."""
    has = "loss_spikes" in points.columns
    p = points if has else points.with_columns(loss_spikes=pl.lit(None, pl.Int64),
                                               max_spike=pl.lit(None, pl.Float64))
    return (with_losses(p).group_by("depth", ARM, "lr")
            .agg(runs=pl.len(), diverged=pl.col("diverged").sum(),
                 counted=pl.col("loss_spikes").count(),
                 runs_with_spikes=(pl.col("loss_spikes") > 0).sum(),
                 loss_spikes=pl.col("loss_spikes").sum(),
                 max_spike=pl.col("max_spike").max())
            .sort("depth", ARM, "lr"))


# --- paired tests -------------------------------------------------------------------------------

def seeds_label(n: int) -> str:
    """How many paired seeds a number rests on."""
    return f"n={n}"


def on_kinds(points: pl.DataFrame) -> list[str]:
    return sorted(k for k in with_arm(points)[ARM].unique().to_list() if k != OFF)


def paired_gaps(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """One row per (depth, on_kind, lr, seed) run in both arms: gap = off - on (clipped losses),
    with each arm's divergence and degradation."""
    p = with_losses(points, options.degraded_margin).select(
        "depth", ARM, "lr", "seed", "loss_clipped", "diverged", "degraded")
    off = p.filter(pl.col(ARM) == OFF).drop(ARM)
    frames = []
    for on in on_kinds(p):
        on_runs = p.filter(pl.col(ARM) == on).drop(ARM)
        frames.append(off.join(on_runs, on=["depth", "lr", "seed"], suffix="_on")
                      .rename({"loss_clipped": "loss_off", "loss_clipped_on": "loss_on",
                               "diverged": "diverged_off", "degraded": "degraded_off"})
                      .with_columns(on_kind=pl.lit(on), gap=pl.col("loss_off") - pl.col("loss_on")))
    if not frames:
        return pl.DataFrame(schema={"depth": pl.Int64, "lr": pl.Float64, "seed": pl.Int64,
                                    "loss_off": pl.Float64, "diverged_off": pl.Boolean,
                                    "degraded_off": pl.Boolean, "loss_on": pl.Float64,
                                    "diverged_on": pl.Boolean, "degraded_on": pl.Boolean,
                                    "on_kind": pl.String, "gap": pl.Float64})
    return pl.concat(frames).sort("on_kind", "depth", "lr", "seed")


# The outcome of one (depth, LR) cell, decided on the family-adjusted tests (docs/report.md)
OFF_WORSE, ON_WORSE, NO_DIFFERENCE, UNDETERMINED, UNINFORMATIVE, TOO_FEW = (
    "off worse", "on worse", "no difference", "undetermined", "uninformative", "too few seeds")

GAP_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "lr": pl.Float64, "pairs": pl.Int64,
              "mean_gap": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
              "gap_sd": pl.Float64, "seed_gaps": pl.String, "spread": pl.String,
              "p_off_worse": pl.Float64, "p_on_worse": pl.Float64, "p_equivalent": pl.Float64,
              "q_off_worse": pl.Float64, "q_on_worse": pl.Float64, "q_equivalent": pl.Float64,
              "family_size": pl.Int64, "decision": pl.String, "informative": pl.Boolean,
              "off_diverged": pl.Int64, "on_diverged": pl.Int64, "off_degraded": pl.Int64,
              "on_degraded": pl.Int64, "loss_off": pl.Float64, "loss_on": pl.Float64,
              "significant": pl.Boolean, "worse": pl.Boolean, "no_difference": pl.Boolean,
              "both_diverged": pl.Boolean, "needed": pl.Boolean}

BEST_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "pairs": pl.Int64,
               "best_loss_off": pl.Float64, "best_loss_on": pl.Float64, "mean_gap": pl.Float64,
               "ci_lo": pl.Float64, "ci_hi": pl.Float64, "seed_gaps": pl.String,
               "p_off_worse": pl.Float64, "q_off_worse": pl.Float64, "family_size": pl.Int64,
               "decision": pl.String}


def _cell(g: pl.DataFrame, options: Options) -> dict:
    """One (depth, on_kind, lr) cell's gaps with their interval and raw one-sided p-values.
    A cell where no run of either arm learned (each diverged or degraded) is uninformative:
    it tells nothing about whether the control is needed and is not tested."""
    values = g.sort("seed")["gap"].to_list()
    n = len(values)
    failed = (g["diverged_off"] | g["degraded_off"]).all() and (
        g["diverged_on"] | g["degraded_on"]).all()
    tested = n >= 2 and not failed
    lo, hi = S.interval(values) if n >= 2 else (None, None)
    return {
        "pairs": n, "mean_gap": float(np.mean(values)), "ci_lo": lo, "ci_hi": hi,
        "gap_sd": float(np.std(values, ddof=1)) if n > 1 else None,
        "seed_gaps": ", ".join(f"{v:+.3g}" for v in values), "spread": seeds_label(n),
        "p_off_worse": S.p_greater(values) if tested else None,
        "p_on_worse": S.p_less(values) if tested else None,
        "p_equivalent": S.p_equivalent(values, options.min_gap) if tested else None,
        "informative": not failed,
        "off_diverged": int(g["diverged_off"].sum()), "on_diverged": int(g["diverged_on"].sum()),
        "off_degraded": int(g["degraded_off"].sum()), "on_degraded": int(g["degraded_on"].sum()),
        "loss_off": float(g["loss_off"].mean()), "loss_on": float(g["loss_on"].mean()),
        "both_diverged": int(g["diverged_on"].sum()) == n}


def _decide(cell: dict, options: Options) -> str:
    if cell["pairs"] < 2:
        return TOO_FEW
    if not cell["informative"]:
        return UNINFORMATIVE
    a, m = options.alpha, options.min_gap
    if cell["q_off_worse"] is not None and cell["q_off_worse"] < a and cell["mean_gap"] >= m:
        return OFF_WORSE
    if cell["q_on_worse"] is not None and cell["q_on_worse"] < a and -cell["mean_gap"] >= m:
        return ON_WORSE
    if cell["q_equivalent"] is not None and cell["q_equivalent"] < a:
        return NO_DIFFERENCE
    return UNDETERMINED


def best_loss_gaps(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, on_kind, seed): each arm's best final loss over every LR run (its own optimal
    LR) and gap = off - on. Seeds where either arm never finished with a finite loss are out."""
    p = with_losses(full_curves(points)).filter(pl.col("loss").is_finite())
    best = p.group_by("depth", ARM, "seed").agg(best=pl.col("loss").min())
    off = best.filter(pl.col(ARM) == OFF).drop(ARM)
    frames = [off.join(best.filter(pl.col(ARM) == on).drop(ARM), on=["depth", "seed"],
                       suffix="_on").with_columns(on_kind=pl.lit(on))
              for on in on_kinds(points)]
    schema = {"depth": pl.Int64, "seed": pl.Int64, "best": pl.Float64, "best_on": pl.Float64,
              "on_kind": pl.String}
    return (pl.concat(frames) if frames else pl.DataFrame(schema=schema)).sort(
        "on_kind", "depth", "seed")


def h1_tests(points: pl.DataFrame, options: Options = Options()
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(gap cells, best-loss gaps): every test of H1's family, adjusted together per on_kind.

    Per (depth, on_kind, lr) cell, three claims fixed in advance, each one-directional: off
    worse (one-sided t, mean gap > 0), on worse (one-sided t, mean gap < 0), no difference
    (TOST, |mean gap| < min_gap). Per depth, one more: off's best loss (at its own optimal LR)
    is worse than on's. The family is all of these for one on_kind; Benjamini-Hochberg gives the
    q-values the decisions use (analysis.stats)."""
    gaps = paired_gaps(points, options)
    bests = best_loss_gaps(points)
    cells, best_rows = [], []
    for (on, depth, lr), g in gaps.group_by("on_kind", "depth", "lr", maintain_order=True):
        cells.append({"depth": depth, "on_kind": on, "lr": lr, **_cell(g, options)})
    for (on, depth), g in bests.group_by("on_kind", "depth", maintain_order=True):
        values = (g["best"] - g["best_on"]).to_list()
        lo, hi = S.interval(values)
        best_rows.append({"depth": depth, "on_kind": on, "pairs": len(values),
                          "best_loss_off": float(g["best"].mean()),
                          "best_loss_on": float(g["best_on"].mean()),
                          "mean_gap": float(np.mean(values)), "ci_lo": lo, "ci_hi": hi,
                          "seed_gaps": ", ".join(f"{v:+.3g}" for v in values),
                          "p_off_worse": S.p_greater(values)})
    for on in {c["on_kind"] for c in cells} | {b["on_kind"] for b in best_rows}:
        mine = [c for c in cells if c["on_kind"] == on]
        theirs = [b for b in best_rows if b["on_kind"] == on]
        keys = [(c, k) for c in mine for k in ("p_off_worse", "p_on_worse", "p_equivalent")]
        keys += [(b, "p_off_worse") for b in theirs]
        S.adjust_family(keys, options.alpha)
    for c in cells:
        c["decision"] = _decide(c, options)
        c.update(significant=None if c["q_off_worse"] is None else c["q_off_worse"] < options.alpha,
                 worse=c["decision"] == OFF_WORSE, no_difference=c["decision"] == NO_DIFFERENCE,
                 needed=None)
    for b in best_rows:
        b["decision"] = (TOO_FEW if b["pairs"] < 2 else OFF_WORSE if (
            b["q_off_worse"] is not None and b["q_off_worse"] < options.alpha) else UNDETERMINED)
    table = pl.DataFrame(cells, schema=GAP_SCHEMA)
    thresholds = necessity_threshold(points, options, table)
    table = (table.join(thresholds.select("depth", "on_kind", "threshold_lr", "censored"),
                        on=["depth", "on_kind"], how="left")
             .with_columns(needed=(pl.col("decision") == OFF_WORSE)
                           & ((pl.col("censored") == "below")
                              | (pl.col("lr") >= pl.col("threshold_lr")).fill_null(False)))
             .drop("threshold_lr", "censored").sort("on_kind", "depth", "lr"))
    return table, pl.DataFrame(best_rows, schema=BEST_SCHEMA).sort("on_kind", "depth")


def gap_table(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, on_kind, lr): the paired gaps, their 95% interval, the three tests and the
    cell's decision (see h1_tests)."""
    return h1_tests(points, options)[0]


THRESHOLD_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "seeds": pl.Int64,
                    "lrs": pl.Int64, "lr_min": pl.Float64, "lr_max": pl.Float64,
                    "min_gap": pl.Float64, "threshold_lr": pl.Float64, "censored": pl.String,
                    "ci_lo": pl.Float64, "ci_hi": pl.Float64, "threshold": pl.String,
                    "bracket_lo": pl.Float64, "bracket_hi": pl.Float64,
                    "not_needed_below": pl.Float64, "note": pl.String}


def threshold_rule(log_lrs: np.ndarray, means: np.ndarray, min_gap: float) -> np.ndarray:
    """log10 of the necessity threshold for each row of `means` (resamples x LRs, ascending):
    from the largest LR down, the LRs whose mean gap is >= min_gap; the threshold is where the
    mean gap, linear in log LR, crosses min_gap below the last of them. +inf when the largest
    LR's gap is under min_gap (censored above: not needed within the grid), -inf when every
    LR's is at least min_gap (censored below: needed already at the smallest LR)."""
    above = means >= min_gap
    out = np.full(means.shape[0], np.inf)
    top = above[:, -1]
    below_idx = np.where(~above, np.arange(means.shape[1]), -1).max(axis=1)  # last LR under
    out[top & (below_idx < 0)] = -np.inf
    rows = np.flatnonzero(top & (below_idx >= 0))
    k = below_idx[rows]
    lo, hi = means[rows, k], means[rows, k + 1]
    t = np.clip((min_gap - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0, 1.0)
    out[rows] = log_lrs[k] + t * (log_lrs[k + 1] - log_lrs[k])
    return out


def threshold_draws(gaps_by_seed: pl.DataFrame, cells: pl.DataFrame, options: Options
                    ) -> dict[tuple[str, int], tuple[float, np.ndarray, list[float]]]:
    """Per (on_kind, depth): (point estimate, bootstrap draws, informative LRs), thresholds in
    log10 LR. A parametric bootstrap over seeds: each informative LR's seed-mean gap is drawn
    as mean + se * T with T from Student's t on n - 1 degrees of freedom (independently per LR;
    a generator seeded from the on_kind and depth, so reports are reproducible). Resampling
    3 seeds with replacement has 10 distinct outcomes and too narrow a spread (its variance is
    (n - 1) / n of the t-interval's); the t draws carry the small-sample uncertainty the
    t-interval of each gap carries, and the rule turns them into threshold draws."""
    out = {}
    # a cell run by fewer seeds than is usual at its depth (a boundary-refinement LR that some
    # seeds' curves asked for) would enter with a wild t draw on 0 or 1 degrees of freedom
    usual = pl.col("pairs").median().over("on_kind", "depth")
    informative = cells.filter(pl.col("informative") & (pl.col("pairs") >= 2)
                               & (pl.col("pairs") >= usual))
    for (on, depth), c in informative.sort("lr").group_by("on_kind", "depth",
                                                          maintain_order=True):
        lrs = c["lr"].to_list()
        g = gaps_by_seed.filter((pl.col("on_kind") == on) & (pl.col("depth") == depth))
        rng = np.random.default_rng(zlib.crc32(f"{on}/{depth}".encode()))
        means, draws = [], []
        for lr in lrs:
            v = g.filter(pl.col("lr") == lr)["gap"].to_numpy()
            means.append(v.mean())
            se = v.std(ddof=1) / math.sqrt(len(v))
            draws.append(v.mean() + se * rng.standard_t(len(v) - 1, size=options.bootstrap))
        log_lrs = np.log10(lrs)
        point = float(threshold_rule(log_lrs, np.array([means]), options.min_gap)[0])
        out[(on, depth)] = (point, threshold_rule(log_lrs, np.stack(draws, axis=1),
                                                  options.min_gap), lrs)
    return out


def _lr_text(log_lr: float) -> str:
    return f"{10 ** log_lr:.3g}"


def necessity_threshold(points: pl.DataFrame, options: Options = Options(),
                        gaps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (depth, on_kind): the LR from which QK-norm is needed, with a 95% bootstrap interval.

    The rule (threshold_rule) reads the seed-mean gaps of the informative LRs run by at least
    the depth's usual (median) number of paired seeds (uninformative ones, where neither arm
    learned, and boundary-refinement LRs of single seeds are passed over). censored: "above" (not needed within the
    grid: shown as "> largest LR"), "below" (needed from the smallest LR: "<= smallest LR"),
    null when the threshold lies inside the grid. A censored threshold is never a number:
    threshold_lr is null. bracket_lo/hi: the LRs run either side of the crossing (where the
    sweep bisects). not_needed_below: the largest LR under the threshold whose cell is "no
    difference" by TOST.
    """
    if gaps is None:
        gaps = gap_table(points, options)
    draws = threshold_draws(paired_gaps(points, options), gaps, options)
    rows = []
    for (on, depth), g in gaps.sort("lr").group_by("on_kind", "depth", maintain_order=True):
        row = {"depth": depth, "on_kind": on, "seeds": int(g["pairs"].max()), "lrs": g.height,
               "lr_min": float(g["lr"].min()), "lr_max": float(g["lr"].max()),
               "min_gap": options.min_gap, "threshold_lr": None, "censored": None,
               "ci_lo": None, "ci_hi": None, "threshold": None, "bracket_lo": None,
               "bracket_hi": None, "not_needed_below": None, "note": ""}
        if (on, depth) not in draws:
            row["note"] = ("not enough data: needs >= 2 paired seeds" if g["pairs"].max() < 2
                           else "no informative LR: neither arm learned at any LR")
            rows.append(row)
            continue
        point, boot, lrs = draws[(on, depth)]
        lo, hi = np.percentile(boot, [2.5, 97.5], method="inverted_cdf")
        row.update(ci_lo=10 ** lo if np.isfinite(lo) else None,
                   ci_hi=10 ** hi if np.isfinite(hi) else None)
        interval = (f"[{'< ' + _lr_text(np.log10(lrs[0])) if lo == -np.inf else _lr_text(lo)}, "
                    f"{'> ' + _lr_text(np.log10(lrs[-1])) if hi == np.inf else _lr_text(hi)}]")
        if point == np.inf:
            row.update(censored="above", threshold=f"> {lrs[-1]:.3g} {interval}",
                       note=f"off not worse by min_gap at the largest informative LR {lrs[-1]:.3g}")
        elif point == -np.inf:
            row.update(censored="below", threshold=f"<= {lrs[0]:.3g} {interval}",
                       note="needed already at the smallest informative LR")
        else:
            k = max(i for i, lr in enumerate(lrs) if np.log10(lr) <= point)
            row.update(threshold_lr=10 ** point, threshold=f"{_lr_text(point)} {interval}",
                       bracket_lo=lrs[k], bracket_hi=lrs[min(k + 1, len(lrs) - 1)])
        limit = row["threshold_lr"] if row["threshold_lr"] is not None else (
            math.inf if point == np.inf else -math.inf)
        calm = g.filter((pl.col("decision") == NO_DIFFERENCE) & (pl.col("lr") < limit))
        row["not_needed_below"] = float(calm["lr"].max()) if calm.height else None
        rows.append(row)
    return pl.DataFrame(rows, schema=THRESHOLD_SCHEMA).sort("on_kind", "depth")


# --- per-run extras ---------------------------------------------------------------------------

# A probe named like a minimum is reduced over layers by min, one named like a peak or an
# outlier measure by max (the worst layer is the one that matters), anything else by mean.
MIN_PATTERN = r"(^|_)min(_|$)"
MAX_PATTERN = r"(^|_)max(_|$)|kurtosis|outlier"
WHOLE_MODEL = -1  # the layer of whole-model rows and of values pooled over all layers


def layer_reduction(name: str) -> str:
    """How a probe is reduced over layers: "min", "max" or "mean" (see the patterns above)."""
    if re.search(MIN_PATTERN, name):
        return "min"
    return "max" if re.search(MAX_PATTERN, name) else "mean"


def probe_over_layers(probes: pl.LazyFrame) -> pl.LazyFrame:
    """(run, step, name) -> one value: the whole-model (layer -1) row when there is one, else
    the per-layer values reduced by `layer_reduction`. Non-finite values are dropped."""
    value = pl.col("value")
    per_layer = pl.col("layer") != WHOLE_MODEL
    reduced = (probes.filter(value.is_finite())
               .group_by("run", "step", "name")
               .agg(whole=value.filter(~per_layer).first(), lo=value.filter(per_layer).min(),
                    hi=value.filter(per_layer).max(), mean=value.filter(per_layer).mean()))
    name = pl.col("name")
    by_name = (pl.when(name.str.contains(MIN_PATTERN)).then("lo")
               .when(name.str.contains(MAX_PATTERN)).then("hi").otherwise("mean"))
    return reduced.select("run", "step", "name", value=pl.coalesce("whole", by_name))


# Worst value over training: (probe name, "min" or "max"). Attention entropy collapses towards 0,
# the others grow; the step is when the worst value was reached.
WORST = (("attention_entropy_min_head", "min"), ("attention_entropy_mean", "min"),
         ("max_attention_logit", "max"), ("residual_kurtosis", "max"),
         ("residual_max_abs_over_rms", "max"), ("output_logit_max", "max"))


def probe_summary(per_step: pl.DataFrame) -> pl.DataFrame:
    """Per run: final_<name> for every probe name found (each run's last probe step), and the
    worst value over training with its step for the names in WORST: worst_<name>,
    worst_<name>_step (peak_max_attention_logit is worst_max_attention_logit).

    `per_step` is `probe_over_layers(...)` collected.
    """
    if per_step.is_empty():
        return pl.DataFrame(schema={"run": pl.String})
    out = (per_step.filter(pl.col("step") == pl.col("step").max().over("run", "name"))
           .with_columns(pl.format("final_{}", "name").alias("column"))
           .pivot(on="column", index="run", values="value"))
    for name, way in WORST:
        series = per_step.filter(pl.col("name") == name)
        if series.is_empty():
            continue
        order = pl.col("value") if way == "min" else -pl.col("value")
        worst = (series.sort("step").group_by("run")
                 .agg(pl.col("value").sort_by(order).first().alias(f"worst_{name}"),
                      pl.col("step").sort_by(order).first().alias(f"worst_{name}_step")))
        out = out.join(worst, on="run", how="left")
    if "worst_max_attention_logit" in out.columns:
        out = out.with_columns(peak_max_attention_logit=pl.col("worst_max_attention_logit"))
    return out


def steps_to_threshold(metrics: pl.LazyFrame, runs: pl.DataFrame,
                       thresholds: pl.DataFrame) -> pl.DataFrame:
    """Per run: the first eval step (and tokens) whose val loss is <= its depth's threshold.

    `thresholds` has columns depth, loss_threshold. Null when never reached.
    """
    depth_of = runs.select("run", "depth").lazy()
    return (metrics.filter(pl.col("val_loss").is_not_null())
            .join(depth_of, on="run").join(thresholds.lazy(), on="depth")
            .filter(pl.col("val_loss") <= pl.col("loss_threshold"))
            .group_by("run").agg(steps_to_threshold=pl.col("step").min(),
                                 tokens_to_threshold=pl.col("tokens").min())
            .collect())


def default_loss_thresholds(points: pl.DataFrame, metrics: pl.LazyFrame) -> pl.DataFrame:
    """Per depth, a loss level both arms reach well before the end of training.

    For each arm and seed take its best run (lowest clipped final loss) and that run's val loss
    at the first evaluation at or after half of its steps; the level is the largest of these.
    Every arm's best run has reached it by mid-training, so steps-to-threshold compares how
    fast the arms get there rather than whether they get there at all.
    """
    best = (with_losses(points).filter(pl.col("loss").is_finite())
            .sort("loss").group_by("depth", ARM, "seed").first()
            .select("run", "depth", "steps"))
    if best.is_empty():
        return pl.DataFrame(schema={"depth": pl.Int64, "loss_threshold": pl.Float64})
    half = (metrics.filter(pl.col("val_loss").is_not_null())
            .join(best.lazy(), on="run")
            .filter(pl.col("step") * 2 >= pl.col("steps"))
            .sort("step").group_by("run").agg(pl.col("depth").first(),
                                              half_loss=pl.col("val_loss").first())
            .collect())
    return (half.filter(pl.col("half_loss").is_finite()).group_by("depth")
            .agg(loss_threshold=pl.col("half_loss").max()).sort("depth"))
