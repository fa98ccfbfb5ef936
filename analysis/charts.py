"""Altair charts of the study. Each `*_chart` aggregates in Polars first, then encodes.

Charts get their data inline as plain values (non-finite numbers become null), and are saved
as PNG and SVG through vl-convert and as a self-contained interactive HTML page.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import altair as alt
import polars as pl
import vl_convert as vlc

from qkstudy.variants import VARIANTS

from . import hypotheses as H
from . import metrics as M

PANEL_W, PANEL_H = 230, 200  # the smallest panel width; the height of a small-multiple panel
# A chart is sized to fill a report page (content up to ~1460 px wide) at full size: PAGE_W is
# the width a chart may take with its axes and legend; the page scales it down on narrow screens.
PAGE_W = 1360
LEGEND_W, AXIS_W, SPACING = 200, 70, 20
MAX_PANEL_W = 1000
OFF_LABEL = M.arm_words(M.OFF)
ATTENTION_PROBES = ("max_attention_logit", "attention_entropy_mean", "attention_entropy_min_head")
# Off is always the warm orange, QK-norm arms greens/purples, rival controls further colours.
ARM_COLORS = {M.OFF: "#d95f02", **dict(zip(VARIANTS, ("#1b9e77", "#7570b3", "#1f78b4",
                                                       "#66a61e")))}
MORE_COLORS = ("#e7298a", "#e6ab02", "#a6761d", "#666666", "#b15928", "#6a3d9a")


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


def panel_width(columns: int, legend: bool = True, total: int = PAGE_W) -> int:
    """The width of one plot area when `columns` panels side by side (with one y axis and a
    legend) span `total` pixels; never below PANEL_W (the page then scales the chart down)."""
    spare = total - (LEGEND_W if legend else 0) - AXIS_W - (max(columns, 1) - 1) * SPACING
    return int(max(PANEL_W, min(MAX_PANEL_W, spare / max(columns, 1))))


LR_LABEL_PX = 46  # room for one LR tick label ("0.0003", "1.73e-5")


def lr_ticks(lrs: list[float], width: float, label_px: float = LR_LABEL_PX) -> list[float]:
    """Tick values for a log LR axis `width` pixels wide: the LRs run when their labels fit,
    else the powers of ten in range, else every k-th LR run (labels never collide)."""
    lrs = sorted({float(v) for v in lrs if v and v > 0})
    if not lrs:
        return []
    span = math.log10(lrs[-1] / lrs[0]) or 1.0

    def fits(ticks: list[float]) -> bool:
        gaps = [width * math.log10(b / a) / span for a, b in zip(ticks, ticks[1:])]
        return all(g >= label_px for g in gaps)

    if fits(lrs):
        return lrs
    decades = [10.0 ** k for k in range(math.floor(math.log10(lrs[0])),
                                        math.ceil(math.log10(lrs[-1])) + 1)
               if lrs[0] / 1.0001 <= 10.0 ** k <= lrs[-1] * 1.0001]
    if len(decades) >= 2 and fits(decades):
        return decades
    for k in range(2, len(lrs) + 1):
        thinned = lrs[::k]
        if fits(thinned):
            return thinned
    return lrs[:1]


def lr_axis(lrs: list[float], width: float, title: str | None = "learning rate (log)"
            ) -> alt.Axis:
    """A log LR axis with labels that never collide ("3e-3", "1.73e-2")."""
    return alt.Axis(values=lr_ticks(lrs, width), format=".3~g", labelOverlap="greedy",
                    title=title, labelFlush=False)


def lr_scale(lrs: list[float], pad: float = 1.3) -> alt.Scale:
    """A log LR scale over the LRs run (a little margin, no empty decade added by nice)."""
    lrs = [v for v in lrs if v and v > 0]
    return alt.Scale(type="log", nice=False, domain=[min(lrs) / pad, max(lrs) * pad])


def finish(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """Shared look: readable fonts, headers that are not cut, labels that do not overlap."""
    return (chart.configure_axis(labelFontSize=11, titleFontSize=12, labelOverlap="greedy",
                                 titleLimit=0)
            .configure_header(labelFontSize=12, titleFontSize=12, labelLimit=0)
            .configure_legend(labelFontSize=11, titleFontSize=12, labelLimit=0)
            .configure_title(fontSize=15, anchor="start", limit=0))


PROBE_WORDS = {
    "max_attention_logit": "max attention logit",
    "max_attention_logit_capped": "max attention logit after the soft-cap",
    "max_attention_logit_bound": "QK-norm logit bound",
    "attention_entropy_mean": "attention entropy (mean over heads)",
    "attention_entropy_min_head": "attention entropy (lowest head)",
    "residual_kurtosis": "residual kurtosis",
    "residual_max_abs_over_rms": "residual max |x| / rms",
    "output_logsumexp_mean": "output log-sum-exp (mean)",
    "output_logit_max": "output logit max",
    "q_rms": "q rms",
    "k_rms": "k rms",
}


def probe_words(name: str) -> str:
    """A probe's name as a readable title ("residual_kurtosis" -> "residual kurtosis")."""
    return PROBE_WORDS.get(name) or name.replace("_", " ")


def values(df: pl.DataFrame) -> alt.Data:
    """Inline data with NaN and +-inf as null (JSON has neither)."""
    floats = [c for c, t in df.schema.items() if t.is_float()]
    clean = df.with_columns([pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c)
                             for c in floats])
    return alt.Data(values=clean.to_dicts())


def lr_brush() -> alt.Parameter:
    """The LR brush (drag along the LR axis): the report's page filters the other charts by it
    (analysis/linked.py)."""
    return alt.selection_interval(name="lr_brush", encodings=["x"], clear="dblclick")


def _log_x(lrs: list[float], width: float, title: str = "learning rate (log)") -> alt.X:
    return alt.X("lr:Q", scale=lr_scale(lrs), axis=lr_axis(lrs, width, title))


# --- final loss vs LR -------------------------------------------------------------------------

MEAN_MARK, DIVERGED_MARK, OTHER_MARK = ("seed mean", "diverged run (at its initial loss)",
                                       "another framework's run")


def loss_vs_lr_chart(points: pl.DataFrame, twins: pl.DataFrame | None = None) -> alt.FacetChart:
    """Final val loss vs LR per depth: seed mean line, min-max band, diverged runs as crosses
    at their init loss (Wortsman clipping), other-framework runs as open diamonds."""
    points = M.with_arm(points)
    p = M.with_losses(points).with_columns(arm_expr())
    cells = (p.group_by("depth", "arm", "lr")
             .agg(loss=pl.col("loss_clipped").mean(), lo=pl.col("loss_clipped").min(),
                  hi=pl.col("loss_clipped").max(), seeds=pl.len(),
                  diverged=pl.col("diverged").sum())
             .with_columns(kind=pl.lit("mean"), marker=pl.lit(MEAN_MARK)))
    marks = (p.filter("diverged").select("depth", "arm", "lr", loss="loss_clipped", seed="seed")
             .with_columns(kind=pl.lit("diverged"), marker=pl.lit(DIVERGED_MARK)))
    frames = [cells, marks]
    if twins is not None and twins.height:
        other = (M.with_losses(M.with_arm(twins)).with_columns(arm_expr())
                 .select("depth", "arm", "lr", "framework", loss="loss_clipped", seed="seed")
                 .with_columns(kind=pl.lit("other framework"), marker=pl.lit(OTHER_MARK)))
        frames.append(other)
    data = pl.concat(frames, how="diagonal_relaxed").sort("depth", "arm", "lr")
    width = panel_width(data["depth"].n_unique())
    colors = arm_scale(points[M.ARM].unique().to_list())
    color = alt.Color("arm:N", scale=colors, title="arm", legend=alt.Legend(symbolOpacity=1))
    shown = [MEAN_MARK] + ([DIVERGED_MARK] if marks.height else []) + (
        [OTHER_MARK] if len(frames) == 3 else [])
    shape = alt.Shape("marker:N", title="marker", scale=alt.Scale(
        domain=shown, range=["circle", "cross", "diamond"][:len(shown)]))
    title = "final val loss (clipped)"
    y = alt.Y("loss:Q", scale=alt.Scale(zero=False), title=title)
    base = alt.Chart().encode(x=_log_x(data["lr"].to_list(), width), color=color)
    band = base.mark_area(opacity=0.18).encode(
        y=alt.Y("lo:Q", title=title), y2="hi:Q") \
        .transform_filter(alt.datum.kind == "mean")
    line = base.mark_line().encode(y=y).transform_filter(alt.datum.kind == "mean")
    mean = base.mark_point(filled=True, size=40).encode(
        y=y, shape=shape, tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"),
                                   alt.Tooltip("loss:Q", format=".4f"), "seeds:Q", "diverged:Q"]) \
        .transform_filter(alt.datum.kind == "mean").add_params(lr_brush())
    div = base.mark_point(size=110, filled=True, strokeWidth=1).encode(
        y=y, shape=shape, tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"), "seed:N"]) \
        .transform_filter(alt.datum.kind == "diverged")
    # a layer whose filtered data is empty makes Vega warn about infinite extents
    layers = [band, line, mean] + ([div] if marks.height else [])
    if len(frames) == 3:
        layers.append(base.mark_point(size=90, filled=False, strokeWidth=2)
                      .encode(y=y, shape=shape,
                              tooltip=["framework:N", "arm:N", "seed:N",
                                       alt.Tooltip("loss:Q", format=".4f")])
                      .transform_filter(alt.datum.kind == "other framework"))
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=width, height=PANEL_H + 60)
                  .facet(column=alt.Column("depth:O", title="depth"))
                  .properties(title="Final loss vs learning rate (line: seed mean, "
                                    "band: seed range)"))


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


VAL_MARK, ABOVE_MARK, DIVERGED_AT = ("val loss", "leaves the axis (loss above its top)",
                                     "diverged (last step)")


def training_curves_chart(runs: pl.DataFrame, metrics: pl.LazyFrame, picks: pl.DataFrame,
                          max_points: int = 60, columns: int = 3) -> alt.Chart:
    """Train loss (binned to <= max_points per run) and val loss vs step for the picked LRs;
    one line per run (seed, framework), colour by arm, dashes for a second framework.

    The y axis stops a little above the initial loss: losses beyond it (a run blowing up) are
    drawn as triangles on the top edge, and a diverged run's last step as a cross there, so the
    panel of a diverged LR still shows every arm. Each panel has its own step axis."""
    runs = M.with_arm(runs)
    if "diverged_step" not in runs.columns:
        runs = runs.with_columns(diverged_step=pl.lit(None, dtype=pl.Int64))
    chosen = runs.join(picks, on=["depth", "lr"]).with_columns(arm_expr()).select(
        "run", "depth", "lr", "seed", "framework", "arm", "init_loss", "status",
        "diverged_step")
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
    finite = data.filter(pl.col("loss").is_finite())
    top = float(data["init_loss"].max() or finite["loss"].max()) * 1.08
    bottom = float(finite["loss"].min()) * 0.97
    # what is beyond the top edge (or not finite) is drawn on it, as a marker
    above = ~pl.col("loss").is_finite() | (pl.col("loss") > top)
    first_above = above & (pl.col("step") == pl.col("step").filter(above).min()
                           .over("run", "series"))
    data = data.with_columns(
        marker=pl.when((pl.col("series") == "val") & ~above).then(pl.lit(VAL_MARK))
        .when(first_above).then(pl.lit(ABOVE_MARK)),
        y_edge=pl.lit(top))
    ends = (chosen.filter(pl.col("status") == "diverged")
            .join(data.group_by("run").agg(last=pl.col("step").max()), on="run")
            .select("run", "depth", "lr", "seed", "framework", "arm",
                    step=pl.coalesce("diverged_step", "last"))
            .join(data.select("run", "panel", "line").unique(), on="run")
            .with_columns(series=pl.lit("end"), marker=pl.lit(DIVERGED_AT), y_edge=pl.lit(top)))
    data = pl.concat([data, ends], how="diagonal_relaxed").with_columns(
        y_plot=pl.when(pl.col("marker") == VAL_MARK).then(pl.col("loss")).otherwise("y_edge"))
    markers = [k for k in (VAL_MARK, ABOVE_MARK, DIVERGED_AT) if (data["marker"] == k).any()]
    shape = alt.Shape("marker:N", title="marker", scale=alt.Scale(
        domain=markers, range=[{VAL_MARK: "circle", ABOVE_MARK: "triangle-up",
                                DIVERGED_AT: "cross"}[k] for k in markers]))
    panels = data["panel"].n_unique()
    width = panel_width(min(columns, panels))
    scale = alt.Scale(domain=[bottom, top], zero=False, nice=False)
    color = alt.Color("arm:N", scale=arm_scale(runs[M.ARM].unique().to_list()), title="arm")
    frameworks = data["framework"].drop_nulls().n_unique()
    dash = alt.StrokeDash("framework:N", title="framework",
                          legend=alt.Legend() if frameworks > 1 else None)
    x = alt.X("step:Q", title="step")
    train_l = (alt.Chart().mark_line(opacity=0.55, clip=True)
               .encode(x=x, y=alt.Y("loss:Q", scale=scale, title="loss (nats)"),
                       color=color, strokeDash=dash, detail="line:N")
               .transform_filter(alt.datum.series == "train"))
    # one point layer for val dots and edge markers: a layer that is empty in some panel makes
    # Vega warn about an infinite step extent there (the step axes are per panel)
    points = (alt.Chart().mark_point(filled=True, clip=False)
              .encode(x=x, y=alt.Y("y_plot:Q", scale=scale), color=color, detail="line:N",
                      shape=shape,
                      size=alt.condition(f"datum.marker == '{VAL_MARK}'", alt.value(25),
                                         alt.value(90)),
                      tooltip=["line:N", "marker:N", "step:Q",
                               alt.Tooltip("loss:Q", format=".4g")])
              .transform_filter("datum.marker != null"))
    layers = [train_l, points]
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=width, height=PANEL_H + 40)
                  .facet(facet=alt.Facet("panel:N", title=None, sort=alt.SortField("depth")),
                         columns=columns)
                  .resolve_scale(x="independent")
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


def _step_panels(data: pl.DataFrame) -> tuple[int, alt.Row, alt.Column]:
    """Width and facets of a probe-vs-step chart: rows by arm, columns by depth."""
    width = panel_width(data["depth"].n_unique())
    return (width, alt.Row("arm:N", title=None, header=ROW_HEADER),
            alt.Column("depth:O", title="depth"))


# Row headers read horizontally, above their row (a rotated label is cut at a short panel).
ROW_HEADER = alt.Header(labelAngle=0, labelOrient="top", labelAnchor="start",
                        labelFontWeight="bold", labelPadding=4)


def max_logit_chart(runs: pl.DataFrame, probes: pl.DataFrame) -> alt.Chart:
    """Largest pre-softmax attention logit (max over layers and heads) vs step, log y."""
    data = with_lr_label(probe_series(runs, probes, ["max_attention_logit"])
                         .filter(pl.col("value") > 0))
    if data.is_empty():
        return _empty("no max_attention_logit probe rows")
    width, row, column = _step_panels(data)
    return finish(alt.Chart(values(data)).mark_line(point=alt.OverlayMarkDef(size=12))
                  .encode(x="step:Q",
                          y=alt.Y("value:Q", scale=alt.Scale(type="log"),
                                  title="max attention logit"),
                          color=_lr_color(data), detail="lr:Q",
                          tooltip=["arm:N", alt.Tooltip("lr:Q", format=".3g"), "step:Q",
                                   alt.Tooltip("value:Q", format=".3g"), "seeds:Q"])
                  .properties(width=width, height=PANEL_H)
                  .facet(row=row, column=column)
                  .properties(title="Max attention logit vs step (seed mean; log scale)"))


def entropy_chart(runs: pl.DataFrame, probes: pl.DataFrame) -> alt.Chart:
    """Attention entropy vs step: mean over heads and layers (solid), lowest head (dashed)."""
    data = probe_series(runs, probes, ["attention_entropy_mean", "attention_entropy_min_head"])
    if data.is_empty():
        return _empty("no attention entropy probe rows")
    mean = pl.col("name") == "attention_entropy_mean"
    data = with_lr_label(data).with_columns(
        measure=pl.when(mean).then(pl.lit("mean over heads")).otherwise(pl.lit("lowest head")))
    width, row, column = _step_panels(data)
    return finish(alt.Chart(values(data)).mark_line()
                  .encode(x="step:Q", y=alt.Y("value:Q", title="attention entropy (nats)"),
                          color=_lr_color(data), detail="lr:Q",
                          strokeDash=alt.StrokeDash("measure:N", title="line",
                                                    sort=["mean over heads", "lowest head"]),
                          tooltip=["arm:N", "measure:N", alt.Tooltip("lr:Q", format=".3g"),
                                   "step:Q", alt.Tooltip("value:Q", format=".3f")])
                  .properties(width=width, height=PANEL_H)
                  .facet(row=row, column=column)
                  .properties(title="Attention entropy vs step (seed mean)"))


def other_probes_chart(runs: pl.DataFrame, probes: pl.DataFrame, names: list[str]) -> alt.Chart:
    """Other probes (e.g. residual kurtosis), reduced over layers, vs step; `probes` as in
    `probe_series`. One row per probe, titled in words."""
    data = with_lr_label(probe_series(runs, probes, names))
    if data.is_empty():
        return _empty("no other probe rows")
    order = [probe_words(n) for n in names]
    data = data.with_columns(probe=pl.col("name").map_elements(probe_words,
                                                               return_dtype=pl.String))
    width = panel_width(data["depth"].n_unique())
    return finish(alt.Chart(values(data)).mark_line()
                  .encode(x="step:Q", y=alt.Y("value:Q", title=None,
                                              scale=alt.Scale(zero=False)),
                          color=_lr_color(data), detail="lr:Q",
                          strokeDash=alt.StrokeDash("arm:N", title="arm"),
                          tooltip=["arm:N", "probe:N", alt.Tooltip("lr:Q", format=".3g"),
                                   "step:Q", alt.Tooltip("value:Q", format=".4g")])
                  .properties(width=width, height=PANEL_H - 40)
                  .facet(row=alt.Row("probe:N", title=None, sort=order, header=ROW_HEADER),
                         column=alt.Column("depth:O", title="depth"))
                  .resolve_scale(y="independent")
                  .properties(title="Other probes vs step (reduced over layers, seed mean)"))


# --- the headline: the answer at a glance ----------------------------------------------------

DECISION_STYLE = {  # decision -> (legend words, colour)
    H.OFF_WORSE: ("off worse (family-adjusted test)", "#c0392b"),
    H.NO_DIFFERENCE: ("no difference (equivalence test)", "#2471a3"),
    H.ON_WORSE: ("on worse (family-adjusted test)", "#7d3c98"),
    H.UNDETERMINED: ("undetermined", "#999999"),
}


UNTESTED_WORDS = {H.UNINFORMATIVE: "neither arm learned", H.TOO_FEW: "one seed"}
BOTH_DIVERGED = "both arms diverged"
GREYED = "#b0b0b0"  # LRs run without a test: drawn, but never in a decision's colour
EDGE_MARK = "interval continues beyond the axis"


def gap_axis_range(means: list[float], floor: float = 0.05) -> tuple[float, float]:
    """The y range of a gap chart: the seed-mean gaps and zero with a margin (never less than
    +-floor nats), so one wide interval cannot flatten every gap onto the zero line."""
    lo, hi = min(means + [0.0]), max(means + [0.0])
    pad = max(0.25 * (hi - lo), floor)
    return lo - pad, hi + pad


def headline_chart(gaps: pl.DataFrame, thresholds: pl.DataFrame, arms: pl.DataFrame
                   ) -> alt.Chart:
    """Per depth (one panel each, one row per compared arm): the paired gap off minus on with
    its 95% interval at every LR run in both arms, coloured by the cell's decision; cells
    without a test (neither arm learned, or one seed) greyed at zero and labelled. The y axis
    spans the seed-mean gaps: an interval beyond it is cut at the edge and marked there with
    a triangle. The necessity threshold is a black rule with its 95% interval as a grey band,
    the off arm's first divergent LR (seed geometric mean) a dashed rule; each sits at its
    true LR on an axis that covers every LR run, or is written as beyond it."""
    if gaps.is_empty():
        return _empty("no LR run in both arms yet")
    words = {k: v[0] for k, v in DECISION_STYLE.items()} | UNTESTED_WORDS
    both_diverged = ((pl.col("off_diverged") >= pl.col("pairs"))
                     & (pl.col("on_diverged") >= pl.col("pairs")))
    cells = gaps.with_columns(
        outcome=pl.when((pl.col("decision") == H.UNINFORMATIVE) & both_diverged)
        .then(pl.lit(BOTH_DIVERGED))
        .otherwise(pl.col("decision").replace_strict(words, default="untested")),
        tested=pl.col("decision").is_in(list(DECISION_STYLE)),
        compared=pl.format("off minus {}", pl.col("compared_arm").map_elements(
            M.arm_words, return_dtype=pl.String)),
        kind=pl.lit("cell"))
    tested = cells.filter("tested")
    y_lo, y_hi = gap_axis_range(tested["mean_gap"].drop_nulls().to_list())
    cells = cells.with_columns(
        y=pl.when("tested").then(pl.col("mean_gap")).otherwise(0.0),
        bar_lo=pl.col("ci_lo").clip(y_lo, y_hi), bar_hi=pl.col("ci_hi").clip(y_lo, y_hi),
        cut_lo=pl.col("ci_lo") < y_lo, cut_hi=pl.col("ci_hi") > y_hi)
    lrs = cells["lr"].to_list()
    width = panel_width(cells["depth"].n_unique())
    lo, hi = min(lrs) / 1.3, max(lrs) * 1.3
    panels = cells.select("depth", "compared_arm", "compared").unique()
    th = (thresholds.join(panels, on=["depth", "compared_arm"])
          .filter(pl.col("threshold_lr").is_not_null())
          .with_columns(band_lo=pl.col("ci_lo").fill_null(lo).clip(lo, hi),
                        band_hi=pl.col("ci_hi").fill_null(hi).clip(lo, hi),
                        kind=pl.lit("threshold"),
                        label=pl.format("threshold {}", pl.col("threshold")))
          .select("depth", "compared", "band_lo", "band_hi", "kind", "threshold", "label",
                  lr="threshold_lr"))
    boundary = (arms.filter((pl.col(M.ARM) == M.OFF) & pl.col("first_divergent_lr").is_not_null())
                .join(panels, on="depth")
                .select("depth", "compared", lr="first_divergent_lr")
                .with_columns(kind=pl.lit("divergence"), label=pl.lit("off diverges")))
    rules = pl.concat([th, boundary], how="diagonal_relaxed").with_columns(
        label=pl.when(pl.col("lr") > hi).then(pl.format("{} beyond the axis (lr {}) >",
                                                        "label", pl.col("lr").round_sig_figs(3)))
        .when(pl.col("lr") < lo).then(pl.format("< {} beyond the axis (lr {})", "label",
                                                pl.col("lr").round_sig_figs(3)))
        .otherwise("label"),
        lr=pl.col("lr").clip(lo, hi), y_top=pl.lit(y_hi))
    cut = pl.concat([
        cells.filter(pl.col("tested") & pl.col("cut_hi")).with_columns(y=pl.lit(y_hi), edge=pl.lit("up")),
        cells.filter(pl.col("tested") & pl.col("cut_lo")).with_columns(y=pl.lit(y_lo), edge=pl.lit("down")),
    ]).with_columns(kind=pl.lit("cut"), marker=pl.lit(EDGE_MARK))
    data = pl.concat([cells.select("depth", "compared", "lr", "mean_gap", "ci_lo", "ci_hi",
                                   "bar_lo", "bar_hi", "y", "pairs", "q_off_worse",
                                   "q_equivalent", "outcome", "tested", "kind", "seed_gaps"),
                      rules, cut.select("depth", "compared", "lr", "y", "edge", "kind",
                                        "marker", "ci_lo", "ci_hi")], how="diagonal_relaxed")
    x_scale = alt.Scale(type="log", nice=False, domain=[lo, hi])
    x = alt.X("lr:Q", scale=x_scale, axis=lr_axis(lrs, width))
    y_scale = alt.Scale(domain=[y_lo, y_hi], nice=False, zero=False)
    y_title = "final loss gap, off - on (nats)"
    shown = [w for k, (w, _) in DECISION_STYLE.items() if w in tested["outcome"].to_list()]
    greyed = [w for w in [*UNTESTED_WORDS.values(), BOTH_DIVERGED]
              if w in cells["outcome"].to_list()]
    color = alt.Color("outcome:N", title="decision", scale=alt.Scale(
        domain=shown + greyed,
        range=[c for w, c in DECISION_STYLE.values() if w in shown] + [GREYED] * len(greyed)))
    tooltip = [alt.Tooltip("lr:Q", format=".3g"), alt.Tooltip("mean_gap:Q", format="+.3f"),
               alt.Tooltip("ci_lo:Q", format="+.3f"), alt.Tooltip("ci_hi:Q", format="+.3f"),
               "pairs:Q", "seed_gaps:N", alt.Tooltip("q_off_worse:Q", format=".2g"),
               alt.Tooltip("q_equivalent:Q", format=".2g"), "outcome:N"]
    zero = alt.Chart().mark_rule(color="#444", strokeWidth=0.8).encode(y=alt.datum(0))
    band = (alt.Chart().mark_rect(color="#000", opacity=0.08)
            .encode(x=alt.X("band_lo:Q", scale=x_scale), x2="band_hi:Q")
            .transform_filter(alt.datum.kind == "threshold"))
    rule = (alt.Chart().mark_rule(color="#000", strokeWidth=2)
            .encode(x=x, tooltip=["threshold:N"])
            .transform_filter(alt.datum.kind == "threshold"))
    diverge = (alt.Chart().mark_rule(color="#d95f02", strokeDash=[6, 4], strokeWidth=1.5)
               .encode(x=x, tooltip=["label:N"]).transform_filter(alt.datum.kind == "divergence"))
    rule_text = (alt.Chart().mark_text(align="left", baseline="top", dx=3, dy=2, fontSize=10,
                                       color="#333")
                 .encode(x=x, y=alt.Y("y_top:Q", scale=y_scale), text="label:N")
                 .transform_filter("datum.kind == 'threshold' || datum.kind == 'divergence'"))
    bars = (alt.Chart().mark_rule(strokeWidth=2)
            .encode(x=x, y=alt.Y("bar_lo:Q", scale=y_scale, title=y_title), y2="bar_hi:Q",
                    color=color)
            .transform_filter("datum.kind == 'cell' && datum.tested"))
    dots = (alt.Chart().mark_point(filled=True, size=60)
            .encode(x=x, y=alt.Y("y:Q", scale=y_scale, title=y_title), color=color,
                    shape=alt.condition("datum.tested", alt.value("circle"), alt.value("cross")),
                    tooltip=tooltip)
            .transform_filter(alt.datum.kind == "cell").add_params(lr_brush()))
    untested = (alt.Chart().mark_text(angle=270, align="left", dx=8, fontSize=10, color="#777")
                .encode(x=x, y=alt.Y("y:Q", scale=y_scale), text="outcome:N")
                .transform_filter("datum.kind == 'cell' && !datum.tested"))
    edges = (alt.Chart().mark_point(filled=True, size=70, color="#333")
             .encode(x=x, y=alt.Y("y:Q", scale=y_scale),
                     shape=alt.Shape("edge:N", legend=None, scale=alt.Scale(
                         domain=["up", "down"], range=["triangle-up", "triangle-down"])),
                     tooltip=["marker:N", alt.Tooltip("ci_lo:Q", format="+.3f"),
                              alt.Tooltip("ci_hi:Q", format="+.3f")])
             .transform_filter(alt.datum.kind == "cut"))
    layers = [zero, band, rule, diverge, rule_text, bars, dots]
    if greyed:
        layers.append(untested)
    if cut.height:
        layers.append(edges)
    subtitle = ["black rule and grey band: the necessity threshold and its 95% interval; dashed "
                "orange: where off first diverges (seed geometric mean)"]
    if cut.height:
        subtitle.append("the y axis spans the seed-mean gaps: a triangle marks an interval that "
                        "continues beyond it (its ends are in the tooltip)")
    if greyed:
        subtitle.append("grey crosses: LRs run without a test (" + "; ".join(greyed) + ")")
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=width, height=PANEL_H)
                  .facet(column=alt.Column("depth:O", title=None, header=alt.Header(
                      labelExpr="'depth ' + datum.value", labelFontWeight="bold")),
                         row=alt.Row("compared:N", title=None, header=ROW_HEADER))
                  .properties(title=alt.Title(
                      "Where QK-norm is needed: off minus on, with 95% intervals over seeds",
                      subtitle=subtitle)))


# --- off minus on map -------------------------------------------------------------------------

def gap_map_data(gaps: pl.DataFrame, thresholds: pl.DataFrame) -> pl.DataFrame:
    """Cells with log-midpoint edges per depth, plus the necessity boundary per depth."""
    ratio = (pl.col("lr") / pl.col("prev")).sqrt()
    cells = (gaps.sort("compared_arm", "depth", "lr")
             .with_columns(prev=pl.col("lr").shift(1).over("compared_arm", "depth"),
                           next=pl.col("lr").shift(-1).over("compared_arm", "depth"))
             .with_columns(x_lo=pl.when(pl.col("prev").is_not_null())
                           .then(pl.col("lr") / ratio)
                           .otherwise(pl.col("lr") / (pl.col("next") / pl.col("lr")).sqrt()),
                           x_hi=pl.when(pl.col("next").is_not_null())
                           .then((pl.col("lr") * pl.col("next")).sqrt())
                           .otherwise(pl.col("lr") * ratio))
             .with_columns(x_lo=pl.col("x_lo").fill_null(pl.col("lr") / 1.5),
                           x_hi=pl.col("x_hi").fill_null(pl.col("lr") * 1.5),
                           row=(pl.col("depth").rank("dense") - 1).cast(pl.Int64))
             .with_columns(y_lo=pl.col("row") - 0.45, y_hi=pl.col("row") + 0.45,
                           divergence=pl.when((pl.col("off_diverged") > 0)
                                              & (pl.col("on_diverged") > 0))
                           .then(pl.lit("both diverged"))
                           .when(pl.col("off_diverged") > 0).then(pl.lit("off diverged"))
                           .when(pl.col("on_diverged") > 0).then(pl.lit("on diverged")),
                           tested=(pl.col("pairs") >= 2) & pl.col("informative"),
                           untested=pl.when(pl.col("pairs") < 2)
                           .then(pl.format("n={}", "pairs"))
                           .when(~pl.col("informative")).then(pl.lit("neither learned")),
                           outcome=pl.when(pl.col("pairs") < 2).then(None)
                           .when(pl.col("worse")).then(pl.lit("off worse"))
                           .when(pl.col("no_difference")).then(pl.lit("no difference")),
                           compared=pl.format("off minus {}", pl.col("compared_arm").map_elements(
                               M.arm_words, return_dtype=pl.String)),
                           kind=pl.lit("cell")))
    boundary = (cells.select("depth", "compared_arm", "row", "compared").unique()
                .join(thresholds.filter(pl.col("threshold_lr").is_not_null())
                      .select("depth", "compared_arm", lr="threshold_lr"), on=["depth", "compared_arm"])
                .with_columns(x_lo=pl.col("lr"), y_lo=pl.lit(0.0), y_hi=pl.lit(0.0))
                .select("depth", "row", "compared_arm", "compared", "lr", "x_lo", "y_lo", "y_hi")
                .with_columns(kind=pl.lit("boundary"), y_lo=pl.col("row") - 0.5,
                              y_hi=pl.col("row") + 0.5))
    return pl.concat([cells.drop("prev", "next"), boundary], how="diagonal_relaxed")


# The gap map's markers, in the legend's words; divergence sits low in a cell, the paired
# test's outcome high, so a cell can show both.
GAP_MARKERS = {"off worse": ("off worse (paired test, gap >= min gap)", "triangle-up", 0.22),
               "no difference": ("no difference (equivalence test)", "stroke", 0.22),
               "off diverged": ("off diverged", "cross", -0.22),
               "on diverged": ("compared arm diverged", "circle", -0.22),
               "both diverged": ("both diverged", "square", -0.22)}
UNTESTED_GREY = "#d4d4d4"
GAP_COLOR_FLOOR = 0.1  # nats (five times the default min_gap)


def gap_map_chart(gaps: pl.DataFrame, thresholds: pl.DataFrame) -> alt.Chart:
    """LR x depth map of the seed-mean gap (off minus on, clipped losses): red = off worse.
    Cells without a paired test (fewer than 2 paired seeds) are grey with their n; markers
    show where the paired test found off worse or no difference, and where runs diverged;
    the black bar is the necessity threshold of each depth."""
    data = gap_map_data(gaps, thresholds)
    if data.is_empty():
        return _empty("no LR run in both arms")
    depths = sorted(gaps["depth"].unique().to_list())
    tested = data.filter(pl.col("kind") == "cell").filter(pl.col("tested"))
    # the colour saturates at the largest tested gap, but never below GAP_COLOR_FLOOR: a gap
    # smaller than that is never drawn in a colour that looks decisive
    limit = max([abs(x) for x in tested["mean_gap"].drop_nulls().to_list()] + [GAP_COLOR_FLOOR])
    width = panel_width(1)
    xs = alt.Scale(type="log", nice=False, domain=[float(data["x_lo"].min()),
                                                   float(data["x_hi"].max())])
    x = alt.X("x_lo:Q", axis=lr_axis(gaps["lr"].to_list(), width), scale=xs)
    # one evenly spaced row per depth (depths 2, 4, 8 get rows 0, 1, 2)
    names = json.dumps([str(d) for d in depths])
    y = alt.Y("y_lo:Q", title="depth", scale=alt.Scale(domain=[-0.6, len(depths) - 0.4],
                                                         nice=False),
              axis=alt.Axis(values=list(range(len(depths))), labelExpr=f"{names}[datum.value]",
                            grid=False))
    color = alt.Color("mean_gap:Q", title=["off - compared", "loss (nats)"],
                      scale=alt.Scale(scheme="redblue", reverse=True, domain=[-limit, limit],
                                      domainMid=0))
    tooltip = [alt.Tooltip("lr:Q", format=".3g"), "depth:Q", "pairs:Q",
               alt.Tooltip("mean_gap:Q", format="+.4f"), "seed_gaps:N", "spread:N",
               alt.Tooltip("p_off_worse:Q", format=".2g"), "worse:N", "no_difference:N",
               "off_diverged:Q", "on_diverged:Q", "needed:N"]
    cells = (alt.Chart().mark_rect(stroke="white", strokeWidth=0.5)
             .encode(x=x, x2="x_hi:Q", y=y, y2="y_hi:Q",
                     color=alt.condition("datum.tested", color, alt.value(UNTESTED_GREY)),
                     tooltip=tooltip)
             .transform_filter(alt.datum.kind == "cell"))
    cell = data.filter(pl.col("kind") == "cell")
    present = [k for k in GAP_MARKERS
               if (cell["divergence"] == k).any() or (cell["outcome"] == k).any()]
    marked = pl.concat([
        cell.filter(pl.col(col).is_not_null())
        .with_columns(marker=pl.col(col).replace_strict(
            {k: v[0] for k, v in GAP_MARKERS.items()}, default=None),
            y_mark=pl.col("row") + pl.col(col).replace_strict(
                {k: v[2] for k, v in GAP_MARKERS.items()}, default=0.0))
        for col in ("divergence", "outcome")], how="diagonal_relaxed").select(
            "compared_arm", "compared", "depth", "row", "lr", "y_mark", "marker",
            kind=pl.lit("marker"))
    shape = alt.Shape("marker:N", title="markers", scale=alt.Scale(
        domain=[GAP_MARKERS[k][0] for k in present], range=[GAP_MARKERS[k][1] for k in present]))
    marks = (alt.Chart().mark_point(size=110, filled=False, strokeWidth=2, color="black")
             .encode(x=alt.X("lr:Q", scale=xs), y=alt.Y("y_mark:Q"),
                     shape=shape)
             .transform_filter(alt.datum.kind == "marker"))
    untested = (alt.Chart().mark_text(fontSize=11, color="#444")
                .encode(x=alt.X("lr:Q", scale=xs), y=alt.Y("row:Q"),
                        text="untested:N")
                .transform_filter("datum.kind == 'cell' && !datum.tested"))
    edge = (alt.Chart().mark_rule(color="black", strokeWidth=3)
            .encode(x="x_lo:Q", y="y_lo:Q", y2="y_hi:Q")
            .transform_filter(alt.datum.kind == "boundary"))
    layers = [cells]
    if present:
        layers.append(marks)
    if not cell["tested"].all():
        layers.append(untested)
    if (data["kind"] == "boundary").any():
        layers.append(edge)
    chart = alt.layer(*layers, data=values(pl.concat([data, marked], how="diagonal_relaxed")))
    chart = chart.properties(width=width, height=max(110, 70 * len(depths)))
    title = "Off minus each compared arm: seed-mean final-loss gap per depth and LR"
    subtitle = ["red: off is worse; grey: no paired test (fewer than 2 paired seeds, or "
                "neither arm learned: every run of both diverged or degraded)"]
    if (data["kind"] == "boundary").any():
        subtitle[0] += "; black bar: necessity threshold"
    return finish(chart.facet(row=alt.Row("compared:N", title=None, header=ROW_HEADER))
                  .properties(title=alt.TitleParams(title, subtitle=subtitle)))


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
    return finish(alt.layer(dots, line, data=values(data))
                  .properties(width=panel_width(1), height=PANEL_H + 60,
                              title="LR sensitivity vs depth (open dots: seeds; line: seed "
                                    "mean; Wortsman et al. 2023)"))


MEASURED, LOWER_BOUND = "measured", "lower bound (no run diverged)"


def landmarks_chart(arms: pl.DataFrame, thresholds: pl.DataFrame) -> alt.Chart:
    """Per depth: optimal LR and max stable LR per arm (range over seeds), and the necessity
    threshold with its 95% bootstrap interval (a censored threshold has no point). Open
    triangles: max stable LR is a lower bound."""
    arms = M.with_arm(arms)
    a = arms.with_columns(arm_expr())
    frames = [
        a.select("depth", "arm", value="optimal_lr", lo="optimal_lr_lo", hi="optimal_lr_hi")
        .with_columns(measure=pl.lit("optimal LR"), bound=pl.lit(False)),
        a.select("depth", "arm", value="max_stable_lr", lo="max_stable_lr_lo",
                 hi="max_stable_lr_hi", bound=pl.col("censored_seeds") > 0)
        .with_columns(measure=pl.lit("max stable LR")),
        # a bootstrap end that is censored (beyond the LRs run) is null: drawn to the edge
        thresholds.select("depth", value="threshold_lr", lo="ci_lo", hi="ci_hi",
                          arm=pl.format("necessity ({} vs off)", "compared_arm"),
                          interval="threshold")
        .with_columns(measure=pl.lit("necessity threshold"), bound=pl.lit(False)),
    ]
    data = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("value").is_not_null())
    if data.is_empty():
        return _empty("no learning-rate landmarks")
    known = [v for c in ("value", "lo", "hi") for v in data[c].drop_nulls().to_list() if v > 0]
    y_min, y_max = min(known) / 2, max(known) * 2
    cut = pl.col("measure") == "necessity threshold"
    data = data.with_columns(
        edge=pl.when(cut & pl.col("hi").is_null()).then(pl.lit("up"))
        .when(cut & pl.col("lo").is_null()).then(pl.lit("down")),
        lo=pl.col("lo").fill_null(pl.when(cut).then(y_min).otherwise("value")),
        hi=pl.col("hi").fill_null(pl.when(cut).then(y_max).otherwise("value")))
    depths = sorted(arms["depth"].unique().to_list())
    scale = arm_scale(arms[M.ARM].unique().to_list())
    kinds = thresholds["compared_arm"].unique().to_list()
    scale = alt.Scale(domain=list(scale.domain) + [f"necessity ({k} vs off)" for k in kinds],
                      range=list(scale.range) + ["#000000"] * len(kinds))
    data = data.with_columns(
        offset=pl.col("measure").replace_strict({"optimal LR": -0.12, "max stable LR": 0.0,
                                                 "necessity threshold": 0.12})
        + pl.when(pl.col("arm") == OFF_LABEL).then(-0.04).otherwise(0.04),
    ).with_columns(x=pl.col("depth") + pl.col("offset"))
    x = alt.X("x:Q", title="depth", axis=alt.Axis(values=depths, format="d"),
              scale=alt.Scale(domain=[min(depths) - 0.5, max(depths) + 0.5], nice=False))
    y_scale = alt.Scale(type="log", domain=[y_min, y_max], nice=False)
    y = alt.Y("value:Q", scale=y_scale, title="learning rate (log)", axis=alt.Axis(format=".0e"))
    color = alt.Color("arm:N", scale=scale, title=None)
    rules = alt.Chart().mark_rule().encode(x=x, y=alt.Y("lo:Q", scale=y_scale), y2="hi:Q",
                                           color=color)
    # an interval end beyond the LRs run: a triangle at the edge says it goes on
    ends = [alt.Chart().mark_point(filled=True, size=60, color="#000", shape=f"triangle-{edge}")
            .encode(x=x, y=alt.Y(f"{end}:Q", scale=y_scale), tooltip=["arm:N", "interval:N"])
            .transform_filter(f"datum.edge == '{edge}'")
            for edge, end in (("up", "hi"), ("down", "lo")) if (data["edge"] == edge).any()]
    shape = alt.Shape("measure:N", title=None,
                      scale=alt.Scale(domain=["optimal LR", "max stable LR",
                                              "necessity threshold"],
                                      range=["circle", "triangle-up", "diamond"]))
    tooltip = ["measure:N", "arm:N", "depth:Q", alt.Tooltip("value:Q", format=".3g"),
               alt.Tooltip("lo:Q", format=".3g"), alt.Tooltip("hi:Q", format=".3g"),
               alt.Tooltip("interval:N", title="threshold [95% interval]"),
               alt.Tooltip("bound:N", title="lower bound only")]
    kinds = [MEASURED, LOWER_BOUND] if data["bound"].any() else [MEASURED]
    fill = alt.FillOpacity("value_kind:O", title="value", sort=kinds, scale=alt.Scale(
        domain=kinds, range=[1, 0][:len(kinds)]))
    data = data.with_columns(value_kind=pl.when("bound").then(pl.lit(LOWER_BOUND))
                             .otherwise(pl.lit(MEASURED)))
    dots = (alt.Chart().mark_point(size=80, filled=True, strokeWidth=2)
            .encode(x=x, y=y, color=color, stroke=color, shape=shape, fillOpacity=fill,
                    tooltip=tooltip))
    layers = [rules, dots, *ends]
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=panel_width(1), height=PANEL_H + 100,
                              title="Learning-rate landmarks vs depth (bars: seed range; "
                                    "for the threshold, its 95% interval)"))


def _empty(message: str) -> alt.Chart:
    """A small chart that says why there is nothing to draw (so a report never breaks)."""
    return (alt.Chart(alt.Data(values=[{"message": message}])).mark_text(size=14)
            .encode(text="message:N").properties(width=panel_width(1), height=40))



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
