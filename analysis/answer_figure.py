"""The published answer's figure (docs/results/answer.png, by `python -m analysis.published`):
the onset with its 95% interval against the model's size, warmup, training steps and depth, one
colour per model body, and the warmup law with its prediction at the study preset's schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import altair as alt
import numpy as np
import polars as pl

from qkstudy.sweep.config import MINI
from qkstudy.sweep.ladder import KNOWN, MARGIN_PER_BYTE, STUDY_POINT

from .answer_table import BASE, body_text, by_schedule, rows_of
from .charts import finish
from .law import law_band
from .prose import span

PREDICTION = "prediction (study schedule)"
SHORT, SHARE = "30 steps", "10% of the run"
DODGE = 1.12  # marks at one x sit this factor apart
AXIS = {"size": "parameters outside the embeddings, millions",
        "warmup": "warmup steps",
        "steps": f"training steps ({body_text(BASE)})",
        "depth": "depth, the mini (300 steps, 30 warmup)"}
WIDTH = {"size": 230, "warmup": 300, "steps": 170, "depth": 150}
HEIGHT = 230
LAW = "#888888"
# colours: the ladder's model body navy, the study preset's red, the others in order of size
BASE_COLOUR, STUDY_COLOUR = "#1f3c88", "#d62728"
OTHERS = ("#2ca02c", "#9467bd", "#e6a100", "#17becf", "#8c564b", "#e377c2", "#ff7f0e",
          "#7f7f7f")


def ends(r: dict) -> tuple[str, str]:
    """Each end of the onset's interval as written: "<" or ">" where it lies beyond the LRs
    read, "" where it is a number."""
    inside = (r["onset"] or "").partition(" [")[2].rstrip("]").split(", ")
    if len(inside) != 2:
        return "", ""
    return tuple(e[:1] if e[:1] in "<>" else "" for e in inside)  # type: ignore[return-value]


def marks(panel: str, x: float, series: str, body: tuple[int, int, int], r: dict,
          tick: float | None = None) -> list[dict]:
    """One point's onset ("point": y, or none beyond the LRs read; ly: where its series line
    passes), its interval bar over the LRs read ("interval", none where the whole interval
    lies beyond them) and an arrow ("arrow", up or down) at each LR bound that an interval end
    or the onset lies beyond; nothing where no onset was read."""
    side = r.get("onset_side") or ""
    if r["onset_lr"] is None and not side:
        return []
    lo_end, hi_end = ends(r)
    lo = {"<": r["read_lo"], ">": r["read_hi"]}.get(lo_end, r["onset_lo"])
    hi = {"<": r["read_lo"], ">": r["read_hi"]}.get(hi_end, r["onset_hi"])
    common = {"panel": panel, "x": x, "tick": x if tick is None else tick, "series": series,
              "body": body_text(body),
              "order": body[0] ** 2 * body[1], "steps": f"{r['steps']:,}",
              "name": str(r.get("point") or f"mini depth {r['depth']}"), "onset": r["onset"]}
    out = [{**common, "kind": "point", "y": r["onset_lr"],
            "ly": r["onset_lr"] or {"below": r["read_lo"], "above": r["read_hi"]}[side]}]
    if lo is not None and hi is not None and hi > lo:
        out.append({**common, "kind": "interval", "lo": lo, "hi": hi})
    for sign, bound, way in (("<", r["read_lo"], "down"), (">", r["read_hi"], "up")):
        if sign in (lo_end, hi_end) or side == {"<": "below", ">": "above"}[sign]:
            alone = r["onset_lr"] is None and len(out) == 1
            out.append({**common, "kind": "arrow", "y": bound, "dir": way,
                        "label": f"{sign} {bound:.3g}" if alone else ""})
    return out


def dodged(items: list[tuple[float, tuple]]) -> list[float]:
    """Each (x, key)'s x moved apart from the others at the same x, in key order, centred."""
    out = []
    for x, key in items:
        same = sorted(k for v, k in items if v == x)
        out.append(x * DODGE ** (same.index(key) - (len(same) - 1) / 2))
    return out


def ladder_marks(rows: list[dict]) -> list[dict]:
    """The size panel (each schedule measured at two or more bodies, a series) and the warmup
    panel (every point); the steps panel (the ladder's model body at 30 warmup steps and at a
    tenth of the run)."""
    out = []
    size = [(r, f"{w:,} of {s:,} steps") for (w, s), g in by_schedule(rows) for r in g]
    xs = dodged([(r["params"] / 1e6, (r["body"], series)) for r, series in size])
    for x, (r, series) in zip(xs, size):
        out += marks("size", x, series, r["body"], r)
    xs = dodged([(r["warmup"], (r["params"], r["body"], r["steps"], r["point"])) for r in rows])
    for x, r in zip(xs, rows):
        out += marks("warmup", x, r["body"], r["body"], r, r["warmup"])
    for r in rows:
        for series, warmup in ((SHORT, 30), (SHARE, r["steps"] // 10)):
            if r["body"] == BASE and r["warmup"] == warmup:
                out += marks("steps", r["steps"], series, r["body"], r)
    return out


def mini_marks(mini: list[dict]) -> list[dict]:
    """The depth panel: the mini's depths (its model at each depth)."""
    head = MINI.train.d_model // MINI.train.n_heads
    return [m for r in mini if isinstance(r["depth"], int)
            for m in marks("depth", r["depth"], "", (r["d_model"], r["depth"], head), r)]


def law_rows(fit: dict) -> list[dict]:
    """The fitted law and a new point's 95% interval at the longest training length it was
    fitted on, over warmups from 30 up to 40% of the run (at most 1,920); none without a fit."""
    if fit.get("draws") is None:
        return []
    steps = max(KNOWN[n].steps for n in fit["points"].split(", ") if n in KNOWN)
    top = min(1920, 0.4 * steps)
    warmups = list(np.geomspace(30, top, max(int(12 * math.log10(top / 30)), 2)))
    return [{"x": p["warmup"], "y": p["lr"], "lo": p["ci_lo"], "hi": p["ci_hi"],
             "steps": f"{steps:,}"} for p in law_band(fit, steps, warmups)]


def prediction_row(p: dict | None) -> list[dict]:
    """The law's prediction at the study preset's schedule, with its interval."""
    if p is None:
        return []
    q = KNOWN[p["point"]]
    return [{"x": q.warmup, "y": p["lr"], "lo": p["ci_lo"], "hi": p["ci_hi"],
             "label": PREDICTION, "text": f"{p['lr']:.3g} [{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]"}]


def caption(law: list[dict], p: dict | None, seeds: str) -> list[str]:
    """The lines under the figure: what is plotted, the margin, the seeds, the marks."""
    lines = [f"Onset: the LR from which QK-norm off ends {MARGIN_PER_BYTE:g} nats worse than on "
             f"(the seed mean of {seeds}), with its whole-seed 95% interval; colour: the model "
             "body (d_model / depth / head dim).",
             "An arrow: the interval (or the onset) lies beyond the LRs run; an arrow alone: all "
             "of it does. Size: a line per schedule (warmup of training steps) measured at two "
             "or more bodies."]
    if law:
        lines.append(f"Grey line and band: the straight warmup law fitted to the {body_text(BASE)} "
                     f"points, at {law[0]['steps']} training steps, and the 95% interval of a new "
                     "point's onset.")
    if p is not None:
        q = KNOWN[p["point"]]
        lines.append(f"Diamond: its prediction at the study preset's schedule ({q.warmup:,} "
                     f"warmup steps of {q.steps:,}), LR {p['lr']:.3g} [{p['ci_lo']:.3g}, "
                     f"{p['ci_hi']:.3g}] for {len(q.seeds)} seeds, beside the point measured there.")
    return lines


def y_axis(rows: list[dict]) -> tuple[alt.Scale, alt.Axis]:
    """A log LR scale a little wider than every mark, ticked at 1 and 3 of each decade."""
    ys = [v for r in rows for k in ("y", "lo", "hi", "ly") if (v := r.get(k)) is not None and v > 0]
    lo, hi = min(ys) / 1.6, max(ys) * 1.6
    return (alt.Scale(type="log", domain=[lo, hi], nice=False),
            alt.Axis(values=ticks(lo, hi, (1, 3)), format="~g"))


def ticks(lo: float, hi: float, steps: tuple[int, ...]) -> list[float]:
    return [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)))
            for m in steps if lo <= m * 10.0 ** k <= hi]


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


def series_line(rows: list[dict], a: Axes, panel: str) -> list[alt.Chart]:
    """A thin grey line through a series' onsets (or the bounds they lie beyond): dashed by
    series in the steps panel, named at its first mark in the size panel."""
    points = [r for r in rows if r["kind"] == "point"]
    line = alt.Chart(alt.Data(values=points), name="series").mark_line(
        color="#aaaaaa", strokeWidth=1).encode(x=a.x, y=a.y("ly"), detail="series:N")
    if panel == "steps":
        return [line.encode(strokeDash=alt.StrokeDash(
            "series:N", title="warmup", scale=alt.Scale(domain=[SHORT, SHARE]),
            legend=alt.Legend(orient="bottom", symbolStrokeColor="#555555")))]
    if panel != "size":
        return [line]
    first = [min((r for r in points if r["series"] == s), key=lambda r: r["x"])
             for s in dict.fromkeys(r["series"] for r in points)]
    return [line, alt.Chart(alt.Data(values=first), name="series-label").mark_text(
        align="left", baseline="bottom", dx=4, dy=-6, fontSize=10, color="#555555").encode(
        x=a.x, y=a.y("ly"), text="series:N")]


def layers(rows: list[dict], a: Axes) -> list[alt.Chart]:
    """One panel's measured marks: the interval bars, the onsets and the arrows."""
    tip = ["name:N", "onset:N", "steps:N"]
    return [
        alt.Chart(alt.Data(values=[r for r in rows if r["kind"] == "interval"]),
                  name="intervals").mark_rule(strokeWidth=2).encode(
            x=a.x, y=a.y("lo"), y2="hi:Q", color=a.colour, tooltip=tip),
        alt.Chart(alt.Data(values=[r for r in rows if r["kind"] == "point" and r["y"]]),
                  name="onsets").mark_point(filled=True, size=55, opacity=1).encode(
            x=a.x, y=a.y("y"), color=a.colour, tooltip=tip),
        alt.Chart(alt.Data(values=[r for r in rows if r["kind"] == "arrow"]), name="arrows")
        .mark_point(filled=True, size=90, opacity=1).encode(
            x=a.x, y=a.y("y"), color=a.colour, tooltip=tip,
            shape=alt.Shape("dir:N", legend=None, scale=alt.Scale(
                domain=["up", "down"], range=["triangle-up", "triangle-down"]))),
        alt.Chart(alt.Data(values=[r for r in rows if r.get("label")]), name="arrow-labels")
        .mark_text(align="left", baseline="middle", dx=7, fontSize=10).encode(
            x=a.x, y=a.y("y"), color=a.colour, text="label:N")]


def law_layers(law: list[dict], guess: list[dict], a: Axes) -> list[alt.Chart]:
    """The warmup panel's law, a grey band and line, and the study-schedule prediction as a
    black diamond with its interval, labelled over it."""
    tip = ["label:N", "text:N"]
    return [
        alt.Chart(alt.Data(values=law), name="law-band").mark_area(
            opacity=0.15, color=LAW).encode(x=a.x, y=a.y("lo"), y2="hi:Q"),
        alt.Chart(alt.Data(values=law), name="law").mark_line(
            strokeWidth=1.5, color=LAW).encode(x=a.x, y=a.y("y")),
        alt.Chart(alt.Data(values=guess), name="prediction-interval").mark_rule(
            color="black", strokeWidth=1.5).encode(x=a.x, y=a.y("lo"), y2="hi:Q", tooltip=tip),
        alt.Chart(alt.Data(values=guess), name="prediction").mark_point(
            shape="diamond", filled=True, size=110, color="black", opacity=1).encode(
            x=a.x, y=a.y("y"), tooltip=tip),
        alt.Chart(alt.Data(values=guess), name="prediction-label").mark_text(
            align="right", baseline="bottom", dx=12, dy=-5, fontSize=11).encode(
            x=a.x, y=a.y("hi"), text="label:N")]


def x_axis(panel: str, rows: list[dict]) -> alt.X:
    """A log x over the panel's marks; the size panel ticked at 1, 2 and 5 of each decade."""
    xs = [r["x"] for r in rows] or [1.0]
    lo, hi = min(xs) / 1.3, max(xs) * 1.3
    marked = (ticks(lo, hi, (1, 2, 5)) if panel == "size" else
              sorted({r["tick"] for r in rows}))
    return alt.X("x:Q", title=AXIS[panel], axis=alt.Axis(values=marked, format="~g" if
                                                         panel == "size" else ","),
                 scale=alt.Scale(type="log", domain=[lo, hi]))


def colours(bodies: list[str]) -> list[str]:
    """Each body's colour: the ladder's navy, the study preset's red, the rest in turn."""
    study = body_text((STUDY_POINT.d_model, STUDY_POINT.depth, STUDY_POINT.head_dim))
    rest = iter(OTHERS * len(bodies))
    return [BASE_COLOUR if b == body_text(BASE) else STUDY_COLOUR if b == study else next(rest)
            for b in bodies]


def answer_chart(points: pl.DataFrame, mini: list[dict], fit: dict,
                 predicted: dict | None) -> alt.TopLevelMixin:
    """The four panels side by side with the caption under them, from the ladder's points, the
    mini's rows (published.study_rows), the straight law's fit and its prediction at the study
    preset's schedule."""
    rows = ladder_marks(rows_of(points)) + mini_marks(mini)
    law, guess = law_rows(fit), prediction_row(predicted)
    bodies = [b for _, b in sorted({(r["order"], r["body"]) for r in rows})]
    colour = alt.Color("body:N", title="model body: d_model / depth / head dim", scale=alt.Scale(
        domain=bodies, range=colours(bodies)), legend=alt.Legend(
        orient="bottom", symbolOpacity=1, symbolType="circle", titleLimit=400))
    scale, axis = y_axis(rows + law + guess)
    panels = []
    for i, panel in enumerate(AXIS):
        mine = [r for r in rows if r["panel"] == panel]
        a = Axes(x_axis(panel, mine), scale, axis, None if i else "onset LR", colour)
        drawn = (law_layers(law, guess, a) if panel == "warmup" else series_line(mine, a, panel))
        panels.append(alt.layer(*drawn, *layers(mine, a)).properties(width=WIDTH[panel],
                                                                      height=HEIGHT))
    seeds = sorted(set(points["seeds"].to_list())) if "seeds" in points.columns else []
    n = f"{span(seeds, '')} seeds" if seeds else "the seeds"
    return finish(alt.hconcat(*panels, spacing=24).properties(title=alt.Title(
        caption(law, predicted, n), orient="bottom", anchor="start", fontSize=12,
        fontWeight="normal", color="#222222", offset=10)))
