"""Altair charts of the study. Each `*_chart` aggregates in Polars first, then encodes.

Charts get their data inline as plain values (non-finite numbers become null), and are saved
as PNG and SVG through vl-convert and as a self-contained interactive HTML page.
"""

from __future__ import annotations

import math
from pathlib import Path

import altair as alt
import polars as pl
import vl_convert as vlc

from . import metrics as M

PANEL_W, PANEL_H = 230, 170
OFF_LABEL = M.arm_words(M.OFF)
ATTENTION_PROBES = ("max_attention_logit", "attention_entropy_mean", "attention_entropy_min_head")
# Off is always the warm orange, QK-norm arms greens/purples, rival controls further colours.
ARM_COLORS = {M.OFF: "#d95f02", "rmsnorm": "#1b9e77", "layernorm": "#7570b3"}
MORE_COLORS = ("#e7298a", "#1f78b4", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def arm_label(arm: str) -> str:
    """The legend entry of an arm: the arm in words (metrics.arm_words)."""
    return M.arm_words(arm)


def arm_expr() -> pl.Expr:
    """The `arm` column (an arm name) as its legend label."""
    return pl.col(M.ARM).map_elements(arm_label, return_dtype=pl.String).alias(M.ARM)


def arm_scale(arms: list[str]) -> alt.Scale:
    """One colour per arm, the same in every chart: off first, then the arms by name."""
    names = sorted(set(arms), key=lambda k: (k != M.OFF, k not in ARM_COLORS, k))
    rest = iter(MORE_COLORS * (1 + len(names) // len(MORE_COLORS)))
    return alt.Scale(domain=[arm_label(k) for k in names],
                     range=[ARM_COLORS.get(k) or next(rest) for k in names])


def values(df: pl.DataFrame) -> alt.Data:
    """Inline data with NaN and +-inf as null (JSON has neither)."""
    floats = [c for c, t in df.schema.items() if t.is_float()]
    clean = df.with_columns([pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c)
                             for c in floats])
    return alt.Data(values=clean.to_dicts())


def _log_x(title: str = "learning rate (log)") -> alt.X:
    return alt.X("lr:Q", scale=alt.Scale(type="log"), title=title, axis=alt.Axis(format=".0e"))


# --- final loss vs LR -------------------------------------------------------------------------

def loss_vs_lr_chart(points: pl.DataFrame, twins: pl.DataFrame | None = None) -> alt.FacetChart:
    """Final val loss vs LR per depth: seed mean line, min-max band, diverged runs as crosses
    at their init loss (Wortsman clipping), other-framework runs as open diamonds."""
    points = M.with_arm(points)
    p = M.with_losses(points).with_columns(arm_expr())
    cells = (p.group_by("depth", "arm", "lr")
             .agg(loss=pl.col("loss_clipped").mean(), lo=pl.col("loss_clipped").min(),
                  hi=pl.col("loss_clipped").max(), seeds=pl.len(),
                  diverged=pl.col("diverged").sum())
             .with_columns(kind=pl.lit("mean")))
    marks = (p.filter("diverged").select("depth", "arm", "lr", loss="loss_clipped", seed="seed")
             .with_columns(kind=pl.lit("diverged")))
    frames = [cells, marks]
    if twins is not None and twins.height:
        other = (M.with_losses(M.with_arm(twins)).with_columns(arm_expr())
                 .select("depth", "arm", "lr", "framework", loss="loss_clipped", seed="seed")
                 .with_columns(kind=pl.lit("other framework")))
        frames.append(other)
    data = pl.concat(frames, how="diagonal_relaxed").sort("depth", "arm", "lr")
    color = alt.Color("arm:N", scale=arm_scale(points[M.ARM].unique().to_list()), title=None)
    title = "final val loss (clipped at init)"
    y = alt.Y("loss:Q", scale=alt.Scale(zero=False), title=title)
    base = alt.Chart().encode(x=_log_x(), color=color)
    band = base.mark_area(opacity=0.18).encode(y=alt.Y("lo:Q", title=title), y2="hi:Q") \
        .transform_filter(alt.datum.kind == "mean")
    line = base.mark_line(point=True).encode(
        y=y, tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"),
                      alt.Tooltip("loss:Q", format=".4f"), "seeds:Q", "diverged:Q"]) \
        .transform_filter(alt.datum.kind == "mean")
    div = base.mark_point(shape="cross", size=110, filled=True, strokeWidth=1).encode(
        y=y, tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"), "seed:N"]) \
        .transform_filter(alt.datum.kind == "diverged")
    # a layer whose filtered data is empty makes Vega warn about infinite extents
    layers = [band, line] + ([div] if marks.height else [])
    if len(frames) == 3:
        layers.append(base.mark_point(shape="diamond", size=90, filled=False, strokeWidth=2)
                      .encode(y=y, tooltip=["framework:N", "arm:N", "seed:N",
                                            alt.Tooltip("loss:Q", format=".4f")])
                      .transform_filter(alt.datum.kind == "other framework"))
    return (alt.layer(*layers, data=values(data)).properties(width=PANEL_W, height=PANEL_H)
            .facet(column=alt.Column("depth:O", title="depth"))
            .properties(title="Final loss vs learning rate (band: seed range; x: diverged)"))


# --- training curves --------------------------------------------------------------------------

def curve_runs(points: pl.DataFrame, arms: pl.DataFrame, lrs: list[float] | None,
               twins: pl.DataFrame | None = None) -> pl.DataFrame:
    """(depth, lr) pairs to draw curves for: the given LRs snapped to the nearest LR run, or
    per depth the off arm's optimal LR, max stable LR and first divergent LR, plus (up to two)
    LRs of other-framework twins so their overlay is drawn."""
    run_lrs = points.select("depth", "lr").unique()
    picks = []
    for depth in sorted(run_lrs["depth"].unique().to_list()):
        have = sorted(run_lrs.filter(pl.col("depth") == depth)["lr"].to_list())
        if lrs:
            wanted = lrs
        else:
            off = M.with_arm(arms).filter((pl.col("depth") == depth) & (pl.col(M.ARM) == M.OFF))
            row = off.row(0, named=True) if off.height else {}
            wanted = [row.get(k) for k in ("optimal_lr", "max_stable_lr", "first_divergent_lr")]
            wanted = [w for w in wanted if w] or [have[len(have) // 2]]
            if twins is not None and twins.height:
                wanted += sorted(twins.filter(pl.col("depth") == depth)["lr"].unique())[:2]
        snapped = {min(have, key=lambda h: abs(math.log(h / w))) for w in wanted}
        picks += [{"depth": depth, "lr": lr} for lr in sorted(snapped)]
    return pl.DataFrame(picks, schema={"depth": pl.Int64, "lr": pl.Float64})


def training_curves_chart(runs: pl.DataFrame, metrics: pl.LazyFrame, picks: pl.DataFrame,
                          max_points: int = 60) -> alt.Chart:
    """Train loss (binned to <= max_points per run) and val loss vs step for the picked LRs;
    one line per run (seed, framework), colour by arm, dashes for a second framework."""
    runs = M.with_arm(runs)
    chosen = runs.join(picks, on=["depth", "lr"]).with_columns(arm_expr()).select(
        "run", "depth", "lr", "seed", "framework", "arm", "init_loss")
    m = metrics.join(chosen.lazy().select("run"), on="run")
    steps = m.group_by("run").agg(last=pl.col("step").max())
    train = (m.filter(pl.col("train_loss").is_not_null()).join(steps, on="run")
             .with_columns(bin=pl.col("step") // ((pl.col("last") // max_points) + 1))
             .group_by("run", "bin").agg(step=pl.col("step").max(),
                                         loss=pl.col("train_loss").mean())
             .drop("bin").with_columns(series=pl.lit("train")))
    val = (m.filter(pl.col("val_loss").is_not_null())
           .select("run", "step", loss="val_loss").with_columns(series=pl.lit("val")))
    data = (pl.concat([train, val]).join(chosen.lazy(), on="run")
            .with_columns(panel=pl.format("depth {}, lr {}", "depth",
                                          pl.col("lr").map_elements(lambda v: f"{v:.3g}",
                                                                    return_dtype=pl.String)),
                          line=pl.format("{} seed {} ({})", "arm", "seed", "framework"))
            .sort("run", "series", "step").collect())
    if data.is_empty():
        return _empty("no metrics rows for the chosen learning rates")
    top = float(data["init_loss"].max() or data["loss"].max()) * 1.05
    bottom = float(data.filter(pl.col("loss").is_finite())["loss"].min()) * 0.97
    scale = alt.Scale(domain=[bottom, top], zero=False, clamp=True)
    color = alt.Color("arm:N", scale=arm_scale(runs[M.ARM].unique().to_list()), title=None)
    dash = alt.StrokeDash("framework:N", title="framework")
    train_l = (alt.Chart().mark_line(opacity=0.55, clip=True)
               .encode(x=alt.X("step:Q"), y=alt.Y("loss:Q", scale=scale, title="loss"),
                       color=color, strokeDash=dash, detail="line:N")
               .transform_filter(alt.datum.series == "train"))
    val_p = (alt.Chart().mark_point(size=25, filled=True, clip=True)
             .encode(x="step:Q", y=alt.Y("loss:Q", scale=scale), color=color, detail="line:N",
                     tooltip=["line:N", "step:Q", alt.Tooltip("loss:Q", format=".4f")])
             .transform_filter(alt.datum.series == "val"))
    return (alt.layer(train_l, val_p, data=values(data)).properties(width=PANEL_W, height=PANEL_H)
            .facet(facet=alt.Facet("panel:N", title=None, sort=alt.SortField("depth")),
                   columns=3)
            .properties(title="Training curves (lines: train loss, dots: val loss)"))


# --- probes vs step ---------------------------------------------------------------------------

def probe_series(runs: pl.DataFrame, probe_steps: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """(depth, arm, lr, name, step) -> probe value (already reduced over layers), seed mean.

    `probe_steps` is `metrics.probe_over_layers(...)` collected; only `runs` are kept."""
    keyed = M.with_arm(runs).select("run", "depth", M.ARM, "lr")
    return (probe_steps.filter(pl.col("name").is_in(names)).join(keyed, on="run")
            .group_by("depth", M.ARM, "lr", "name", "step")
            .agg(value=pl.col("value").mean(), seeds=pl.len())
            .with_columns(arm_expr()).sort("depth", "arm", "lr", "name", "step"))


# Probes drawn in the "other probes" chart when the runs have them (the rest are in the tables):
# the output log-sum-exp is what z-loss pulls towards 0, the capped max logit what soft-capping
# bounds.
OTHER_PROBES = ("residual_kurtosis", "output_logsumexp_mean", "max_attention_logit_capped",
                "residual_max_abs_over_rms", "output_logit_max", "q_rms", "k_rms",
                "max_attention_logit_bound")


def other_probe_names(found: list[str], limit: int = 8) -> list[str]:
    """The preferred probes present, plus any other kurtosis; else the first few found."""
    extra = [n for n in found if n not in ATTENTION_PROBES]
    chosen = [n for n in OTHER_PROBES if n in extra]
    chosen += [n for n in extra if "kurtosis" in n and n not in chosen]
    return (chosen or sorted(extra))[:limit]


def with_lr_label(df: pl.DataFrame) -> pl.DataFrame:
    """An `lr_label` column ("3e-03") whose text order is the numeric order of the LRs."""
    return df.with_columns(lr_label=pl.col("lr").map_elements(lambda v: f"{v:.2e}",
                                                              return_dtype=pl.String))


def _lr_color(df: pl.DataFrame) -> alt.Color:
    labels = [f"{v:.2e}" for v in sorted(df["lr"].unique().to_list())]
    return alt.Color("lr_label:O", sort=labels, scale=alt.Scale(scheme="viridis", domain=labels),
                     legend=alt.Legend(title="learning rate"))


def max_logit_chart(runs: pl.DataFrame, probes: pl.DataFrame) -> alt.Chart:
    """Largest pre-softmax attention logit (max over layers and heads) vs step, log y."""
    data = with_lr_label(probe_series(runs, probes, ["max_attention_logit"])
                         .filter(pl.col("value") > 0))
    if data.is_empty():
        return _empty("no max_attention_logit probe rows")
    return (alt.Chart(values(data)).mark_line(point=alt.OverlayMarkDef(size=12))
            .encode(x="step:Q",
                    y=alt.Y("value:Q", scale=alt.Scale(type="log"), title="max attention logit"),
                    color=_lr_color(data), detail="lr:Q",
                    tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"), "step:Q",
                             alt.Tooltip("value:Q", format=".3g"), "seeds:Q"])
            .properties(width=PANEL_W, height=PANEL_H)
            .facet(row=alt.Row("arm:N", title=None), column=alt.Column("depth:O", title="depth"))
            .properties(title="Max attention logit vs step (seed mean; log scale)"))


def entropy_chart(runs: pl.DataFrame, probes: pl.DataFrame) -> alt.Chart:
    """Attention entropy vs step: mean over heads and layers (solid), lowest head (dashed)."""
    data = probe_series(runs, probes, ["attention_entropy_mean", "attention_entropy_min_head"])
    if data.is_empty():
        return _empty("no attention entropy probe rows")
    mean = pl.col("name") == "attention_entropy_mean"
    data = with_lr_label(data).with_columns(
        measure=pl.when(mean).then(pl.lit("mean over heads")).otherwise(pl.lit("lowest head")))
    return (alt.Chart(values(data)).mark_line()
            .encode(x="step:Q", y=alt.Y("value:Q", title="attention entropy (nats)"),
                    color=_lr_color(data), detail="lr:Q",
                    strokeDash=alt.StrokeDash("measure:N", title=None,
                                              sort=["mean over heads", "lowest head"]),
                    tooltip=["arm:N", "measure:N", alt.Tooltip("lr:Q", format=".3g"), "step:Q",
                             alt.Tooltip("value:Q", format=".3f")])
            .properties(width=PANEL_W, height=PANEL_H)
            .facet(row=alt.Row("arm:N", title=None), column=alt.Column("depth:O", title="depth"))
            .properties(title="Attention entropy vs step (seed mean)"))


def other_probes_chart(runs: pl.DataFrame, probes: pl.DataFrame, names: list[str]) -> alt.Chart:
    """Other probes (e.g. residual kurtosis), reduced over layers, vs step; `probes` as in
    `probe_series`."""
    data = with_lr_label(probe_series(runs, probes, names))
    if data.is_empty():
        return _empty("no other probe rows")
    return (alt.Chart(values(data)).mark_line()
            .encode(x="step:Q", y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
                    color=_lr_color(data), detail="lr:Q",
                    strokeDash=alt.StrokeDash("arm:N", title=None),
                    tooltip=["arm:N", "name:N", alt.Tooltip("lr:Q", format=".3g"), "step:Q",
                             alt.Tooltip("value:Q", format=".4g")])
            .properties(width=PANEL_W, height=PANEL_H)
            .facet(row=alt.Row("name:N", title=None), column=alt.Column("depth:O", title="depth"))
            .resolve_scale(y="independent")
            .properties(title="Other probes vs step (reduced over layers, seed mean)"))


# --- off minus on map -------------------------------------------------------------------------

def gap_map_data(gaps: pl.DataFrame, thresholds: pl.DataFrame) -> pl.DataFrame:
    """Cells with log-midpoint edges per depth, plus the necessity boundary per depth."""
    ratio = (pl.col("lr") / pl.col("prev")).sqrt()
    cells = (gaps.sort("on_kind", "depth", "lr")
             .with_columns(prev=pl.col("lr").shift(1).over("on_kind", "depth"),
                           next=pl.col("lr").shift(-1).over("on_kind", "depth"))
             .with_columns(x_lo=pl.when(pl.col("prev").is_not_null())
                           .then(pl.col("lr") / ratio)
                           .otherwise(pl.col("lr") / (pl.col("next") / pl.col("lr")).sqrt()),
                           x_hi=pl.when(pl.col("next").is_not_null())
                           .then((pl.col("lr") * pl.col("next")).sqrt())
                           .otherwise(pl.col("lr") * ratio))
             .with_columns(x_lo=pl.col("x_lo").fill_null(pl.col("lr") / 1.5),
                           x_hi=pl.col("x_hi").fill_null(pl.col("lr") * 1.5),
                           y_lo=pl.col("depth") - 0.45, y_hi=pl.col("depth") + 0.45,
                           divergence=pl.when((pl.col("off_diverged") > 0)
                                              & (pl.col("on_diverged") > 0))
                           .then(pl.lit("both diverged"))
                           .when(pl.col("off_diverged") > 0).then(pl.lit("off diverged"))
                           .when(pl.col("on_diverged") > 0).then(pl.lit("on diverged")),
                           kind=pl.lit("cell")))
    boundary = (cells.join(thresholds.select("depth", "on_kind", lr="threshold_lr"),
                           on=["depth", "on_kind", "lr"])
                .select("depth", "on_kind", "lr", "x_lo", "y_lo", "y_hi")
                .with_columns(kind=pl.lit("boundary"), y_lo=pl.col("depth") - 0.5,
                              y_hi=pl.col("depth") + 0.5))
    return pl.concat([cells.drop("prev", "next"), boundary], how="diagonal_relaxed")


def gap_map_chart(gaps: pl.DataFrame, thresholds: pl.DataFrame) -> alt.Chart:
    """LR x depth map of the seed-mean gap (off minus on, clipped losses): red = off worse.
    Crosses mark divergence; the black bar is the necessity threshold of each depth."""
    data = gap_map_data(gaps, thresholds)
    if data.is_empty():
        return _empty("no LR run in both arms")
    depths = sorted(gaps["depth"].unique().to_list())
    limit = max(abs(x) for x in data["mean_gap"].drop_nulls().to_list() or [1.0]) or 1.0
    x = alt.X("x_lo:Q", scale=alt.Scale(type="log"), axis=alt.Axis(format=".0e"),
              title="learning rate (log)")
    y = alt.Y("y_lo:Q", title="depth", axis=alt.Axis(values=depths, format="d"),
              scale=alt.Scale(domain=[min(depths) - 0.6, max(depths) + 0.6], nice=False))
    cells = (alt.Chart().mark_rect(stroke="white", strokeWidth=0.5)
             .encode(x=x, x2="x_hi:Q", y=y, y2="y_hi:Q",
                     color=alt.Color("mean_gap:Q", title="off - on loss",
                                     scale=alt.Scale(scheme="redblue", reverse=True,
                                                     domain=[-limit, limit], domainMid=0)),
                     tooltip=[alt.Tooltip("lr:Q", format=".3g"), "depth:Q",
                              alt.Tooltip("mean_gap:Q", format="+.4f"), "seed_gaps:N",
                              "spread:N", alt.Tooltip("p_off_worse:Q", format=".2g"),
                              "off_diverged:Q", "on_diverged:Q", "needed:N"])
             .transform_filter(alt.datum.kind == "cell"))
    marks = (alt.Chart().mark_point(shape="cross", size=140, filled=True, color="black")
             .encode(x=alt.X("lr:Q", scale=alt.Scale(type="log")),
                     y=alt.Y("depth:Q"),
                     shape=alt.Shape("divergence:N", title="divergence",
                                     scale=alt.Scale(domain=["off diverged", "on diverged",
                                                             "both diverged"],
                                                     range=["cross", "circle", "square"])))
             .transform_filter("datum.kind == 'cell' && datum.divergence != null"))
    edge = (alt.Chart().mark_rule(color="black", strokeWidth=3)
            .encode(x="x_lo:Q", y="y_lo:Q", y2="y_hi:Q")
            .transform_filter(alt.datum.kind == "boundary"))
    layers = [cells]
    if data["divergence"].drop_nulls().len():
        layers.append(marks)
    if (data["kind"] == "boundary").any():
        layers.append(edge)
    chart = alt.layer(*layers, data=values(data)).properties(
        width=3 * PANEL_W, height=max(90, 60 * len(depths)))
    return (chart.facet(row=alt.Row("on_kind:N", title="on arm"))
            .properties(title="QK-norm off minus on: final loss gap (black bar: necessity "
                              "threshold)"))


# --- per depth summaries ----------------------------------------------------------------------

def sensitivity_chart(points: pl.DataFrame) -> alt.Chart:
    """LR sensitivity vs depth: one dot per seed, the line through the seed means."""
    per_seed = M.lr_sensitivity_per_seed(points).with_columns(arm_expr())
    means = (per_seed.group_by("depth", "arm").agg(mean=pl.col("lr_sensitivity").mean())
             .sort("depth"))
    data = pl.concat([per_seed.select("depth", "arm", "seed", "lr_sensitivity", "grid_points")
                      .with_columns(kind=pl.lit("seed")),
                      means.with_columns(kind=pl.lit("mean"))], how="diagonal_relaxed")
    if data["lr_sensitivity"].drop_nulls().is_empty():
        return _empty("LR sensitivity undefined (base grid < 2 LRs)")
    color = alt.Color("arm:N", scale=arm_scale(M.with_arm(points)[M.ARM].unique().to_list()),
                      title=None)
    depths = sorted(points["depth"].unique().to_list())
    x = alt.X("depth:Q", axis=alt.Axis(values=depths, format="d"),
              scale=alt.Scale(domain=[min(depths) - 0.5, max(depths) + 0.5], nice=False))
    dots = (alt.Chart().mark_point(size=50, opacity=0.7)
            .encode(x=x, y=alt.Y("lr_sensitivity:Q", title="LR sensitivity"), color=color,
                    tooltip=["arm:N", "depth:Q", "seed:N",
                             alt.Tooltip("lr_sensitivity:Q", format=".4f"), "grid_points:Q"])
            .transform_filter(alt.datum.kind == "seed"))
    line = (alt.Chart().mark_line(point=True).encode(x=x, y="mean:Q", color=color)
            .transform_filter(alt.datum.kind == "mean"))
    return (alt.layer(dots, line, data=values(data)).properties(width=2 * PANEL_W,
                                                                  height=PANEL_H + 40)
            .properties(title="LR sensitivity vs depth (Wortsman et al. 2023)"))


def landmarks_chart(arms: pl.DataFrame, thresholds: pl.DataFrame) -> alt.Chart:
    """Per depth: optimal LR and max stable LR per arm (range over seeds), and the necessity
    threshold with its grid bracket (from the largest LR where it was not yet needed). Open
    triangles: max stable LR is a lower bound."""
    arms = M.with_arm(arms)
    a = arms.with_columns(arm_expr())
    frames = [
        a.select("depth", "arm", value="optimal_lr", lo="optimal_lr_lo", hi="optimal_lr_hi")
        .with_columns(measure=pl.lit("optimal LR"), bound=pl.lit(False)),
        a.select("depth", "arm", value="max_stable_lr", lo="max_stable_lr_lo",
                 hi="max_stable_lr_hi", bound=pl.col("censored_seeds") > 0)
        .with_columns(measure=pl.lit("max stable LR")),
        thresholds.select("depth", value="threshold_lr",
                          lo=pl.coalesce("not_needed_below", "threshold_lr"), hi="threshold_lr",
                          arm=pl.format("necessity ({} vs off)", "on_kind"))
        .with_columns(measure=pl.lit("necessity threshold"), bound=pl.lit(False)),
    ]
    data = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("value").is_not_null())
    if data.is_empty():
        return _empty("no learning-rate landmarks")
    depths = sorted(arms["depth"].unique().to_list())
    scale = arm_scale(arms[M.ARM].unique().to_list())
    kinds = thresholds["on_kind"].unique().to_list()
    scale = alt.Scale(domain=list(scale.domain) + [f"necessity ({k} vs off)" for k in kinds],
                      range=list(scale.range) + ["#000000"] * len(kinds))
    data = data.with_columns(
        offset=pl.col("measure").replace_strict({"optimal LR": -0.12, "max stable LR": 0.0,
                                                 "necessity threshold": 0.12})
        + pl.when(pl.col("arm") == OFF_LABEL).then(-0.04).otherwise(0.04),
    ).with_columns(x=pl.col("depth") + pl.col("offset"))
    x = alt.X("x:Q", title="depth", axis=alt.Axis(values=depths, format="d"),
              scale=alt.Scale(domain=[min(depths) - 0.5, max(depths) + 0.5], nice=False))
    y = alt.Y("value:Q", scale=alt.Scale(type="log", padding=12), title="learning rate (log)",
              axis=alt.Axis(format=".0e"))
    color = alt.Color("arm:N", scale=scale, title=None)
    rules = alt.Chart().mark_rule().encode(x=x, y=alt.Y("lo:Q", scale=alt.Scale(type="log")),
                                           y2="hi:Q", color=color)
    shape = alt.Shape("measure:N", title=None,
                      scale=alt.Scale(domain=["optimal LR", "max stable LR",
                                              "necessity threshold"],
                                      range=["circle", "triangle-up", "diamond"]))
    tooltip = ["measure:N", "arm:N", "depth:Q", alt.Tooltip("value:Q", format=".3g"),
               alt.Tooltip("lo:Q", format=".3g"), alt.Tooltip("hi:Q", format=".3g"),
               alt.Tooltip("bound:N", title="lower bound only")]
    dots = alt.Chart().encode(x=x, y=y, color=color, shape=shape, tooltip=tooltip)
    solid = dots.mark_point(size=80, filled=True).transform_filter("!datum.bound")
    hollow = dots.mark_point(size=80, filled=False, strokeWidth=2).transform_filter("datum.bound")
    layers = [rules] + ([solid] if (~data["bound"]).any() else []) + (
        [hollow] if data["bound"].any() else [])
    return (alt.layer(*layers, data=values(data))
            .properties(width=2 * PANEL_W, height=PANEL_H + 60,
                        title="Learning-rate landmarks vs depth (bars: seed range; "
                              "for the threshold, the grid bracket)"))


def _empty(message: str) -> alt.Chart:
    """A small chart that says why there is nothing to draw (so a report never breaks)."""
    return (alt.Chart(alt.Data(values=[{"message": message}])).mark_text(size=14)
            .encode(text="message:N").properties(width=2 * PANEL_W, height=40))


# --- saving -----------------------------------------------------------------------------------

def save_chart(chart: alt.TopLevelMixin | dict, folder: Path, name: str,
               scale: float = 2.0) -> dict[str, Path]:
    """Write <name>.png, .svg and .html (self-contained, interactive) from a chart or its
    Vega-Lite dict (`chart.to_dict()` validates against the schema, so do it once)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = chart if isinstance(chart, dict) else chart.to_dict()
    paths = {ext: folder / f"{name}.{ext}" for ext in ("png", "svg", "html")}
    paths["png"].write_bytes(vlc.vegalite_to_png(spec, scale=scale))
    paths["svg"].write_text(vlc.vegalite_to_svg(spec))
    paths["html"].write_text(vlc.vegalite_to_html(spec, bundle=True))
    return paths
