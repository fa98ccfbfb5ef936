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
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

OFF = "none"
ARM = "arm"
ARM_KEYS = ("depth", ARM)
QK_NORM_KINDS = ("rmsnorm", "layernorm")


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
        if part in QK_NORM_KINDS:
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
    return "QK-norm" if arm in QK_NORM_KINDS else arm_words(arm)


@dataclass(frozen=True)
class Options:
    """Knobs of the study metrics (all visible in the report)."""

    alpha: float = 0.05  # one-sided paired t-tests over seeds: "off worse than on" etc.
    # the smallest gap in nats that counts as a difference at all (0.02 nats = 2% perplexity):
    # a consistent but tinier gap is "no difference", never "needed"
    min_gap: float = 0.02


# --- scoring ------------------------------------------------------------------------------------

def with_losses(points: pl.DataFrame) -> pl.DataFrame:
    """Add `diverged`, `loss` (+inf for a diverged run or a non-finite final loss) and
    `loss_clipped` = min(loss, init_loss). No run is ever dropped.

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
    return (points.with_columns(diverged=diverged, nonfinite_final=~diverged & bad_final,
                                loss=pl.when(diverged | bad_final).then(pl.lit(math.inf))
                                .otherwise(final), init_loss=init)
            .with_columns(loss_clipped=pl.min_horizontal("loss", "init_loss")))


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
    candidate = ~pl.col("refine").fill_null(False) if marked else pl.lit(True)
    pairs, triples = pl.struct(ARM, "seed"), pl.struct("depth", ARM, "seed")
    p = points.with_columns(
        _per_depth=candidate & (pairs.filter(candidate).n_unique().over("depth", "lr")
                                == pairs.n_unique().over("depth")),
        _common=triples.n_unique().over("lr") == triples.n_unique())
    if marked:
        return p.with_columns(in_grid="_per_depth", grid_rule=pl.lit("marked")).drop(
            "_per_depth", "_common")
    common = p.filter("_common")["lr"].n_unique() >= 2
    return (p.with_columns(in_grid="_common" if common else "_per_depth",
                           grid_rule=pl.lit("common" if common else "per depth"))
            .drop("_per_depth", "_common"))


def lr_sensitivity_per_seed(points: pl.DataFrame) -> pl.DataFrame:
    """Wortsman et al. 2023, Sec. 2.2: LR sensitivity = E_lr[min(loss(lr), init_loss)] - loss*.

    The expectation is the mean over the base-grid LRs (divide by the number of grid points) and
    loss* = min over the grid of loss(lr), computed for each (depth, arm, seed). Null when
    every grid point diverged (loss* undefined) or the grid has fewer than two points.
    """
    grid = with_losses(points)
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


def max_stable_lr_per_seed(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm, seed), over every LR run (grid and refinement points).

    first_divergent_lr: the smallest LR that diverged. max_stable_lr: the largest LR below it
    that did not diverge (so refinement runs between the last stable and first divergent grid
    point tighten it). Two kinds of censoring, both kept:
    - `censored` (above): no LR diverged; max_stable_lr is the largest LR run, a lower bound.
    - `below_grid`: every LR run diverged; the true value lies below the smallest LR run, and
      `max_stable_lr` holds that smallest LR as an upper bound (never left out).
    """
    p = with_losses(points)
    first_div = pl.col("lr").filter(pl.col("diverged")).min()
    stable = pl.col("lr").filter(~pl.col("diverged") & (
        first_div.is_null() | (pl.col("lr") < first_div))).max()
    return (p.group_by(*ARM_KEYS, "seed")
            .agg(first_divergent_lr=first_div, _stable=stable, _lr_min=pl.col("lr").min(),
                 lrs_run=pl.len())
            .with_columns(censored=pl.col("first_divergent_lr").is_null(),
                          below_grid=pl.col("_stable").is_null(),
                          max_stable_lr=pl.coalesce("_stable", "_lr_min"))
            .drop("_stable", "_lr_min")
            .sort(*ARM_KEYS, "seed"))


def max_stable_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm): geometric mean over seeds of max stable LR (bounds included, see
    max_stable_lr_per_seed), the seed range, and how many seeds are censored either way."""
    return (max_stable_lr_per_seed(points).group_by(ARM_KEYS)
            .agg(max_stable_lr=_geo_mean("max_stable_lr"),
                 max_stable_lr_lo=pl.col("max_stable_lr").min(),
                 max_stable_lr_hi=pl.col("max_stable_lr").max(),
                 first_divergent_lr=_geo_mean("first_divergent_lr"),
                 stable_seeds=pl.len(), censored_seeds=pl.col("censored").sum(),
                 below_grid_seeds=pl.col("below_grid").sum())
            .sort(ARM_KEYS))


def optimal_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm): the LR of lowest final loss per seed (geometric mean over seeds)
    and that best loss (mean and range over seeds). Diverged runs count as +inf, never best."""
    p = with_losses(points).filter(pl.col("loss").is_finite())
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

def paired_t(diffs: list[float] | np.ndarray) -> tuple[float | None, float | None]:
    """One-sided paired t-test of mean(diffs) > 0: (t, p). (None, None) with fewer than 2
    values. With no spread at all, p is 0 when the mean is positive and 1 otherwise."""
    d = np.asarray([x for x in diffs if x is not None and math.isfinite(x)], dtype=float)
    n = len(d)
    if n < 2:
        return None, None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return (math.inf if mean > 0 else -math.inf if mean < 0 else 0.0,
                0.0 if mean > 0 else 1.0)
    t = mean / (sd / math.sqrt(n))
    return t, float(stats.t.sf(t, df=n - 1))


def seeds_label(n: int) -> str:
    """How much a spread over n seeds can bear: a range for n < 3, never an interval."""
    return f"range, n={n}" if n < 3 else f"n={n}"


def on_kinds(points: pl.DataFrame) -> list[str]:
    return sorted(k for k in with_arm(points)[ARM].unique().to_list() if k != OFF)


def paired_gaps(points: pl.DataFrame) -> pl.DataFrame:
    """One row per (depth, on_kind, lr, seed) run in both arms: gap = off - on (clipped losses)."""
    p = with_losses(points).select("depth", ARM, "lr", "seed", "loss_clipped", "diverged")
    off = p.filter(pl.col(ARM) == OFF).drop(ARM)
    frames = []
    for on in on_kinds(p):
        on_runs = p.filter(pl.col(ARM) == on).drop(ARM)
        frames.append(off.join(on_runs, on=["depth", "lr", "seed"], suffix="_on")
                      .rename({"loss_clipped": "loss_off", "loss_clipped_on": "loss_on",
                               "diverged": "diverged_off"})
                      .with_columns(on_kind=pl.lit(on), gap=pl.col("loss_off") - pl.col("loss_on")))
    if not frames:
        return pl.DataFrame(schema={"depth": pl.Int64, "lr": pl.Float64, "seed": pl.Int64,
                                    "loss_off": pl.Float64, "diverged_off": pl.Boolean,
                                    "loss_on": pl.Float64, "diverged_on": pl.Boolean,
                                    "on_kind": pl.String, "gap": pl.Float64})
    return pl.concat(frames).sort("on_kind", "depth", "lr", "seed")


GAP_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "lr": pl.Float64, "pairs": pl.Int64,
              "mean_gap": pl.Float64, "gap_sd": pl.Float64, "gap_lo": pl.Float64,
              "gap_hi": pl.Float64, "seed_gaps": pl.String, "spread": pl.String,
              "t": pl.Float64, "p_off_worse": pl.Float64, "p_on_worse": pl.Float64,
              "off_diverged": pl.Int64, "on_diverged": pl.Int64, "loss_off": pl.Float64,
              "loss_on": pl.Float64, "significant": pl.Boolean, "worse": pl.Boolean,
              "no_difference": pl.Boolean,
              "both_diverged": pl.Boolean, "needed": pl.Boolean}


def gap_table(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, on_kind, lr): the paired gaps over seeds and their one-sided paired t-test.

    significant: off worse than on, p_off_worse < alpha (needs >= 2 paired seeds; null below).
    worse: significant and the mean gap is at least min_gap (a difference that matters).
    no_difference: |mean gap| < min_gap and neither arm diverged (practically equal).
    both_diverged: the on arm diverged in every seed, so the LR says nothing about necessity.
    needed: at or above the depth's necessity threshold (see necessity_threshold).
    """
    rows = []
    gaps = paired_gaps(points)
    for (on, depth, lr), g in gaps.group_by("on_kind", "depth", "lr", maintain_order=True):
        values = g.sort("seed")["gap"].to_list()
        n = len(values)
        t, p_off = paired_t(values)
        mean = float(np.mean(values))
        _, p_on = paired_t([-v for v in values])
        off_div, on_div = int(g["diverged_off"].sum()), int(g["diverged_on"].sum())
        rows.append({
            "depth": depth, "on_kind": on, "lr": lr, "pairs": n,
            "mean_gap": mean, "gap_sd": float(np.std(values, ddof=1))
            if n > 1 else None, "gap_lo": min(values), "gap_hi": max(values),
            "seed_gaps": ", ".join(f"{v:+.3g}" for v in values), "spread": seeds_label(n),
            "t": t, "p_off_worse": p_off, "p_on_worse": p_on,
            "off_diverged": off_div, "on_diverged": on_div,
            "loss_off": float(g["loss_off"].mean()), "loss_on": float(g["loss_on"].mean()),
            "significant": None if p_off is None else p_off < options.alpha,
            "worse": None if p_off is None else (p_off < options.alpha
                                                 and mean >= options.min_gap),
            "no_difference": None if p_off is None else (
                abs(mean) < options.min_gap and off_div == on_div == 0),
            "both_diverged": on_div == n, "needed": None})
    table = pl.DataFrame(rows, schema=GAP_SCHEMA)
    thresholds = necessity_threshold(points, options, table)
    return (table.join(thresholds.select("depth", "on_kind", "threshold_lr"),
                       on=["depth", "on_kind"], how="left")
            .with_columns(needed=pl.when(pl.col("worse").is_not_null())
                          .then(pl.col("threshold_lr").is_not_null()
                                & (pl.col("lr") >= pl.col("threshold_lr"))
                                & ~pl.col("both_diverged")))
            .drop("threshold_lr").sort("on_kind", "depth", "lr"))


THRESHOLD_SCHEMA = {"depth": pl.Int64, "on_kind": pl.String, "seeds": pl.Int64,
                    "lrs": pl.Int64, "lr_min": pl.Float64, "lr_max": pl.Float64,
                    "alpha": pl.Float64, "min_gap": pl.Float64, "threshold_lr": pl.Float64,
                    "not_needed_below": pl.Float64, "seed_gaps_at_threshold": pl.String,
                    "spread": pl.String, "note": pl.String}


def necessity_threshold(points: pl.DataFrame, options: Options = Options(),
                        gaps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (depth, on_kind): the smallest LR from which QK-norm is needed at every larger LR.

    Needed at an LR = the one-sided paired t-test over seeds finds off worse than on
    (p < alpha) by a mean gap of at least min_gap nats. LRs where the on arm diverged in every seed (both arms fail) are passed over:
    they tell nothing about whether QK-norm is needed. The threshold is the smallest tested LR
    x that is needed, with every larger tested LR needed too; `not_needed_below` is the
    largest tested LR under it (the grid brackets the boundary: no interval is claimed).
    Fewer than 2 paired seeds: no test, "not enough data".
    """
    if gaps is None:
        gaps = gap_table(points, options)
    rows = []
    for (on, depth), g in gaps.sort("lr").group_by("on_kind", "depth", maintain_order=True):
        tested = g.filter(pl.col("significant").is_not_null())
        row = {"depth": depth, "on_kind": on, "seeds": int(g["pairs"].max()), "lrs": g.height,
               "lr_min": float(g["lr"].min()), "lr_max": float(g["lr"].max()),
               "alpha": options.alpha, "min_gap": options.min_gap, "threshold_lr": None,
               "not_needed_below": None,
               "seed_gaps_at_threshold": None, "spread": seeds_label(int(g["pairs"].max())),
               "note": ""}
        if tested.is_empty():
            row["note"] = "not enough data: the paired test needs >= 2 seeds in both arms"
            rows.append(row)
            continue
        informative = tested.filter(~pl.col("both_diverged"))
        threshold = None
        for r in reversed(informative.rows(named=True)):  # from the largest LR down
            if not r["worse"]:
                break
            threshold = r
        if threshold is None:
            row["note"] = (f"off never consistently worse up to lr {row['lr_max']:.3g}"
                           if informative.height else "the on arm diverged at every LR")
        else:
            below = tested.filter(pl.col("lr") < threshold["lr"])
            row.update(threshold_lr=threshold["lr"], seed_gaps_at_threshold=threshold["seed_gaps"],
                       spread=threshold["spread"],
                       not_needed_below=float(below["lr"].max()) if below.height else None)
            if not below.height:
                row["note"] = "needed already at the smallest LR run"
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
