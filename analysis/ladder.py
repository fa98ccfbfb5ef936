"""`python -m analysis ladder [SOURCE ...] [out=reports/ladder]`: the ladder's transfer analysis,
as docs/report.md's ladder plan fixes it.

A source is a ladder folder (runs/ladder: one sweep folder per point), one point's sweep folder,
a folder of point archives (results/ladder) or one archive (<point>.tar.xz). Per point: the
plan's H1 verdict, the tested rule, the necessity threshold at depth 4, the LR-sensitivity gap,
the max-stable-LR ratio and the off arm's peak attention logit. Across the points with warmup at
10% of the run: the transfer law log10(threshold) = a + b log2(d_model / 64) + c log2(steps /
300) with whole-seed intervals (each point's seeds drawn on their own), its six claims under
Holm, and the prediction at the study preset's point; the warmup contrast; the peak logit's
collapse onto lr x width x steps. Beside them, amendment 11's onset reading (the threshold read
from the gap's valley up: exploratory) per point, with its own law, prediction and contrast. A
point enters the law only once its sweep has nothing left to run.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from qkstudy import archive
from qkstudy.config import split_key_values
from qkstudy.errors import UsageError
from qkstudy.sweep.config import parse_sweep_config
from qkstudy.sweep.ladder import KNOWN, LAW_POINTS, LRS, STUDY_POINT, Point, point_words
from qkstudy.sweep.plan import remaining_runs

from . import stats as S
from .hypotheses import small_sample_widening
from .load import load_runs
from .metrics import OFF, paired_gaps
from .study import ReportOptions, Study, analyse
from .threshold import (DepthDraws, depth_draws, estimate_text, gap_matrix, tested_rule,
                        threshold_interval)

ON = "rmsnorm"
WIDTH0, STEPS0 = 64, 300  # the anchor: the law's coefficients are per doubling from here
CONTRAST = ("w64-s4800", "w64-s4800-wu30")
COLLAPSE_SD = 0.2  # decades: the plan's "collapse" bound on the pooled fit's residual SD


@dataclass
class PointResult:
    name: str
    point: Point
    study: Study
    complete: bool
    left: int  # runs the sweep still has to train
    log_threshold: float  # the estimate (log10 LR; +-inf censored)
    draws: np.ndarray  # whole-seed bootstrap draws of it, this point's own
    seeds: int
    onset: DepthDraws | None = None  # amendment 11's reading of the same gaps and draws

    def reading(self, name: str) -> tuple[float, np.ndarray]:
        """(estimate, draws) of log10 LR under the plan's threshold or amendment 11's onset."""
        if name == "plan":
            return self.log_threshold, self.draws
        if self.onset is None:
            raise ValueError(f"{self.name}: no onset reading")
        return self.onset.point, self.onset.draws


# --- reading the points -----------------------------------------------------------------------

def _point_dirs(source: Path, stack: contextlib.ExitStack) -> list[Path]:
    """The point sweep folders a source names (archives unpacked into temporary folders)."""
    if source.name.endswith(archive.SUFFIX):
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qkstudy-ladder-")))
        return [archive.extract(source, tmp)[0]]
    if not source.is_dir():
        raise UsageError(f"ladder source {source} does not exist (give runs/ladder, a point's "
                         "folder, results/ladder or a point's .tar.xz)")
    if (source / "sweep.json").is_file():
        return [source]
    found = []
    for child in sorted(source.iterdir()):
        if child.name.endswith(archive.SUFFIX) or (child / "sweep.json").is_file():
            found += _point_dirs(child, stack)
    if not found:
        raise UsageError(f"{source} holds no ladder point (a sweep folder with sweep.json, or "
                         f"a <point>{archive.SUFFIX})")
    return found


def load_point(folder: Path, options: ReportOptions) -> PointResult:
    name = folder.name
    if name not in KNOWN:
        raise UsageError(f"{folder}: {name!r} is not a ladder point; known: {', '.join(KNOWN)}")
    point = KNOWN[name]
    sweep = parse_sweep_config(point_words(point, [], str(folder.parent)))
    todo, extra = remaining_runs(sweep)
    study = analyse(load_runs(folder), options)
    gaps = paired_gaps(study.points, options.study)
    on = gaps.filter(pl.col("compared_arm") == ON)
    cells = study.gaps.filter((pl.col("compared_arm") == ON) & pl.col("informative"))
    lrs = sorted(cells["lr"].to_list())
    seeds = sorted(set(on["seed"].to_list()))
    if not lrs or len(seeds) < 2:
        raise UsageError(f"{folder}: no informative cell with 2 or more paired seeds yet")
    values = gap_matrix(on.filter(pl.col("lr").is_in(lrs)), seeds, lrs)
    # each point's own seed draws: the points share no run (docs/report.md, the ladder's plan)
    draws = S.seed_draws(len(seeds), options.study.bootstrap, f"ladder/{name}")
    d = depth_draws(values, lrs, draws, options.study.min_gap)
    # amendment 11: the same gaps and seed draws, read from the gap's valley up
    onset = depth_draws(values, lrs, draws, options.study.min_gap, reading="onset",
                        trained_up_to=tested_rule(cells)["trained_up_to"])
    return PointResult(name=name, point=point, study=study, complete=not todo and not extra,
                       left=len(todo) + len(extra), log_threshold=d.point, draws=d.draws,
                       seeds=int((~np.isnan(values)).sum(axis=0).min()), onset=onset)


# --- per point ----------------------------------------------------------------------------------

def _lr(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g}"


def point_row(r: PointResult, options: ReportOptions) -> dict:
    s = r.study
    thr = s.thresholds.filter(pl.col("compared_arm") == ON).row(0, named=True)
    h1 = s.verdicts.filter((pl.col("hypothesis") == "H1") & (pl.col("compared_arm") == ON))
    rule = tested_rule(s.gaps.filter(pl.col("compared_arm") == ON))
    sens = s.sensitivity_per_seed.pivot("arm", index=["depth", "seed"], values="lr_sensitivity")
    drop = (sens[OFF] - sens[ON]).drop_nulls().to_list() if ON in sens.columns else []
    stable = s.stable_per_seed.pivot("arm", index=["depth", "seed"], values="max_stable_lr")
    ratio = (np.log(stable[ON]) - np.log(stable[OFF])).drop_nulls().to_list() \
        if ON in stable.columns else []
    lo, hi = S.interval(drop)
    rlo, rhi = S.interval(ratio)
    peaks = peak_logits(s).filter(pl.col("arm") == OFF)
    p = r.point
    onset = onset_columns(r.onset, options.study.threshold_widening) if r.onset else {}
    return {
        "point": r.name, "d_model": p.d_model, "steps": p.steps, "warmup": p.warmup,
        "complete": r.complete, "runs_left": r.left, "runs": s.points.height, "seeds": r.seeds,
        "h1": h1["verdict"][0] if h1.height else None,
        "no_difference_up_to": rule["no_difference_up_to"],
        "off_worse_from": rule["off_worse_from"], "rule": rule["text"],
        "threshold_lr": thr["threshold_lr"], "threshold": thr["threshold"],
        "ci_lo": thr["ci_lo"], "ci_hi": thr["ci_hi"], "censored": thr["censored"],
        **onset,
        "sensitivity_gap": float(np.mean(drop)) if drop else None, "sensitivity_lo": lo,
        "sensitivity_hi": hi,
        "stable_ratio": float(np.exp(np.mean(ratio))) if ratio else None,
        "stable_ratio_lo": math.exp(rlo) if rlo is not None else None,
        "stable_ratio_hi": math.exp(rhi) if rhi is not None else None,
        "off_peak_logit": float(peaks["peak_logit"].max()) if peaks.height else None,
        "run_seconds": float(s.points["wall_seconds"].sum()),
    }


def onset_columns(d: DepthDraws, k: float) -> dict:
    """Amendment 11's onset reading of one point: estimate, widened interval (the plan's k and
    bracket rule), which side it is censored on, its valley LR and the text."""
    lo, hi = threshold_interval(d, k)
    point = d.point
    censored = "below" if point == -math.inf else "above" if point == math.inf else None
    valley = d.lrs[int(np.nanargmin(d.fit))] if np.isfinite(d.fit).any() else None
    finite = math.isfinite
    return {"onset_lr": 10 ** point if finite(point) else None,
            "onset_lo": 10 ** lo if finite(lo) else None,
            "onset_hi": 10 ** hi if finite(hi) else None, "onset_censored": censored,
            "onset_valley": valley, "onset": estimate_text(point, lo, hi, d.lrs)}


def peak_logits(study: Study) -> pl.DataFrame:
    """Per finished, not diverged run: its peak max attention logit over probe steps (each
    step's value is already the max over layers)."""
    probes = study.probe_steps.filter(pl.col("name") == "max_attention_logit")
    peak = probes.group_by("run").agg(peak_logit=pl.col("value").max())
    runs = study.points.filter(pl.col("status") == "completed").select("run", "arm", "lr", "seed")
    return runs.join(peak, on="run").filter(pl.col("peak_logit").is_finite()
                                            & (pl.col("peak_logit") > 0))


# --- the transfer law ---------------------------------------------------------------------------

def design(points: list[Point]) -> np.ndarray:
    return np.array([[1.0, math.log2(p.d_model / WIDTH0), math.log2(p.steps / STEPS0)]
                     for p in points])


STUDY_X = design([STUDY_POINT])[0]

LAW_SCHEMA = {"term": pl.String, "estimate": pl.Float64, "ci_lo": pl.Float64,
              "ci_hi": pl.Float64, "undefined_share": pl.Float64, "p_falls": pl.Float64,
              "p_rises": pl.Float64, "p_equal": pl.Float64, "q_falls": pl.Float64,
              "q_rises": pl.Float64, "q_equal": pl.Float64, "decision": pl.String,
              "note": pl.String}


def fit_law(results: list[PointResult], options: ReportOptions, reading: str = "plan"
            ) -> tuple[pl.DataFrame, dict]:
    """The law's coefficients with intervals and the six claims (b, c: falls, rises, equal),
    and the prediction at the study point, on the plan's threshold or (reading="onset")
    amendment 11's onset. Needs a width step and a length step besides the anchor, every point
    complete and none censored."""
    law = [r for r in results if r.name in LAW_POINTS and r.complete]
    values = [r.reading(reading) for r in law]
    pts = [r.point for r in law]
    widths, lengths = {p.d_model for p in pts}, {p.steps for p in pts}
    prediction = {"log10_lr": None, "lr": None, "ci_lo": None, "ci_hi": None,
                  "points": ", ".join(r.name for r in law), "note": ""}
    why = ""
    if len(widths) < 2 or len(lengths) < 2 or len(law) < 3:
        why = (f"not estimable yet: the law needs complete points at two widths and two lengths "
               f"(has {', '.join(r.name for r in law) or 'none'})")
    censored = [r.name for r, (t, _) in zip(law, values) if not math.isfinite(t)]
    if not why and censored:
        why = f"not estimable: the threshold is censored at {', '.join(censored)}"
    if why:
        prediction["note"] = why
        return pl.DataFrame([{"term": t, "note": why} for t in ("a", "b", "c")],
                            schema=LAW_SCHEMA), prediction
    x = design(pts)
    pinv = np.linalg.pinv(x)
    est = pinv @ np.array([t for t, _ in values])
    y = np.stack([d for _, d in values], axis=1)  # (B, points): each point's own draws
    undefined = ~np.isfinite(y).all(axis=1)
    boot = np.where(undefined[:, None], np.nan, np.where(np.isfinite(y), y, 0.0) @ pinv.T)
    k = small_sample_widening(min(r.seeds for r in law))
    boot = est + k * (boot - est)
    m = options.study.slope_margin
    rows = []
    for i, term in enumerate("abc"):
        b = boot[:, i]
        finite = b[~undefined]
        lo, hi = S.percentile_interval(finite) if finite.size else (math.nan, math.nan)
        row = {"term": term, "estimate": float(est[i]), "ci_lo": lo, "ci_hi": hi,
               "undefined_share": float(undefined.mean()), "note": ""}
        if term != "a":
            row.update(p_falls=S.p_bootstrap(undefined | (b >= 0)),
                       p_rises=S.p_bootstrap(undefined | (b <= 0)),
                       p_equal=max(S.p_bootstrap(undefined | (b >= m)),
                                   S.p_bootstrap(undefined | (b <= -m))))
        rows.append(row)
    claims = [(r, k) for r in rows[1:] for k in ("p_falls", "p_rises", "p_equal")]
    S.adjust_family(claims, options.study.alpha, method="holm")
    a = options.study.alpha
    for r in rows[1:]:
        r["decision"] = ("falls" if r["q_falls"] < a else "rises" if r["q_rises"] < a
                         else "equal" if r["q_equal"] < a else "undetermined")
    pred = float(STUDY_X @ est)
    pdraws = boot[~undefined] @ STUDY_X
    lo, hi = S.percentile_interval(pdraws) if pdraws.size else (math.nan, math.nan)
    prediction.update(log10_lr=pred, lr=10 ** pred, ci_lo=10 ** lo, ci_hi=10 ** hi)
    return pl.DataFrame(rows, schema=LAW_SCHEMA), prediction


def warmup_contrast(results: dict[str, PointResult], options: ReportOptions,
                    reading: str = "plan") -> dict | None:
    """log10 threshold (or amendment 11's onset) at the longest point with 10% warmup minus
    with 30 steps' warmup."""
    long, short = (results.get(n) for n in CONTRAST)
    if not (long and short and long.complete and short.complete):
        return None
    (t_long, d_long), (t_short, d_short) = long.reading(reading), short.reading(reading)
    est = t_long - t_short
    row = {"contrast": f"{CONTRAST[0]} - {CONTRAST[1]}", "reading": reading,
           "log10_ratio": est, "ci_lo": None,
           "ci_hi": None, "decision": "undetermined", "note": ""}
    if not math.isfinite(est):
        row.update(decision=None, note="a threshold is censored")
        return row
    d = d_long - d_short
    undefined = ~np.isfinite(d)
    d = est + small_sample_widening(min(long.seeds, short.seeds)) * (d - est)
    lo, hi = S.percentile_interval(d[~undefined])
    m = options.study.slope_margin
    tests = {"p_raises": S.p_bootstrap(undefined | (d <= 0)),
             "p_lowers": S.p_bootstrap(undefined | (d >= 0)),
             "p_equal": max(S.p_bootstrap(undefined | (d >= m)),
                            S.p_bootstrap(undefined | (d <= -m)))}
    S.adjust_family([(tests, k) for k in list(tests)], options.study.alpha, method="holm")
    a = options.study.alpha
    decision = ("longer warmup raises it" if tests["q_raises"] < a else "longer warmup lowers it"
                if tests["q_lowers"] < a else "no effect" if tests["q_equal"] < a
                else "undetermined")
    row.update(ci_lo=lo, ci_hi=hi, decision=decision, **tests)
    return row


COORDINATES = {"lr": (0, 0), "lr x width": (1, 0), "lr x width x steps": (1, 1)}


def collapse(results: list[PointResult]) -> pl.DataFrame:
    """Per coordinate: the residual SD (decades) of one monotone fit of log10(peak logit) of
    the off arm's completed runs over every point, and whether it is within COLLAPSE_SD."""
    frames = []
    for r in results:
        peaks = peak_logits(r.study).filter(pl.col("arm") == OFF)
        frames.append(peaks.with_columns(point=pl.lit(r.name), width=pl.lit(r.point.d_model / WIDTH0),
                                         length=pl.lit(r.point.steps / STEPS0)))
    rows = []
    if not frames or len(results) < 2:
        return pl.DataFrame(schema={"coordinate": pl.String, "points": pl.Int64,
                                    "runs": pl.Int64, "residual_sd": pl.Float64,
                                    "collapses": pl.Boolean})
    peaks = pl.concat(frames)
    y_all = np.log10(peaks["peak_logit"].to_numpy())
    for name, (w, s) in COORDINATES.items():
        x = np.log10(peaks["lr"].to_numpy() * peaks["width"].to_numpy() ** w
                     * peaks["length"].to_numpy() ** s)
        order = np.argsort(x, kind="stable")
        fit = S.isotonic(y_all[order][None], np.ones(len(order)))[0]
        sd = float(np.sqrt(np.mean((y_all[order] - fit) ** 2)))
        rows.append({"coordinate": name, "points": len(results), "runs": len(order),
                     "residual_sd": sd, "collapses": sd <= COLLAPSE_SD})
    return pl.DataFrame(rows)


# --- the chart ----------------------------------------------------------------------------------

CHART_LRS = (1e-5, 10.0)  # the chart's LR axis: the ladder's grid and a decade either side


# amendment 11's columns under the names of the plan's: a table read as the onset
ONSET_COLUMNS = {"onset_lr": "threshold_lr", "onset_lo": "ci_lo", "onset_hi": "ci_hi",
                 "onset_censored": "censored", "onset": "threshold"}


def as_reading(table: pl.DataFrame, reading: str) -> pl.DataFrame:
    """The points table with the reading's columns under the plan's names."""
    if reading == "plan":
        return table
    return table.drop(ONSET_COLUMNS.values(), strict=False).rename(ONSET_COLUMNS, strict=False)


def chart(table: pl.DataFrame, prediction: dict, law: pl.DataFrame | None = None,
          reading: str = "plan"):
    """The threshold (or, reading="onset", amendment 11's onset) against width (at 300 steps)
    and against steps (at d_model 64), with each point's interval, the fitted law along each
    axis and the extrapolated study point. Intervals reaching past the axis (or censored: no
    bound) are drawn to its edge."""
    import altair as alt

    table = as_reading(table, reading)
    lo_edge, hi_edge = CHART_LRS

    def clip(v: float | None, edge: float) -> float:
        return edge if v is None or not math.isfinite(v) else min(max(v, lo_edge), hi_edge)

    # a censored point is drawn at the grid's edge on its side (the grid is LRS), marked so
    edge = {"below": min(LRS), "above": max(LRS)}
    rows = table.filter(pl.col("threshold_lr").is_not_null() | pl.col("censored").is_not_null())
    points, lines = [], []
    # an unfitted law ("not estimable": a censored point) has no estimates to draw
    coef = ({t: e for t, e in zip(law["term"], law["estimate"]) if e is not None}
            if law is not None and law.height else {})
    for axis, col in (("width (d_model)", "d_model"), ("training steps", "steps")):
        other = "steps" if col == "d_model" else "d_model"
        anchor = STEPS0 if col == "d_model" else WIDTH0
        sub = rows.filter((pl.col(other) == anchor) & (pl.col("warmup") * 10 == pl.col("steps")))
        for r in sub.iter_rows(named=True):
            censored = r["threshold_lr"] is None
            kind = ("unfinished point" if not r["complete"] else
                    f"censored ({r['censored']} the grid)" if censored else "measured")
            # a bound missing on a censored point's own side lies past the grid's edge there
            lo = edge["above"] if r["ci_lo"] is None and r["censored"] == "above" else r["ci_lo"]
            hi = edge["below"] if r["ci_hi"] is None and r["censored"] == "below" else r["ci_hi"]
            points.append({"axis": axis, "x": r[col],
                           "lr": edge[r["censored"]] if censored else r["threshold_lr"],
                           "lo": clip(lo, lo_edge), "hi": clip(hi, hi_edge), "kind": kind})
        if prediction.get("lr"):
            x = STUDY_POINT.d_model if col == "d_model" else STUDY_POINT.steps
            points.append({"axis": axis, "x": x, "lr": prediction["lr"],
                           "lo": clip(prediction["ci_lo"], lo_edge),
                           "hi": clip(prediction["ci_hi"], hi_edge), "kind": "predicted (study point)"})
        if {"a", "b", "c"} <= coef.keys():
            x0, slope = (WIDTH0, coef["b"]) if col == "d_model" else (STEPS0, coef["c"])
            far = STUDY_POINT.d_model * 1.5 if col == "d_model" else STUDY_POINT.steps * 1.5
            for x in np.geomspace(x0 / 1.5, max(far, x0 * 4), 40):
                lines.append({"axis": axis, "x": float(x), "kind": "fitted law",
                              "lr": clip(10 ** (coef["a"] + slope * math.log2(x / x0)), lo_edge)})
    x = alt.X("x:Q", scale=alt.Scale(type="log"), title=None)
    scale = alt.Scale(type="log", domain=list(CHART_LRS), clamp=True)
    title = ("necessity threshold LR (off vs rmsnorm)" if reading == "plan"
             else "instability onset LR (amendment 11)")
    y = alt.Y("lr:Q", scale=scale, title=title)
    base = alt.Chart().encode(x=x, color=alt.Color("kind:N", title=None))
    marked = alt.datum.kind != "fitted law"
    bars = base.mark_rule().encode(y=alt.Y("lo:Q", scale=scale, title=title),
                                   y2="hi:Q").transform_filter(marked)
    dots = base.mark_point(filled=True, size=60).encode(
        y=y, tooltip=["x:Q", "lr:Q", "lo:Q", "hi:Q"]).transform_filter(marked)
    fit = base.mark_line(strokeDash=[4, 3]).encode(y=y).transform_filter(~marked)
    return alt.layer(fit, bars, dots, data=alt.Data(values=points + lines)).properties(
        width=260, height=220).facet(column=alt.Column("axis:N", title=None)).resolve_scale(
        x="independent")


# --- the command line ---------------------------------------------------------------------------

USAGE = """usage: python -m analysis ladder [SOURCE ...] [out=reports/ladder]

The ladder's transfer analysis (docs/report.md, the ladder's plan). SOURCE: runs/ladder (one
sweep folder per point), a point's sweep folder, results/ladder (point archives) or one
<point>.tar.xz; default results/ladder when it exists, else runs/ladder. Writes tables
(points, law, prediction, onset_law, onset_prediction, contrast, collapse; Parquet and CSV), the
charts ladder_threshold and ladder_onset (amendment 11, exploratory) and summary.md."""


def analyse_ladder(sources: list[Path], options: ReportOptions | None = None
                   ) -> dict[str, object]:
    options = options or ReportOptions()
    with contextlib.ExitStack() as stack:
        folders = [f for s in sources for f in _point_dirs(s, stack)]
        names = [f.name for f in folders]
        twice = {n for n in names if names.count(n) > 1}
        if twice:
            raise UsageError(f"ladder point {sorted(twice)[0]} is given twice; give each once")
        results = [load_point(f, options) for f in folders]
        order = list(KNOWN)
        results.sort(key=lambda r: order.index(r.name))
        table = pl.DataFrame([point_row(r, options) for r in results])
        law, prediction = fit_law(results, options)
        # amendment 11 (exploratory): the same law, prediction and contrast on the onset
        onset_law, onset_prediction = fit_law(results, options, reading="onset")
        by_name = {r.name: r for r in results}
        contrasts = [c for c in (warmup_contrast(by_name, options, reading)
                                 for reading in ("plan", "onset")) if c]
        return {"points": table, "law": law, "prediction": pl.DataFrame([prediction]),
                "onset_law": onset_law, "onset_prediction": pl.DataFrame([onset_prediction]),
                "contrast": pl.DataFrame(contrasts) if contrasts else pl.DataFrame(),
                "collapse": collapse([r for r in results if r.complete])}


def _law_text(law: pl.DataFrame, p: dict, label: str) -> str:
    """One law's fit and prediction in a sentence, or why it was not fitted."""
    if p["lr"] is None:
        return f"{label}: {p['note']}."
    terms = {r["term"]: r for r in law.iter_rows(named=True)}
    a, b, c = terms["a"], terms["b"], terms["c"]
    return (
        f"{label} over {p['points']}: log10(LR) = {a['estimate']:+.2f} "
        f"{b['estimate']:+.2f} log2(d_model/64) {c['estimate']:+.2f} log2(steps/300); b "
        f"{b['estimate']:+.2f} [{b['ci_lo']:+.2f}, {b['ci_hi']:+.2f}] decades per doubling of "
        f"width ({b['decision']}), c {c['estimate']:+.2f} [{c['ci_lo']:+.2f}, "
        f"{c['ci_hi']:+.2f}] per doubling of steps ({c['decision']}). Predicted at the study "
        f"point (d_model 192, 24,414 steps): LR {p['lr']:.3g} [{p['ci_lo']:.3g}, "
        f"{p['ci_hi']:.3g}] (an extrapolation).")


def _contrast_text(row: dict) -> str:
    label = ("Warmup contrast, the plan's threshold" if row["reading"] == "plan"
             else "Warmup contrast, the onset (amendment 11, exploratory)")
    if row["decision"] is None:
        return f"{label}: not estimable ({row['note']})."
    return (f"{label}: log10 {row['contrast']} = {row['log10_ratio']:+.2f} "
            f"[{row['ci_lo']:+.2f}, {row['ci_hi']:+.2f}] ({row['decision']}).")


def prediction_check(points: pl.DataFrame, prediction: dict, reading: str = "plan") -> str:
    """The study point's measured threshold (or onset) against the law's prediction, in one
    sentence, or "" when the study point has not been run or the law was not fitted."""
    if prediction.get("lr") is None or "study-point" not in points["point"].to_list():
        return ""
    r = as_reading(points, reading).filter(pl.col("point") == "study-point").row(0, named=True)
    what = "threshold" if reading == "plan" else "onset"
    head = (f"Study point ({r['runs']} runs{'' if r['complete'] else ', unfinished'}): measured "
            f"{what} {r['threshold']} against the predicted {prediction['lr']:.3g} "
            f"[{prediction['ci_lo']:.3g}, {prediction['ci_hi']:.3g}]")
    if r["threshold_lr"] is None:
        return f"{head}: censored, so the prediction is not tested."
    inside = prediction["ci_lo"] <= r["threshold_lr"] <= prediction["ci_hi"]
    overlap = ((r["ci_lo"] or 0.0) <= prediction["ci_hi"]
               and (r["ci_hi"] or math.inf) >= prediction["ci_lo"])
    return (f"{head}: the measured estimate lies {'inside' if inside else 'outside'} the "
            f"prediction interval, and the two intervals {'overlap' if overlap else 'do not overlap'}.")


def summary_text(out: dict) -> str:
    """The ladder's tables as Markdown (what docs/results.md publishes)."""
    t: pl.DataFrame = out["points"]  # type: ignore[assignment]
    lines = ["| point | d_model | steps | warmup | runs | H1 | tested rule | threshold [95% CI] "
             "| onset [95% CI] (amendment 11) | LR-sensitivity gap [95% CI] "
             "| max stable LR on/off [95% CI] | off peak logit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in t.iter_rows(named=True):
        sens = (f"{r['sensitivity_gap']:+.3f} [{r['sensitivity_lo']:+.3f}, "
                f"{r['sensitivity_hi']:+.3f}]" if r["sensitivity_lo"] is not None else "-")
        ratio = (f"x{r['stable_ratio']:.2f} [{r['stable_ratio_lo']:.2f}, "
                 f"{r['stable_ratio_hi']:.2f}]" if r["stable_ratio_lo"] is not None else "-")
        runs = f"{r['runs']}" + ("" if r["complete"] else f" ({r['runs_left']} left)")
        lines.append(f"| `{r['point']}` | {r['d_model']} | {r['steps']:,} | {r['warmup']} | "
                     f"{runs} | {r['h1']} | {r['rule']} | {r['threshold']} | {r['onset']} | "
                     f"{sens} | {ratio} | {r['off_peak_logit']:,.0f} |")
    lines.append("")
    lines.append(_law_text(out["law"], out["prediction"].row(0, named=True),  # type: ignore
                           "Transfer law"))
    lines.append("")
    lines.append(_law_text(out["onset_law"], out["onset_prediction"].row(0, named=True),  # type: ignore
                           "Onset law (amendment 11, exploratory)"))
    for reading, key in (("plan", "prediction"), ("onset", "onset_prediction")):
        check = prediction_check(t, out[key].row(0, named=True), reading)  # type: ignore[union-attr]
        if check:
            lines += ["", check]
    contrast: pl.DataFrame = out["contrast"]  # type: ignore[assignment]
    for row in contrast.iter_rows(named=True) if contrast.width else []:
        lines += ["", _contrast_text(row)]
    return "\n".join(lines) + "\n"


def cli(argv: list[str]) -> int:
    given = [a for a in argv if "=" not in a]
    pairs = split_key_values([a for a in argv if "=" in a])
    if set(pairs) - {"out"}:
        raise UsageError(f"unknown key {sorted(set(pairs) - {'out'})[0]!r}; keys: out=")
    if not given:
        given = ["results/ladder" if Path("results/ladder").is_dir() else "runs/ladder"]
    out = analyse_ladder([Path(g) for g in given])
    folder = Path(pairs.get("out", "reports/ladder"))
    from .report import write_table
    from . import charts as C
    tables = folder / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name, df in out.items():
        if isinstance(df, pl.DataFrame) and df.width:
            write_table(df, tables, f"ladder_{name}")
    text = summary_text(out)
    (folder / "summary.md").write_text(text)
    for reading, law, prediction, name in (("plan", "law", "prediction", "ladder_threshold"),
                                           ("onset", "onset_law", "onset_prediction",
                                            "ladder_onset")):
        C.save_chart(chart(out["points"], out[prediction].row(0, named=True),  # type: ignore
                           out[law], reading), folder / "charts", name)
    sys.stdout.write(text)
    print(f"ladder: {folder}/summary.md, tables/ and charts/ladder_threshold.png, "
          "ladder_onset.png", file=sys.stderr)
    return 0
