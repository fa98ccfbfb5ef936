"""The report's charts beyond the answer: training curves, probes against step, LR
sensitivity and the LR landmarks per depth."""

from __future__ import annotations

import math

import altair as alt
import polars as pl

from . import metrics as M
from .charts import (ATTENTION_PROBES, OFF_LABEL, PANEL_H, ROW_HEADER, _empty, arm_expr,
                     arm_scale, finish, panel_width, probe_words, values)


def curve_runs(points: pl.DataFrame, arms: pl.DataFrame, lrs: list[float] | None,
               twins: pl.DataFrame | None = None) -> pl.DataFrame:
    """(depth, lr) pairs to draw curves for: the given LRs or the off arm's landmarks."""
    run_lrs = points.select("depth", "lr").unique()
    picks = []
    for depth in sorted(run_lrs["depth"].unique().to_list()):
        have = sorted(run_lrs.filter(pl.col("depth") == depth)["lr"].to_list())
        wanted = lrs
        if not lrs:
            off = arms.filter((pl.col("depth") == depth) & (pl.col(M.ARM) == M.OFF)).head(1)
            wanted = [w for k in ("optimal_lr", "max_usable_lr", "first_divergent_lr")
                      for w in off[k] if w] or [have[len(have) // 2]]
            if twins is not None and twins.height:
                wanted += sorted(twins.filter(pl.col("depth") == depth)["lr"].unique())[:2]
        snapped = {min(have, key=lambda h: abs(math.log(h / w))) for w in wanted}
        picks += [{"depth": depth, "lr": lr} for lr in sorted(snapped)]
    return pl.DataFrame(picks, schema={"depth": pl.Int64, "lr": pl.Float64})


VAL_MARK, ABOVE_MARK, DIVERGED_AT = ("val loss", "leaves the axis (loss above its top)",
                                     "diverged (last step)")


def _edge_markers(data: pl.DataFrame, chosen: pl.DataFrame, top: float) -> pl.DataFrame:
    """Val dots and the markers of curves leaving the axis; y_plot is where each is drawn."""
    above = ~pl.col("loss").is_finite() | (pl.col("loss") > top)
    first_above = above & (pl.col("step") == pl.col("step").filter(above).min()
                           .over("run", "series"))
    data = data.with_columns(
        marker=pl.when((pl.col("series") == "val") & ~above).then(pl.lit(VAL_MARK))
        .when(first_above).then(pl.lit(ABOVE_MARK)), y_edge=pl.lit(top))
    ends = (chosen.filter(pl.col("status") == "diverged")
            .join(data.group_by("run").agg(last=pl.col("step").max()), on="run")
            .select("run", "depth", "lr", "seed", "framework", "arm",
                    step=pl.coalesce("diverged_step", "last"))
            .join(data.select("run", "panel", "line").unique(), on="run")
            .with_columns(series=pl.lit("end"), marker=pl.lit(DIVERGED_AT), y_edge=pl.lit(top)))
    return pl.concat([data, ends], how="diagonal_relaxed").with_columns(
        y_plot=pl.when(pl.col("marker") == VAL_MARK).then(pl.col("loss")).otherwise("y_edge"))


def training_curves_chart(runs: pl.DataFrame, metrics: pl.LazyFrame, picks: pl.DataFrame
                          ) -> alt.Chart:
    """Train and val loss vs step for the picked LRs, one line per run."""
    chosen = runs.join(picks, on=["depth", "lr"]).with_columns(arm_expr()).select(
        "run", "depth", "lr", "seed", "framework", "arm", "init_loss", "status", "diverged_step")
    m = metrics.join(chosen.lazy().select("run"), on="run")
    train = (m.with_columns(bin=pl.col("step") // (pl.col("step").max().over("run") // 60 + 1))
             .filter(pl.col("train_loss").is_not_null())  # <= 60 points a run
             .group_by("run", "bin").agg(step=pl.col("step").max(),
                                         loss=pl.col("train_loss").mean())
             .drop("bin").with_columns(series=pl.lit("train")))
    val = (m.filter(pl.col("val_loss").is_not_null())
           .select("run", "step", loss="val_loss").with_columns(series=pl.lit("val")))
    lr_text = pl.col("lr").map_elements(lambda v: f"{v:.3g}", return_dtype=pl.String)
    data = (pl.concat([train, val]).join(chosen.lazy(), on="run")
            .with_columns(panel=pl.format("depth {}, lr {}", "depth", lr_text),
                          line=pl.format("{} seed {} ({})", "arm", "seed", "framework"))
            .sort("run", "series", "step").collect())
    if data.is_empty():
        return _empty("no metrics rows for the chosen learning rates")
    finite = data.filter(pl.col("loss").is_finite())
    top = float(data["init_loss"].max() or finite["loss"].max()) * 1.08
    scale = alt.Scale(domain=[float(finite["loss"].min()) * 0.97, top], zero=False, nice=False)
    data = _edge_markers(data, chosen, top)
    markers = [k for k in (VAL_MARK, ABOVE_MARK, DIVERGED_AT) if (data["marker"] == k).any()]
    shapes = {VAL_MARK: "circle", ABOVE_MARK: "triangle-up", DIVERGED_AT: "cross"}
    shape = alt.Shape("marker:N", title="marker", scale=alt.Scale(
        domain=markers, range=[shapes[k] for k in markers]))
    color = alt.Color("arm:N", scale=arm_scale(runs[M.ARM].unique().to_list()), title="arm")
    dash = alt.StrokeDash("framework:N", title="framework", legend=alt.Legend()
                          if data["framework"].drop_nulls().n_unique() > 1 else None)
    lines = (alt.Chart().mark_line(opacity=0.55, clip=True)
             .encode(x="step:Q", y=alt.Y("loss:Q", scale=scale, title="loss (nats)"),
                     color=color, strokeDash=dash, detail="line:N")
             .transform_filter(alt.datum.series == "train"))
    # one point layer for val dots and edge markers (an empty layer makes Vega warn)
    points = (alt.Chart().mark_point(filled=True, clip=False)
              .encode(x="step:Q", y=alt.Y("y_plot:Q", scale=scale), color=color,
                      detail="line:N", shape=shape,
                      size=alt.condition(f"datum.marker == '{VAL_MARK}'", alt.value(25),
                                         alt.value(90)),
                      tooltip=["line:N", "marker:N", "step:Q",
                               alt.Tooltip("loss:Q", format=".4g")])
              .transform_filter("datum.marker != null"))
    width = panel_width(min(3, data["panel"].n_unique()))
    return finish(alt.layer(lines, points, data=values(data))
                  .properties(width=width, height=PANEL_H + 40)
                  .facet(facet=alt.Facet("panel:N", title=None, sort=alt.SortField("depth")),
                         columns=3)
                  .resolve_scale(x="independent")
                  .properties(title="Training curves (lines: train loss, dots: val loss)"))


# drawn in the "other probes" chart when present (z-loss pulls the log-sum-exp towards 0)
OTHER_PROBES = ("residual_kurtosis", "output_logsumexp_mean", "max_attention_logit_capped",
                "residual_max_abs_over_rms", "output_logit_max", "q_rms", "k_rms",
                "max_attention_logit_bound")


def other_probe_names(found: list[str], limit: int = 8) -> list[str]:
    """The preferred probes present, plus any other kurtosis; else the first few found."""
    extra = [n for n in found if n not in ATTENTION_PROBES]
    chosen = [n for n in OTHER_PROBES if n in extra]
    chosen += [n for n in extra if "kurtosis" in n and n not in chosen]
    return (chosen or sorted(extra))[:limit]


def probe_chart(runs: pl.DataFrame, probes: pl.DataFrame, names: list[str], title: str,
                row: str = "arm", dash: str | None = None, log: bool = False,
                height: int = PANEL_H) -> alt.Chart:
    """Probes vs step per depth (rows: arm or probe), one line per LR, seed means."""
    keyed = runs.select("run", "depth", M.ARM, "lr")
    data = (probes.filter(pl.col("name").is_in(names)).join(keyed, on="run")
            .group_by("depth", M.ARM, "lr", "name", "step")
            .agg(value=pl.col("value").mean(), seeds=pl.len())
            .with_columns(arm_expr()).sort("depth", "arm", "lr", "name", "step")
            .with_columns(lr_label=pl.col("lr").map_elements(  # "3.00e-03": sorts as the LRs
                lambda v: f"{v:.2e}", return_dtype=pl.String)))
    if log:
        data = data.filter(pl.col("value") > 0)  # a log axis has no place for 0 or below
    if data.is_empty():
        return _empty(f"no {' or '.join(names)} probe rows")
    data = data.with_columns(probe=pl.col("name").map_elements(probe_words, return_dtype=pl.String))
    y = alt.Y("value:Q", title=probe_words(names[0]) if len(names) == 1 else None,
              scale=alt.Scale(type="log") if log else alt.Scale(zero=False))
    extra = {"strokeDash": alt.StrokeDash(f"{dash}:N", title=dash)} if dash else {}
    sort = [probe_words(n) for n in names] if row == "probe" else "ascending"
    labels = [f"{v:.2e}" for v in sorted(data["lr"].unique().to_list())]
    color = alt.Color("lr_label:O", sort=labels, title="learning rate",
                      scale=alt.Scale(scheme="viridis", domain=labels))
    chart = (alt.Chart(values(data)).mark_line(point=alt.OverlayMarkDef(size=12) if log else False)
             .encode(x="step:Q", y=y, color=color, detail="lr:Q", **extra,
                     tooltip=["arm:N", "probe:N", alt.Tooltip("lr:Q", format=".3g"), "step:Q",
                              alt.Tooltip("value:Q", format=".4g"), "seeds:Q"])
             .properties(width=panel_width(data["depth"].n_unique()), height=height)
             .facet(row=alt.Row(f"{row}:N", title=None, sort=sort, header=ROW_HEADER),
                    column=alt.Column("depth:O", title="depth")))
    if row == "probe":
        chart = chart.resolve_scale(y="independent")
    return finish(chart.properties(title=title))


def depth_x(frame: pl.DataFrame, field: str) -> alt.X:
    """A depth axis with a tick per depth run and half a step of margin."""
    depths = sorted(frame["depth"].unique().to_list())
    return alt.X(field, title="depth", axis=alt.Axis(values=depths, format="d"),
                 scale=alt.Scale(domain=[min(depths) - 0.5, max(depths) + 0.5], nice=False))


def sensitivity_chart(points: pl.DataFrame) -> alt.Chart:
    per_seed = M.lr_sensitivity_per_seed(points).with_columns(arm_expr())
    means = (per_seed.group_by("depth", "arm").agg(mean=pl.col("lr_sensitivity").mean())
             .sort("depth"))
    data = pl.concat([per_seed.select("depth", "arm", "seed", "lr_sensitivity", "grid_points")
                      .with_columns(kind=pl.lit("seed")),
                      means.with_columns(kind=pl.lit("mean"))], how="diagonal_relaxed")
    if data["lr_sensitivity"].drop_nulls().is_empty():
        return _empty("LR sensitivity undefined (base grid < 2 LRs)")
    color = alt.Color("arm:N", scale=arm_scale(points[M.ARM].unique().to_list()), title=None)
    x = depth_x(points, "depth:Q")
    dots = (alt.Chart().mark_point(size=50, opacity=0.7)
            .encode(x=x, y=alt.Y("lr_sensitivity:Q", title="LR sensitivity"), color=color,
                    tooltip=["arm:N", "depth:Q", "seed:N",
                             alt.Tooltip("lr_sensitivity:Q", format=".4f"), "grid_points:Q"])
            .transform_filter(alt.datum.kind == "seed"))
    line = (alt.Chart().mark_line(point=True).encode(x=x, y="mean:Q", color=color)
            .transform_filter(alt.datum.kind == "mean"))
    return finish(alt.layer(dots, line, data=values(data))
                  .properties(width=panel_width(1), height=PANEL_H + 60,
                              title="LR sensitivity vs depth (open dots: seeds; line: seed "
                                    "mean; Wortsman et al. 2023)"))


MEASURED, LOWER_BOUND = "measured", "lower bound (no failure above the best LR)"
LANDMARKS = {"optimal LR": ("circle", -0.12), "max usable LR": ("triangle-up", 0.0),
             "onset": ("diamond", 0.12)}


def _landmark_data(arms: pl.DataFrame, thresholds: pl.DataFrame) -> pl.DataFrame:
    a = arms.with_columns(arm_expr())
    data = pl.concat([
        a.select("depth", "arm", value="optimal_lr", lo="optimal_lr_lo", hi="optimal_lr_hi")
        .with_columns(measure=pl.lit("optimal LR"), bound=pl.lit(False)),
        a.select("depth", "arm", value="max_usable_lr", lo="max_usable_lr_lo",
                 hi="max_usable_lr_hi", bound=pl.col("lower_bound_seeds") > 0)
        .with_columns(measure=pl.lit("max usable LR")),
        thresholds.select("depth", value="onset_lr", lo="ci_lo", hi="ci_hi", interval="onset",
                          arm=pl.format("onset ({} vs off)", "compared_arm"))
        .with_columns(measure=pl.lit("onset"), bound=pl.lit(False)),
    ], how="diagonal_relaxed").filter(pl.col("value").is_not_null())
    if data.is_empty():
        return data
    known = [v for c in ("value", "lo", "hi") for v in data[c].drop_nulls().to_list() if v > 0]
    onset = pl.col("measure") == "onset"  # an interval end beyond the LRs run: to the edge
    return data.with_columns(
        edge=pl.when(onset & pl.col("hi").is_null()).then(pl.lit("up"))
        .when(onset & pl.col("lo").is_null()).then(pl.lit("down")),
        lo=pl.col("lo").fill_null(pl.when(onset).then(min(known) / 2).otherwise("value")),
        hi=pl.col("hi").fill_null(pl.when(onset).then(max(known) * 2).otherwise("value")),
        x=pl.col("depth") + pl.col("measure").replace_strict(
            {k: v[1] for k, v in LANDMARKS.items()}, return_dtype=pl.Float64)
        + pl.when(pl.col("arm") == OFF_LABEL).then(-0.04).otherwise(0.04),
        value_kind=pl.when("bound").then(pl.lit(LOWER_BOUND)).otherwise(pl.lit(MEASURED)))


def landmarks_chart(arms: pl.DataFrame, thresholds: pl.DataFrame) -> alt.Chart:
    """Per depth: optimal and max usable LR per arm, and the onset with its interval."""
    data = _landmark_data(arms, thresholds)
    if data.is_empty():
        return _empty("no learning-rate landmarks")
    kinds = thresholds["compared_arm"].unique().to_list()
    arm_colors = arm_scale(arms[M.ARM].unique().to_list())
    color = alt.Color("arm:N", title=None, scale=alt.Scale(
        domain=list(arm_colors.domain) + [f"onset ({k} vs off)" for k in kinds],
        range=list(arm_colors.range) + ["#000000"] * len(kinds)))
    x = depth_x(arms, "x:Q")
    y_scale = alt.Scale(type="log", nice=False,
                        domain=[float(data["lo"].min()), float(data["hi"].max())])
    shape = alt.Shape("measure:N", title=None, scale=alt.Scale(
        domain=list(LANDMARKS), range=[v[0] for v in LANDMARKS.values()]))
    value_kinds = [MEASURED, LOWER_BOUND] if data["bound"].any() else [MEASURED]
    fill = alt.FillOpacity("value_kind:O", title="value", sort=value_kinds, scale=alt.Scale(
        domain=value_kinds, range=[1, 0][:len(value_kinds)]))
    tooltip = ["measure:N", "arm:N", "depth:Q", alt.Tooltip("value:Q", format=".3g"),
               alt.Tooltip("lo:Q", format=".3g"), alt.Tooltip("hi:Q", format=".3g"),
               alt.Tooltip("interval:N", title="onset [95% interval]")]
    layers = [alt.Chart().mark_rule().encode(x=x, y=alt.Y("lo:Q", scale=y_scale), y2="hi:Q",
                                             color=color),
              alt.Chart().mark_point(size=80, filled=True, strokeWidth=2).encode(
                  x=x, y=alt.Y("value:Q", scale=y_scale, title="learning rate (log)",
                               axis=alt.Axis(format=".0e")),
                  color=color, stroke=color, shape=shape, fillOpacity=fill, tooltip=tooltip)]
    layers += [alt.Chart().mark_point(filled=True, size=60, color="#000", shape=f"triangle-{e}")
               .encode(x=x, y=alt.Y(f"{end}:Q", scale=y_scale), tooltip=["arm:N", "interval:N"])
               .transform_filter(f"datum.edge == '{e}'")
               for e, end in (("up", "hi"), ("down", "lo")) if (data["edge"] == e).any()]
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=panel_width(1), height=PANEL_H + 100,
                              title="Learning-rate landmarks vs depth (bars: seed range; "
                                    "for the onset, its 95% interval)"))
