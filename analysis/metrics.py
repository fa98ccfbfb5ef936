"""Study metrics in Polars (docs/report.md writes every rule out) over a "points" frame, a row
per finished run (depth, arm, lr, seed, status, init_loss, final_val_loss); the off arm (`OFF`)
is compared with every other arm by the same rules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from qkstudy.arms import OFF
from qkstudy.variants import NONE, VARIANTS
from qkstudy.probe_registry import PROBES, WHOLE_MODEL
from qkstudy.summaries import DEGRADED_MARGIN, scored_loss


ARM = "arm"
ARM_KEYS = ("depth", ARM)


def arm_words(arm: str) -> str:
    """An arm in words: "QK-norm off", "QK-norm on (rmsnorm)", "attention soft-cap 50"."""
    if arm == OFF:
        return NONE.label
    prefixes = {"softcap": "attention soft-cap ", "zloss": "z-loss "}
    return " + ".join(VARIANTS[part].label if part in VARIANTS else next(
        (w + part.removeprefix(k) for k, w in prefixes.items() if part.startswith(k)), part)
        for part in arm.split("+"))


def control_words(arm: str) -> str:
    """The compared arm as the subject of a claim: "QK-norm", "attention soft-cap 50", ..."""
    return "QK-norm" if arm in VARIANTS else arm_words(arm)


@dataclass(frozen=True)
class Options:
    """Knobs of the study metrics and verdicts (docs/report.md gives each its reason)."""

    alpha: float = 0.05  # each hypothesis's family: error level (H1 BH, H2 and H3 Holm)
    min_gap: float = 0.1  # the margin in nats: "needed", "no difference" and the onset
    # a stable run ending above the unigram entropy minus this learned only token frequencies
    degraded_margin: float = DEGRADED_MARGIN
    lr_ratio_margin: float = 2.0  # H2: on/off max usable LR ratios within it are "equivalent"
    # "equivalent" is tested only where every boundary is bracketed at least this finely
    equivalence_bracket: float = 1.41
    slope_margin: float = 0.25  # H3: |slope| below it (decades per doubling) is "equal"
    bootstrap: int = 2000  # whole-seed resamples for every interval spanning LRs
    threshold_widening: float = 2.5  # the onset's draws widened about the estimate
    # H3's slope draws widened (2.75: the calibration's smallest step in 0.25 with no false H3
    # claim in the null and equal-onset scenarios, seeds' onsets scattered); 0: t(0.975, n - 1) / z
    slope_widening: float = 2.75
    draw_key: str = ""  # appended to the seed draws' keys (the calibration's own per study)


def with_losses(points: pl.DataFrame, degraded_margin: float = Options.degraded_margin
                ) -> pl.DataFrame:
    """Add diverged, degraded, nonfinite_final, loss (+inf when diverged or not finite) and
    loss_clipped = min(loss, init_loss) (Wortsman et al. 2023, Sec. 2.2); a run without its own
    init_loss borrows its arm's mean, then its depth's."""
    init = pl.coalesce(pl.col("init_loss"), pl.col("init_loss").mean().over(ARM_KEYS),
                       pl.col("init_loss").mean().over("depth"))
    final = pl.col("final_val_loss").cast(pl.Float64)
    bad_final = final.is_null() | ~final.is_finite()
    diverged = pl.col("status") == "diverged"
    if "unigram_entropy" not in points.columns:
        points = points.with_columns(unigram_entropy=pl.lit(None, pl.Float64))
    p = points.with_columns(diverged=diverged.fill_null(False), init_loss=init)
    clipped, degraded = scored_loss(*(p[c].cast(pl.Float64).to_numpy() for c in (
        "final_val_loss", "init_loss")), p["diverged"].to_numpy(),
        p["unigram_entropy"].cast(pl.Float64).to_numpy(), degraded_margin)
    return (points.with_columns(diverged=diverged, nonfinite_final=~diverged & bad_final,
                                degraded=pl.Series(degraded, dtype=pl.Boolean),
                                loss=pl.when(diverged | bad_final).then(pl.lit(math.inf))
                                .otherwise(final), init_loss=init)
            .with_columns(loss_clipped=pl.Series(clipped, dtype=pl.Float64)))


def full_curves(points: pl.DataFrame) -> pl.DataFrame:
    """The runs of the sweep's base seeds: a seed added by adaptive sampling has no LR curve."""
    if "added_seed" not in points.columns:
        return points
    return points.filter(~pl.col("added_seed").fill_null(False))


def mark_base_grid(points: pl.DataFrame) -> pl.DataFrame:
    """Add `in_grid` (the LR is in the base grid LR sensitivity uses) and `grid_rule`: "marked"
    (runs carry `refine`), else "common" (LRs run for every (depth, arm, seed), when >= 2), else
    "per depth" (LRs run for every (arm, seed) of the depth)."""
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
    """Per (depth, arm, seed): mean clipped loss over the base grid minus its best."""
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


def _geo_mean(col: str) -> pl.Expr:
    return pl.col(col).log().mean().exp()


def _spread(col: str, centre: pl.Expr) -> list[pl.Expr]:
    """`col` over seeds: its centre, and its smallest and largest as col_lo and col_hi."""
    return [centre.alias(col), pl.col(col).min().alias(f"{col}_lo"),
            pl.col(col).max().alias(f"{col}_hi")]


def max_usable_lr_per_seed(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, arm, seed) curve: best_lr (lowest final loss); max_usable_lr, the largest LR
    up to which no run from best_lr on diverged or degraded (null when the best degraded);
    first_failed_lr; lower_bound (nothing above best_lr failed); first_divergent_lr."""
    p = with_losses(full_curves(points), options.degraded_margin).with_columns(
        failed=pl.col("diverged") | pl.col("degraded") | ~pl.col("loss").is_finite())
    best = (p.filter(pl.col("loss").is_finite()).sort("loss")
            .group_by(*ARM_KEYS, "seed").agg(best_lr=pl.col("lr").first()))
    above = pl.col("lr") >= pl.col("best_lr")
    first_failed = pl.col("lr").filter(above & pl.col("failed")).min()
    usable = pl.col("lr").filter(above & ~pl.col("failed")
                                 & (first_failed.is_null() | (pl.col("lr") < first_failed)))
    return (p.join(best, on=[*ARM_KEYS, "seed"], how="left").group_by(*ARM_KEYS, "seed")
            .agg(best_lr=pl.col("best_lr").first(), max_usable_lr=usable.max(),
                 first_failed_lr=first_failed,
                 first_divergent_lr=pl.col("lr").filter(pl.col("diverged")).min(),
                 lrs_run=pl.len())
            .with_columns(lower_bound=pl.col("first_failed_lr").is_null()
                          & pl.col("max_usable_lr").is_not_null())
            .sort(*ARM_KEYS, "seed"))


def arm_table(points: pl.DataFrame) -> pl.DataFrame:
    """One row per (depth, arm): runs, LR sensitivity, max usable and optimal LR."""
    p = with_losses(points)
    counts = p.group_by(ARM_KEYS).agg(runs=pl.len(), diverged=pl.col("diverged").sum(),
                                      nonfinite_final=pl.col("nonfinite_final").sum(),
                                      seeds=pl.col("seed").n_unique(), lrs=pl.col("lr").n_unique())
    sensitivity = (lr_sensitivity_per_seed(points).group_by(ARM_KEYS)
                   .agg(*_spread("lr_sensitivity", pl.col("lr_sensitivity").mean()),
                        sensitivity_seeds=pl.col("lr_sensitivity").count(),
                        grid_points=pl.col("grid_points").max(),
                        grid_lr_min=pl.col("lr_min").min(), grid_lr_max=pl.col("lr_max").max(),
                        grid_rule=pl.col("grid_rule").first()))
    usable = (max_usable_lr_per_seed(points).group_by(ARM_KEYS)
              .agg(*_spread("max_usable_lr", _geo_mean("max_usable_lr")),
                   first_divergent_lr=_geo_mean("first_divergent_lr"),
                   usable_seeds=pl.col("max_usable_lr").count(),
                   lower_bound_seeds=pl.col("lower_bound").sum()))
    optimum = (with_losses(full_curves(points)).filter(pl.col("loss").is_finite())
               .group_by(*ARM_KEYS, "seed")
               .agg(optimal_lr=pl.col("lr").sort_by("loss").first(),
                    best_loss=pl.col("loss").min())
               .group_by(ARM_KEYS)
               .agg(*_spread("optimal_lr", _geo_mean("optimal_lr")),
                    *_spread("best_loss", pl.col("best_loss").mean()), best_seeds=pl.len()))
    for part in (sensitivity, usable, optimum):
        counts = counts.join(part, on=ARM_KEYS, how="left")
    return counts.sort(ARM_KEYS)


def spike_table(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, arm, LR): loss spikes short of divergence."""
    return (with_losses(points).group_by("depth", ARM, "lr")
            .agg(runs=pl.len(), diverged=pl.col("diverged").sum(),
                 counted=pl.col("loss_spikes").count(),
                 runs_with_spikes=(pl.col("loss_spikes") > 0).sum(),
                 loss_spikes=pl.col("loss_spikes").sum(),
                 max_spike=pl.col("max_spike").max())
            .sort("depth", ARM, "lr"))


def compared_arms(points: pl.DataFrame) -> list[str]:
    return sorted(k for k in points[ARM].unique().to_list() if k != OFF)


def pair_arms(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The off arm's rows joined on `keys` to each compared arm's (their columns suffixed _on),
    with compared_arm; an empty frame without a compared arm."""
    off = frame.filter(pl.col(ARM) == OFF).drop(ARM)
    return pl.concat([off.join(frame.filter(pl.col(ARM) == pl.lit(on, pl.String)).drop(ARM),
                               on=keys, suffix="_on")
                      .with_columns(compared_arm=pl.lit(on, pl.String))
                      for on in compared_arms(frame) or [None]])


def paired_gaps(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """One row per (depth, compared_arm, lr, seed) in both arms: gap = off - on."""
    p = with_losses(points, options.degraded_margin).select(
        "depth", ARM, "lr", "seed", "loss_clipped", "diverged", "degraded")
    return (pair_arms(p, ["depth", "lr", "seed"])
            .rename({"loss_clipped": "loss_off", "loss_clipped_on": "loss_on",
                     "diverged": "diverged_off", "degraded": "degraded_off"})
            .with_columns(gap=pl.col("loss_off") - pl.col("loss_on"))
            .sort("compared_arm", "depth", "lr", "seed"))


def probe_over_layers(probes: pl.LazyFrame) -> pl.LazyFrame:
    """(run, step, name) -> the whole-model value, else layers reduced per the registry."""
    value = pl.col("value")
    per_layer = pl.col("layer") != WHOLE_MODEL
    reduced = (probes.filter(value.is_finite())
               .group_by("run", "step", "name")
               .agg(whole=value.filter(~per_layer).first(), lo=value.filter(per_layer).min(),
                    hi=value.filter(per_layer).max(), mean=value.filter(per_layer).mean()))
    reduction = pl.col("name").str.split("/").list.first().replace_strict(
        {n: p.over_layers for n, p in PROBES.items()}, default="mean", return_dtype=pl.String)
    by_name = (pl.when(reduction == "min").then("lo")
               .when(reduction == "max").then("hi").otherwise("mean"))
    return reduced.select("run", "step", "name", value=pl.coalesce("whole", by_name))


# (probe name, "min" or "max"): the worst value over training of each tracked probe
WORST = tuple((p.name, "max" if p.worse == "larger" else "min")
              for p in PROBES.values() if p.tracked)


def probe_summary(per_step: pl.DataFrame) -> pl.DataFrame:
    """Per run: final_<probe>, worst_<probe> (and its step) and peak_max_attention_logit."""
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
    """Per run: the first eval step (and tokens) at or below its depth's loss_threshold."""
    depth_of = runs.select("run", "depth").lazy()
    return (metrics.filter(pl.col("val_loss").is_not_null())
            .join(depth_of, on="run").join(thresholds.lazy(), on="depth")
            .filter(pl.col("val_loss") <= pl.col("loss_threshold"))
            .group_by("run").agg(steps_to_threshold=pl.col("step").min(),
                                 tokens_to_threshold=pl.col("tokens").min())
            .collect())


def default_loss_thresholds(points: pl.DataFrame, metrics: pl.LazyFrame) -> pl.DataFrame:
    """Per depth: the largest best-run val loss at half its steps (every arm reaches it)."""
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
