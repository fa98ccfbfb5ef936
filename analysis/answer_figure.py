"""The published answer's figure (docs/results/answer.png, by `python -m analysis.published`):
the onset with its 95% interval against warmup, training steps, width and depth, and the warmup
law with its prediction at the study preset's schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import altair as alt
import numpy as np
import polars as pl

from qkstudy.sweep.ladder import KNOWN, MARGIN_PER_BYTE, STUDY_POINT

from .charts import finish
from .law import law_band
from .prose import span

# training steps -> colour, the same in every panel (dark to light as the run lengthens)
STEP_COLOURS = {300: "#0d0887", 1200: "#9c179e", 4800: "#e8704c", 24_414: "#e0a800"}
OTHER_COLOUR = "#777777"
PREDICTION = "prediction (study schedule)"
SHORT, SHARE = "30 steps", "10% of the run"
DODGE = 1.15  # in the warmup panel a length's points sit this factor apart from the next's
AXIS = {"warmup": ("warmup steps", (30, 120, 480, 1920), 300),
        "steps": ("training steps", (300, 1200, 4800), 170),
        "width": ("width, d_model (300 steps, 30 warmup)", (64, 128, 256), 170),
        "depth": ("depth, the mini (300 steps, 30 warmup)", (2, 4, 8), 170)}
HEIGHT = 230


def marks(panel: str, x: float, series: str, r: dict) -> list[dict]:
    """One point's onset and interval ("point") and an arrow ("arrow", up or down) at each LR
    bound that an open interval end or the onset lies beyond; none where no onset was read."""
    side = r.get("onset_side") or ""
    if r["onset_lr"] is None and not side:
        return []
    lo, hi = r["onset_lo"], r["onset_hi"]
    common = {"panel": panel, "x": x, "series": series, "steps": f"{r['steps']:,}",
              "name": str(r.get("point") or f"mini depth {r['depth']}"), "onset": r["onset"]}
    out = [{**common, "kind": "point", "y": r["onset_lr"],
            "lo": lo if lo is not None else r["read_lo"],
            "hi": hi if hi is not None else r["read_hi"]}]
    if lo is None or side == "below":
        out.append({**common, "kind": "arrow", "y": r["read_lo"], "dir": "down"})
    if hi is None or side == "above":
        out.append({**common, "kind": "arrow", "y": r["read_hi"], "dir": "up"})
    return out


def measured(points: pl.DataFrame, mini: list[dict]) -> list[dict]:
    """Every panel's marks: the width-64 points against warmup and steps, the 300-step ones
    against width, and the mini against depth."""
    rank = {s: i - 1 for i, s in enumerate(sorted(STEP_COLOURS))}
    out = []
    for r in points.iter_rows(named=True):
        if r["d_model"] == 64 and r["depth"] == 4:
            out += marks("warmup", r["warmup"] * DODGE ** rank.get(r["steps"], 0), "", r)
            for series, warmup in ((SHORT, 30), (SHARE, r["steps"] // 10)):
                if r["warmup"] == warmup:
                    out += marks("steps", r["steps"], series, r)
        if r["steps"] == 300 and r["warmup"] == 30 and r["depth"] == 4:
            out += marks("width", r["d_model"], "", r)
    for r in mini:
        if isinstance(r["depth"], int):
            out += marks("depth", r["depth"], "", r)
    return out


def law_lengths(fit: dict) -> list[int]:
    """The training lengths of the points the law was fitted on (none without a fit)."""
    if fit.get("draws") is None:
        return []
    return sorted({KNOWN[n].steps for n in fit["points"].split(", ") if n in KNOWN})


def law_rows(fit: dict, lengths: list[int]) -> list[dict]:
    """The fitted law and a new point's 95% interval at each length, over warmups from 30 up to
    40% of the run (at most 1,920)."""
    rows = []
    for steps in lengths:
        top = min(1920, 0.4 * steps)
        warmups = list(np.geomspace(30, top, max(int(12 * math.log10(top / 30)), 2)))
        rows += [{"x": p["warmup"], "y": p["lr"], "lo": p["ci_lo"], "hi": p["ci_hi"],
                  "steps": f"{steps:,}"} for p in law_band(fit, steps, warmups)]
    return rows


def prediction_row(fit: dict) -> list[dict]:
    """The straight law's prediction at the study preset's schedule, with its interval."""
    if fit.get("lr") is None:
        return []
    return [{"x": STUDY_POINT.warmup, "y": fit["lr"], "lo": fit["ci_lo"], "hi": fit["ci_hi"],
             "label": PREDICTION, "text": f"{fit['lr']:.3g} [{fit['ci_lo']:.3g}, "
                                          f"{fit['ci_hi']:.3g}]"}]


def caption(fit: dict, seeds: str) -> list[str]:
    """The lines under the figure: what is plotted, the margin, the seeds, the marks."""
    lines = [f"Onset: the LR from which QK-norm off ends {MARGIN_PER_BYTE:g} nats worse than on "
             f"(the seed mean of {seeds}), with its whole-seed 95% interval; colour: the run's "
             "training steps.",
             "An arrow: the interval (or the onset) lies beyond the LRs where QK-norm's own runs "
             "trained."]
    if fit.get("lr") is not None:
        lines += ["Line and band: the straight warmup law fitted to the width-64 points, at each "
                  "training length up to a warmup of 40% of the run, and the 95% interval of a "
                  "new point's onset;",
                  f"diamond: its prediction at the study preset's schedule (1,000 warmup steps "
                  f"of 24,414), LR {fit['lr']:.3g} [{fit['ci_lo']:.3g}, {fit['ci_hi']:.3g}]."]
    return lines


def y_axis(rows: list[dict]) -> tuple[alt.Scale, alt.Axis]:
    """A log LR scale a little wider than every mark, ticked at 1 and 3 of each decade."""
    ys = [v for r in rows for k in ("y", "lo", "hi") if (v := r.get(k)) is not None and v > 0]
    lo, hi = min(ys) / 1.6, max(ys) * 1.6
    ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)))
             for m in (1, 3) if lo <= m * 10.0 ** k <= hi]
    return (alt.Scale(type="log", domain=[lo, hi], nice=False),
            alt.Axis(values=ticks, format="~g"))


@dataclass
class Axes:
    """One panel's x, its y scale and axis (titled in the first panel only) and the colour."""

    x: alt.X
    scale: alt.Scale
    axis: alt.Axis
    title: str | None
    colour: alt.Color

    def y(self, field: str) -> alt.Y:
        return alt.Y(f"{field}:Q", scale=self.scale, axis=self.axis, title=self.title)


def series_line(rows: list[dict], a: Axes, dashed: bool) -> alt.Chart:
    """A thin grey line through a series' onsets, dashed by series where `dashed`."""
    line = alt.Chart(alt.Data(values=[r for r in rows if r["kind"] == "point" and r["y"]]),
                     name="series").mark_line(color="#aaaaaa", strokeWidth=1).encode(
        x=a.x, y=a.y("y"), detail="series:N")
    if dashed:
        line = line.encode(strokeDash=alt.StrokeDash(
            "series:N", title="warmup", scale=alt.Scale(domain=[SHORT, SHARE]),
            legend=alt.Legend(orient="bottom", symbolStrokeColor="#555555")))
    return line


def layers(rows: list[dict], a: Axes) -> list[alt.Chart]:
    """One panel's measured marks: the interval bars, the onsets and the arrows."""
    points = [r for r in rows if r["kind"] == "point"]
    tip = ["name:N", "onset:N"]
    return [
        alt.Chart(alt.Data(values=points), name="intervals").mark_rule(strokeWidth=2).encode(
            x=a.x, y=a.y("lo"), y2="hi:Q", color=a.colour, tooltip=tip),
        alt.Chart(alt.Data(values=points), name="onsets").mark_point(
            filled=True, size=55, opacity=1).encode(x=a.x, y=a.y("y"), color=a.colour,
                                                    tooltip=tip).transform_filter("datum.y != null"),
        alt.Chart(alt.Data(values=[r for r in rows if r["kind"] == "arrow"]), name="arrows")
        .mark_point(filled=True, size=90, opacity=1).encode(
            x=a.x, y=a.y("y"), color=a.colour, tooltip=tip,
            shape=alt.Shape("dir:N", legend=None, scale=alt.Scale(
                domain=["up", "down"], range=["triangle-up", "triangle-down"])))]


def law_layers(fit: dict, lengths: list[int], a: Axes) -> list[alt.Chart]:
    """The warmup panel's law: a band and a line per length, and the study-schedule prediction
    as a black diamond with its interval, labelled under it."""
    law = alt.Data(values=law_rows(fit, lengths))
    guess = alt.Data(values=prediction_row(fit))
    tip = ["label:N", "text:N"]
    return [
        alt.Chart(law, name="law-band").mark_area(opacity=0.1).encode(
            x=a.x, y=a.y("lo"), y2="hi:Q", color=a.colour),
        alt.Chart(law, name="law").mark_line(strokeWidth=1.5).encode(
            x=a.x, y=a.y("y"), color=a.colour),
        alt.Chart(guess, name="prediction-interval").mark_rule(color="black", strokeWidth=1.5)
        .encode(x=a.x, y=a.y("lo"), y2="hi:Q", tooltip=tip),
        alt.Chart(guess, name="prediction").mark_point(
            shape="diamond", filled=True, size=110, color="black", opacity=1).encode(
            x=a.x, y=a.y("y"), tooltip=tip),
        alt.Chart(guess, name="prediction-label").mark_text(
            align="right", baseline="top", dx=12, dy=5, fontSize=11).encode(
            x=a.x, y=a.y("lo"), text="label:N")]


def answer_chart(points: pl.DataFrame, mini: list[dict], fit: dict) -> alt.TopLevelMixin:
    """The four panels side by side with the caption under them, from the ladder's points, the
    mini's rows (published.study_rows) and the straight law's fit."""
    rows = measured(points, mini)
    fitted = law_lengths(fit)
    shown = sorted({int(r["steps"].replace(",", "")) for r in rows} | set(fitted))
    colour = alt.Color("steps:N", title="training steps", scale=alt.Scale(
        domain=[f"{s:,}" for s in shown],
        range=[STEP_COLOURS.get(s, OTHER_COLOUR) for s in shown]),
        legend=alt.Legend(orient="bottom", symbolOpacity=1, symbolType="circle"))
    scale, axis = y_axis(rows + law_rows(fit, fitted) + prediction_row(fit))
    panels = []
    for i, (panel, (words, ticks, width)) in enumerate(AXIS.items()):
        a = Axes(alt.X("x:Q", title=words, axis=alt.Axis(values=list(ticks), format=","),
                       scale=alt.Scale(type="log", domain=[ticks[0] / 1.3, ticks[-1] * 1.3])),
                 scale, axis, None if i else "onset LR", colour)
        mine = [r for r in rows if r["panel"] == panel]
        drawn = (law_layers(fit, fitted, a) if panel == "warmup"
                 else [series_line(mine, a, panel == "steps")])
        panels.append(alt.layer(*drawn, *layers(mine, a)).properties(width=width, height=HEIGHT))
    seeds = sorted(set(points["seeds"].to_list())) if "seeds" in points.columns else []
    n = f"{span(seeds, '')} seeds" if seeds else "the seeds"
    return finish(alt.hconcat(*panels, spacing=24).properties(title=alt.Title(
        caption(fit, n), orient="bottom", anchor="start", fontSize=12, fontWeight="normal",
        color="#222222", offset=10)))
