"""Altair charts of the study: the shared look and helpers, the loss chart and the headline.
Data go inline (non-finite numbers as null); charts are saved as PNG, SVG and HTML."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl
import polars.selectors as cs
import vl_convert as vlc

from qkstudy.variants import NONE, VARIANTS

from . import hypotheses as H
from . import metrics as M

PANEL_W, PANEL_H = 230, 200  # the smallest panel width; the height of a small-multiple panel
PAGE_W = 1360  # a chart's width with axes and legend (the page scales it down when narrow)
LEGEND_W, AXIS_W, SPACING = 200, 70, 20
MAX_PANEL_W = 1000
OFF_LABEL = M.arm_words(M.OFF)
ATTENTION_PROBES = ("max_attention_logit", "attention_entropy_mean", "attention_entropy_min_head")
# off is always the warm orange, QK-norm arms greens/purples, rival controls further colours
ARM_COLORS = {v.name: v.colour for v in (NONE, *VARIANTS.values())}  # qkstudy/variants.py
MORE_COLORS = ("#e7298a", "#e6ab02", "#a6761d", "#666666", "#b15928", "#6a3d9a")


def arm_expr() -> pl.Expr:
    """The `arm` column in words (the legend's labels)."""
    return pl.col(M.ARM).map_elements(M.arm_words, return_dtype=pl.String).alias(M.ARM)


def arm_scale(arms: list[str]) -> alt.Scale:
    """One colour per arm, the same in every chart: off first, then the arms by name."""
    names = sorted(set(arms), key=lambda k: (k != M.OFF, k not in ARM_COLORS, k))
    rest = iter(MORE_COLORS * (1 + len(names) // len(MORE_COLORS)))
    return alt.Scale(domain=[M.arm_words(k) for k in names],
                     range=[ARM_COLORS.get(k) or next(rest) for k in names])


def panel_width(columns: int) -> int:
    """The width of one of `columns` plot areas side by side on a page; at least PANEL_W."""
    spare = PAGE_W - LEGEND_W - AXIS_W - (max(columns, 1) - 1) * SPACING
    return int(max(PANEL_W, min(MAX_PANEL_W, spare / max(columns, 1))))


def lr_x(lrs: list[float]) -> tuple[alt.X, alt.Scale]:
    """A log LR axis a little wider than the LRs (and its scale); Vega-Lite picks the ticks."""
    lrs = [v for v in lrs if v and v > 0]
    scale = alt.Scale(type="log", nice=False, domain=[min(lrs) / 1.3, max(lrs) * 1.3])
    return alt.X("lr:Q", scale=scale, axis=alt.Axis(
        format=".3~g", tickCount=3, labelOverlap="greedy", title="learning rate (log)",
        labelFlush=False)), scale


def finish(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """Shared look: readable fonts, headers that are not cut, labels that do not overlap."""
    return (chart.configure_axis(labelFontSize=11, titleFontSize=12, labelOverlap="greedy",
                                 titleLimit=0)
            .configure_header(labelFontSize=12, titleFontSize=12, labelLimit=0)
            .configure_legend(labelFontSize=11, titleFontSize=12, labelLimit=0)
            .configure_title(fontSize=15, anchor="start", limit=0))


PROBE_WORDS = {
    "max_attention_logit_capped": "max attention logit after the soft-cap",
    "max_attention_logit_bound": "QK-norm logit bound",
    "attention_entropy_mean": "attention entropy (mean over heads)",
    "attention_entropy_min_head": "attention entropy (lowest head)",
    "residual_max_abs_over_rms": "residual max |x| / rms",
    "output_logsumexp_mean": "output log-sum-exp (mean)",
}


def probe_words(name: str) -> str:
    """A probe's name as a title ("residual_kurtosis" -> "residual kurtosis")."""
    return PROBE_WORDS.get(name) or name.replace("_", " ")


def values(df: pl.DataFrame) -> alt.Data:
    """Inline data with NaN and +-inf as null (JSON has neither)."""
    finite = pl.when(cs.float().is_finite()).then(cs.float())
    return alt.Data(values=df.with_columns(finite).to_dicts())


MEAN_MARK, DIVERGED_MARK, OTHER_MARK = ("seed mean", "diverged run (at its initial loss)",
                                       "another framework's run")
LR_TIP = alt.Tooltip("lr:Q", format=".3g")
LOSS_TIP = alt.Tooltip("loss:Q", format=".4f")
MARKS = {  # the loss chart's points: marker -> (shape, mark, tooltip)
    MEAN_MARK: ("circle", {"filled": True, "size": 40},
                ["arm:N", LR_TIP, LOSS_TIP, "seeds:Q", "diverged:Q"]),
    DIVERGED_MARK: ("cross", {"size": 110, "filled": True, "strokeWidth": 1},
                    ["arm:N", LR_TIP, "seed:N"]),
    OTHER_MARK: ("diamond", {"size": 90, "filled": False, "strokeWidth": 2},
                 ["framework:N", "arm:N", "seed:N", LOSS_TIP])}


def loss_vs_lr_chart(points: pl.DataFrame, twins: pl.DataFrame | None = None) -> alt.FacetChart:
    """Final val loss vs LR per depth: seed mean, seed range, diverged runs, twins."""
    p = M.with_losses(points).with_columns(arm_expr())
    loss = pl.col("loss_clipped")
    frames = {MEAN_MARK: p.group_by("depth", "arm", "lr").agg(
        loss=loss.mean(), lo=loss.min(), hi=loss.max(), seeds=pl.len(),
        diverged=pl.col("diverged").sum()),
        DIVERGED_MARK: p.filter("diverged").select("depth", "arm", "lr", "seed", loss=loss)}
    if twins is not None:
        frames[OTHER_MARK] = (M.with_losses(twins).with_columns(arm_expr())
                              .select("depth", "arm", "lr", "framework", "seed", loss=loss))
    frames = {k: f.with_columns(marker=pl.lit(k)) for k, f in frames.items()
              if f.height or k == MEAN_MARK}
    data = pl.concat(list(frames.values()), how="diagonal_relaxed").sort("depth", "arm", "lr")
    width = panel_width(data["depth"].n_unique())
    color = alt.Color("arm:N", scale=arm_scale(points[M.ARM].unique().to_list()), title="arm",
                      legend=alt.Legend(symbolOpacity=1))
    shape = alt.Shape("marker:N", title="marker", scale=alt.Scale(
        domain=list(frames), range=[MARKS[k][0] for k in frames]))
    title = "final val loss (clipped)"
    y = alt.Y("loss:Q", scale=alt.Scale(zero=False), title=title)
    base = alt.Chart().encode(x=lr_x(data["lr"].to_list())[0], color=color)
    mean = alt.datum.marker == MEAN_MARK
    layers = [base.mark_area(opacity=0.18).encode(y=alt.Y("lo:Q", title=title), y2="hi:Q")
              .transform_filter(mean), base.mark_line().encode(y=y).transform_filter(mean)]
    layers += [base.mark_point(**MARKS[marker][1])
               .encode(y=y, shape=shape, tooltip=MARKS[marker][2])
               .transform_filter(alt.datum.marker == marker) for marker in frames]
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=width, height=PANEL_H + 60)
                  .facet(column=alt.Column("depth:O", title="depth"))
                  .properties(title="Final loss vs learning rate (line: seed mean, "
                                    "band: seed range)"))


# row headers read horizontally, above their row (a rotated label is cut at a short panel)
ROW_HEADER = alt.Header(labelAngle=0, labelOrient="top", labelAnchor="start",
                        labelFontWeight="bold", labelPadding=4)


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


def _headline_cells(gaps: pl.DataFrame) -> tuple[pl.DataFrame, float, float]:
    """The gap cells with their outcome in words, y and interval cut to the y range."""
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
    # the y axis: the tested seed-mean gaps and zero with a margin (not the widest interval)
    means = cells.filter("tested")["mean_gap"].drop_nulls().to_list() + [0.0]
    pad = max(0.25 * (max(means) - min(means)), 0.05)
    y_lo, y_hi = min(means) - pad, max(means) + pad
    cells = cells.with_columns(
        y=pl.when("tested").then(pl.col("mean_gap")).otherwise(0.0),
        bar_lo=pl.col("ci_lo").clip(y_lo, y_hi), bar_hi=pl.col("ci_hi").clip(y_lo, y_hi))
    return cells, y_lo, y_hi


def _headline_rules(cells: pl.DataFrame, thresholds: pl.DataFrame, arms: pl.DataFrame,
                    lo: float, hi: float, y_top: float) -> pl.DataFrame:
    """Per panel the onset with its band and off's first divergent LR, on the axis."""
    panels = cells.select("depth", "compared_arm", "compared").unique()
    onset = (thresholds.join(panels, on=["depth", "compared_arm"])
             .filter(pl.col("onset_lr").is_not_null())
             .with_columns(band_lo=pl.col("ci_lo").fill_null(lo).clip(lo, hi),
                           band_hi=pl.col("ci_hi").fill_null(hi).clip(lo, hi),
                           kind=pl.lit("onset"), label=pl.format("onset {}", pl.col("onset")))
             .select("depth", "compared", "band_lo", "band_hi", "kind", "onset", "label",
                     lr="onset_lr"))
    boundary = (arms.filter((pl.col(M.ARM) == M.OFF) & pl.col("first_divergent_lr").is_not_null())
                .join(panels, on="depth").select("depth", "compared", lr="first_divergent_lr")
                .with_columns(kind=pl.lit("divergence"), label=pl.lit("off diverges")))
    lr = pl.col("lr").round_sig_figs(3)
    return pl.concat([onset, boundary], how="diagonal_relaxed").with_columns(
        label=pl.when(pl.col("lr") > hi).then(pl.format("{} beyond the axis (lr {}) >", "label", lr))
        .when(pl.col("lr") < lo).then(pl.format("< {} beyond the axis (lr {})", "label", lr))
        .otherwise("label"), lr=pl.col("lr").clip(lo, hi), y_top=pl.lit(y_top))


def _headline_layers(x: alt.X, x_scale: alt.Scale, y_scale: alt.Scale, color: alt.Color
                     ) -> list[alt.Chart]:
    y_title = "final loss gap, off - on (nats)"
    tooltip = [alt.Tooltip("lr:Q", format=".3g"), alt.Tooltip("mean_gap:Q", format="+.3f"),
               alt.Tooltip("ci_lo:Q", format="+.3f"), alt.Tooltip("ci_hi:Q", format="+.3f"),
               "pairs:Q", "seed_gaps:N", alt.Tooltip("q_off_worse:Q", format=".2g"),
               alt.Tooltip("q_equivalent:Q", format=".2g"), "outcome:N"]
    c = alt.Chart()
    return [
        c.mark_rule(color="#444", strokeWidth=0.8).encode(y=alt.datum(0)),
        c.mark_rect(color="#000", opacity=0.08).encode(
            x=alt.X("band_lo:Q", scale=x_scale), x2="band_hi:Q")
        .transform_filter(alt.datum.kind == "onset"),
        c.mark_rule(color="#000", strokeWidth=2).encode(x=x, tooltip=["onset:N"])
        .transform_filter(alt.datum.kind == "onset"),
        c.mark_rule(color="#d95f02", strokeDash=[6, 4], strokeWidth=1.5)
        .encode(x=x, tooltip=["label:N"]).transform_filter(alt.datum.kind == "divergence"),
        c.mark_text(align="left", baseline="top", dx=3, dy=2, fontSize=10, color="#333")
        .encode(x=x, y=alt.Y("y_top:Q", scale=y_scale), text="label:N")
        .transform_filter("datum.kind == 'onset' || datum.kind == 'divergence'"),
        c.mark_rule(strokeWidth=2).encode(
            x=x, y=alt.Y("bar_lo:Q", scale=y_scale, title=y_title), y2="bar_hi:Q", color=color)
        .transform_filter("datum.kind == 'cell' && datum.tested"),
        c.mark_point(filled=True, size=60).encode(
            x=x, y=alt.Y("y:Q", scale=y_scale, title=y_title), color=color, tooltip=tooltip,
            shape=alt.condition("datum.tested", alt.value("circle"), alt.value("cross")))
        .transform_filter(alt.datum.kind == "cell")]


def headline_chart(gaps: pl.DataFrame, thresholds: pl.DataFrame, arms: pl.DataFrame
                   ) -> alt.Chart:
    """Per depth and compared arm: the gap off minus on by LR, coloured by decision."""
    if gaps.is_empty():
        return _empty("no LR run in both arms yet")
    cells, y_lo, y_hi = _headline_cells(gaps)
    lrs = cells["lr"].to_list()
    width = panel_width(cells["depth"].n_unique())
    x, x_scale = lr_x(lrs)
    lo, hi = x_scale.domain
    rules = _headline_rules(cells, thresholds, arms, lo, hi, y_hi)
    cut = pl.concat([  # an interval beyond the y axis: a triangle where it leaves it
        cells.filter(pl.col("tested") & (pl.col(end) > y_hi if up else pl.col(end) < y_lo))
        .with_columns(y=pl.lit(y_hi if up else y_lo), edge=pl.lit("up" if up else "down"))
        for up, end in ((True, "ci_hi"), (False, "ci_lo"))]).with_columns(
        kind=pl.lit("cut"), marker=pl.lit(EDGE_MARK))
    data = pl.concat([cells, rules, cut], how="diagonal_relaxed")
    y_scale = alt.Scale(domain=[y_lo, y_hi], nice=False, zero=False)
    tested = cells.filter("tested")["outcome"].to_list()
    shown = [w for w, _ in DECISION_STYLE.values() if w in tested]
    greyed = [w for w in [*UNTESTED_WORDS.values(), BOTH_DIVERGED] if w in cells["outcome"]]
    color = alt.Color("outcome:N", title="decision", scale=alt.Scale(
        domain=shown + greyed,
        range=[c for w, c in DECISION_STYLE.values() if w in shown] + [GREYED] * len(greyed)))
    layers = _headline_layers(x, x_scale, y_scale, color)
    subtitle = ["black rule and grey band: the onset and its 95% interval; dashed orange: where "
                "off first diverges (seed geometric mean)"]
    if greyed:
        layers.append(alt.Chart().mark_text(angle=270, align="left", dx=8, fontSize=10,
                                            color="#777")
                      .encode(x=x, y=alt.Y("y:Q", scale=y_scale), text="outcome:N")
                      .transform_filter("datum.kind == 'cell' && !datum.tested"))
        subtitle.append("grey crosses: LRs run without a test (" + "; ".join(greyed) + ")")
    if cut.height:
        layers.append(alt.Chart().mark_point(filled=True, size=70, color="#333").encode(
            x=x, y=alt.Y("y:Q", scale=y_scale), tooltip=["marker:N", "ci_lo:Q", "ci_hi:Q"],
            shape=alt.Shape("edge:N", legend=None, scale=alt.Scale(
                domain=["up", "down"], range=["triangle-up", "triangle-down"])))
            .transform_filter(alt.datum.kind == "cut"))
        subtitle.append("a triangle marks an interval that continues beyond the y axis")
    return finish(alt.layer(*layers, data=values(data))
                  .properties(width=width, height=PANEL_H)
                  .facet(column=alt.Column("depth:O", title=None, header=alt.Header(
                      labelExpr="'depth ' + datum.value", labelFontWeight="bold")),
                         row=alt.Row("compared:N", title=None, header=ROW_HEADER))
                  .properties(title=alt.Title(
                      "Where QK-norm is needed: off minus on, with 95% intervals over seeds",
                      subtitle=subtitle)))


def _empty(message: str) -> alt.Chart:
    """A small chart that says why there is nothing to draw."""
    return (alt.Chart(alt.Data(values=[{"message": message}])).mark_text(size=14)
            .encode(text="message:N").properties(width=panel_width(1), height=40))


def save_chart(chart: alt.TopLevelMixin | dict, folder: Path, name: str,
               scale: float = 2.0) -> dict[str, Path]:
    """Write <name>.png, .svg and .html (self-contained) from a chart or its Vega-Lite dict."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = chart if isinstance(chart, dict) else chart.to_dict()
    paths = {ext: folder / f"{name}.{ext}" for ext in ("png", "svg", "html")}
    paths["png"].write_bytes(vlc.vegalite_to_png(spec, scale=scale))
    paths["svg"].write_text(vlc.vegalite_to_svg(spec))
    paths["html"].write_text(vlc.vegalite_to_html(spec, bundle=True))
    return paths
