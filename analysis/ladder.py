"""`python -m analysis ladder [SOURCE ...] [out=reports/ladder]`: per ladder point the tested rule,
the onset, H2's two measures and the off arm's peak logit; across the width-64 points the warmup
law, its claims and its prediction at the study preset's schedule (docs/report.md)."""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl

from qkstudy import archive
from qkstudy.progress import table
from qkstudy.config import model_args, split_key_values
from qkstudy.data.tokenizer import VOCAB_BY_TOKENIZER
from qkstudy.errors import UsageError
from qkstudy.parameters import count_params
from qkstudy.run_folder import SweepFolder
from qkstudy.sweep.config import parse_sweep_config, run_config
from qkstudy.sweep.ladder import KNOWN, STUDY_POINT, WARMUP_POINTS, Point, point_words
from qkstudy.sweep.plan import remaining_runs

from . import stats as S
from .law import FORMS, PREDICTED, fit_law, law_text, score
from .advice_table import cells_of
from .load import load_runs
from .metrics import OFF, paired_gaps
from .rerun import rerun_cells, rerun_text
from .size_law import best_against_best, size_analysis, trained_seconds
from .size_report import point_extras, size_text
from .study import ReportOptions, Study, analyse
from .threshold import DepthDraws, onset_columns, read_onset, tested_rule, widened

ON = "rmsnorm"
BODY_POINT, BODY_BASE = "w192-d6-s1200-wu480", "w64-s1200-wu480"


@dataclass
class PointResult:
    name: str
    point: Point
    study: Study | None
    complete: bool
    left: int  # runs the sweep still has to train
    onset: DepthDraws  # the estimate (log10 LR, +-inf outside the LRs read) and its draws
    seeds: int  # the whole seeds the point rests on
    best: dict = field(default_factory=dict)  # each arm's best LR and the best-against-best gap
    took: float | None = None  # seconds during which its runs trained


# --- reading the points -----------------------------------------------------------------------

def point_dirs(source: Path, stack: contextlib.ExitStack) -> list[Path]:
    """The point sweep folders a source names (archives unpacked into temporary folders)."""
    if source.name.endswith(archive.SUFFIX):
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qkstudy-ladder-")))
        return [archive.extract(source, tmp)[0]]
    if not source.is_dir():
        raise UsageError(f"ladder source {source} does not exist (give runs/ladder, a point's "
                         "folder, results/ladder or a point's .tar.xz)")
    if SweepFolder(source).plan_file.is_file():
        return [source]
    found = []
    for child in sorted(source.iterdir()):
        if child.name.endswith(archive.SUFFIX) or SweepFolder(child).plan_file.is_file():
            found += point_dirs(child, stack)
    if not found:
        raise UsageError(f"{source} holds no ladder point (a sweep folder with its plan file, or "
                         f"a <point>{archive.SUFFIX})")
    return found


class TooFewRuns(UsageError):
    """A point whose finished runs hold no cell of two paired seeds yet (an early partial)."""


def load_point(folder: Path, options: ReportOptions) -> PointResult:
    name = folder.name
    if name not in KNOWN:
        raise UsageError(f"{folder}: {name!r} is not a ladder point; known: {', '.join(KNOWN)}")
    point = KNOWN[name]
    options = replace(options, study=replace(options.study, min_gap=point.margin))
    todo, extra = remaining_runs(parse_sweep_config(point_words(point, [], str(folder.parent))))
    runs = load_runs(folder)
    study = analyse(runs, options)
    on = paired_gaps(study.points, options.study).filter(pl.col("compared_arm") == ON)
    cells = study.gaps.filter((pl.col("compared_arm") == ON) & pl.col("informative"))
    seeds = sorted(set(on["seed"].to_list()))
    if cells.is_empty() or len(seeds) < 2:
        raise TooFewRuns(f"{folder}: no informative cell with 2 or more paired seeds yet")
    # each point's own seed draws: the points share no run
    draws = S.seed_draws(len(seeds), options.study.bootstrap, f"ladder/{name}")
    onset = read_onset(cells, on, seeds, draws, options.study.min_gap)
    return PointResult(name=name, point=point, study=study, complete=not todo and not extra,
                       left=len(todo) + len(extra), onset=onset, seeds=len(seeds),
                       best=best_against_best(study.points),
                       took=trained_seconds(runs.table, runs.manifests))


# --- per point ----------------------------------------------------------------------------------

def _per_seed(table: pl.DataFrame, depth: int, column: str, log: bool, arm: str
              ) -> list[float]:
    """Per seed at one depth: arm minus off of log(`column`) when `log`, else off minus arm."""
    wide = table.filter(pl.col("depth") == depth).pivot("arm", index="seed", values=column)
    if arm not in wide.columns or OFF not in wide.columns:
        return []
    on, off = wide[arm], wide[OFF]
    return ((on.log() - off.log()) if log else (off - on)).drop_nulls().to_list()


def seed_effects(study: Study, depth: int, arm: str = ON) -> dict:
    """H2's two measures at one depth, as per-seed effects with their 95% intervals: the
    LR-sensitivity gap (off - arm, nats) and the max usable LR ratio (arm / off)."""
    drop = _per_seed(study.sensitivity_per_seed, depth, "lr_sensitivity", False, arm)
    ratio = _per_seed(study.usable_per_seed, depth, "max_usable_lr", True, arm)
    lo, hi = S.interval(drop)
    rlo, rhi = S.interval(ratio)
    return {"sensitivity_gap": float(np.mean(drop)) if drop else None, "sensitivity_gap_lo": lo,
            "sensitivity_gap_hi": hi,
            "usable_ratio": float(np.exp(np.mean(ratio))) if ratio else None,
            "usable_ratio_lo": math.exp(rlo) if rlo is not None else None,
            "usable_ratio_hi": math.exp(rhi) if rhi is not None else None}


def point_row(r: PointResult, options: ReportOptions) -> dict:
    s = r.study
    rule = tested_rule(s.gaps.filter(pl.col("compared_arm") == ON))
    peaks = peak_logits(s).filter(pl.col("arm") == OFF)
    p = r.point
    return {
        "point": r.name, "depth": p.depth, "d_model": p.d_model, "steps": p.steps, "warmup": p.warmup,
        "complete": r.complete, "runs_left": r.left, "runs": s.points.height, "seeds": r.seeds,
        "no_difference_up_to": rule["no_difference_up_to"],
        "off_worse_from": rule["off_worse_from"], "rule": rule["text"],
        **onset_columns(r.onset, options.study.threshold_widening),
        **seed_effects(s, p.depth),
        "off_peak_logit": float(peaks["peak_logit"].max()) if peaks.height else None,
        **point_extras(r),
        "run_seconds": float(s.points["wall_seconds"].sum()),
    }


def peak_logits(study: Study) -> pl.DataFrame:
    """Per completed run: its peak max attention logit over probe steps (and layers)."""
    probes = study.probe_steps.filter(pl.col("name") == "max_attention_logit")
    peak = probes.group_by("run").agg(peak_logit=pl.col("value").max())
    runs = study.points.filter(pl.col("status") == "completed").select("run", "arm", "lr", "seed")
    return runs.join(peak, on="run").filter(pl.col("peak_logit").is_finite()
                                            & (pl.col("peak_logit") > 0))


# --- text ---------------------------------------------------------------------------------------

def measured_onsets(points: pl.DataFrame) -> dict[str, dict]:
    """The scored points' measured onsets: LR, text and the side of the LRs read it lies on."""
    out = {}
    for r in points.filter(pl.col("point").is_in([p.name for p in PREDICTED])).iter_rows(
            named=True):
        if r["onset_lr"] is None and r["onset_bound"] is None:
            continue
        out[r["point"]] = {"lr": r["onset_lr"] or r["onset_bound"], "text": r["onset"],
                           "side": "" if r["onset_lr"] else r["onset_side"]}
    return out


def body_shift(results: list[PointResult], k: float) -> dict | None:
    """The study body's onset against w64-s1200-wu480's (the same schedule): the shift in
    decades with its 95% interval from both points' widened whole-seed draws; where an onset
    lies beyond its LRs read, a bound (side "<" or ">") from the LR it lies beyond."""
    by = {r.name: r.onset for r in results}
    body, base = by.get(BODY_POINT), by.get(BODY_BASE)
    if body is None or base is None:
        return None
    less = body.point == -math.inf or base.point == math.inf
    more = body.point == math.inf or base.point == -math.inf
    if less and more:
        return None
    pair = S.joint_draws([widened(body, k), widened(base, k)], 2000, "body-shift")
    lo, hi = S.percentile_interval(pair[:, 0] - pair[:, 1])
    bounded = [float(np.clip(d.point, *d.bounds)) for d in (body, base)]
    return {"shift": bounded[0] - bounded[1], "side": "<" if less else ">" if more else "",
            "ci_lo": lo, "ci_hi": hi}


def ci_text(r: dict, key: str, fmt: str, prefix: str = "") -> str:
    """r[key] with its interval (r[key_lo], r[key_hi]) as text, or "-" without one."""
    if r.get(key) is None or r.get(f"{key}_lo") is None:
        return "-"
    return (f"{prefix}{r[key]:{fmt}} [{prefix}{r[f'{key}_lo']:{fmt}}, "
            f"{prefix}{r[f'{key}_hi']:{fmt}}]")


def summary_text(out: dict) -> str:
    """The ladder's tables as Markdown (what docs/results.md publishes)."""
    t: pl.DataFrame = out["points"]  # type: ignore[assignment]
    rows = [[f"`{r['point']}`", str(r["d_model"]), f"{r['steps']:,}", f"{r['warmup']:,}",
             f"{r['runs']}" + ("" if r["complete"] else f" ({r['runs_left']} left)"), r["rule"],
             r["onset"], ci_text(r, "sensitivity_gap", "+.3f"),
             ci_text(r, "usable_ratio", ".2f", "x"), f"{r['off_peak_logit']:,.0f}"]
            for r in t.iter_rows(named=True)]
    lines = table(["point", "d_model", "steps", "warmup", "runs", "tested rule", "onset [95% CI]",
                   "LR-sensitivity gap [95% CI]", "max usable LR on/off [95% CI]",
                   "off peak logit"], rows)
    for fit in out["fits"]:  # type: ignore[attr-defined]
        lines += ["", law_text(out["law"], fit)]  # type: ignore[arg-type]
    lines += ["", prediction_text(out["fits"], out["scores"]), "", body_text()]  # type: ignore[arg-type]
    lines += size_text(t, out["size"])  # type: ignore[arg-type]
    lines += rerun_text(out.get("rerun"))  # type: ignore[arg-type]
    shift = out["body_shift"]
    if shift is not None:
        lines += ["", f"The study's model body (d_model 192, depth 6, head_dim 64) against "
                      f"{BODY_BASE} (the same schedule): its onset is shifted by "
                      f"{shift['side']}{shift['shift']:+.2f} decades [{shift['ci_lo']:+.2f}, "
                      f"{shift['ci_hi']:+.2f}]" + (" (a bound: an onset lies beyond the LRs "
                                                   "it was read over)." if shift["side"] else ".")]
    return "\n".join(lines) + "\n"


def body_text() -> str:
    """The study preset's parameters outside the embeddings against the ladder's models'."""
    def body(p: Point) -> float:
        words = parse_sweep_config(point_words(p, [], "runs/ladder"))
        cfg = run_config(words, p.depth, words.train.lr, ON, 0)
        return count_params(model_args(cfg, VOCAB_BY_TOKENIZER["bytes"]))["non_embedding"] / 1e6

    ladder = [body(p) for n, p in KNOWN.items() if n in WARMUP_POINTS or n.endswith("-s300")]
    return (f"The study preset's model has {body(STUDY_POINT):.2f}M parameters outside its "
            f"embeddings; the ladder's models {min(ladder):.2f}M-{max(ladder):.2f}M.")


def prediction_text(fits: list[dict], scores: pl.DataFrame) -> str:
    """Each form's prediction at each scored point and the study preset, with the measured
    onset and "inside"/"outside" where the point was run, as a Markdown table."""
    rows = []
    for fit in fits:
        for p in fit["predictions"]:
            s = scores.filter((pl.col("form") == p["form"]) & (pl.col("point") == p["point"]))
            m = s.row(0, named=True) if s.height else {"measured": "not run", "error": "-",
                                                        "inside": "-"}
            rows.append([f"`{p['point']}`", p["form"],
                         f"{p['lr']:.3g} [{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]",
                         *(str(m[k]) for k in ("measured", "error", "inside"))])
    return "\n".join(table(["point", "law", "predicted onset [95% interval of a measured onset]",
                            "measured onset", "error, decades", "inside?"], rows))


# --- the warmup figure -------------------------------------------------------------------------

PROBED = {"max_attention_logit": "max attention logit (off)",
          "attention_entropy_mean": "attention entropy, nats (off)"}


def warmup_probes(folders: list[Path]) -> pl.DataFrame:
    """The probe sweeps' max attention logit and attention entropy through the first 20% of
    training: (warmup, lr, seed, step, probe, value)."""
    from .metrics import probe_over_layers

    frames = []
    for folder in folders:
        runs = load_runs(folder)
        point = KNOWN[folder.name]
        keys = runs.table.select("run", "lr", "seed")
        steps = probe_over_layers(runs.probes).filter(
            pl.col("name").is_in(list(PROBED)) & (pl.col("step") <= point.steps // 5)).collect()
        frames.append(steps.join(keys, on="run").with_columns(
            warmup=pl.lit(point.warmup), probe=pl.col("name").replace_strict(PROBED)))
    return pl.concat(frames).select("warmup", "lr", "seed", "step", "probe", "value")


def decades(values: pl.Series) -> list[float]:
    """The powers of ten from below the smallest positive value to above the largest."""
    v = values.filter(values > 0)
    if v.is_empty():
        return []
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))  # type: ignore
    return [10.0 ** k for k in range(lo, hi + 1)]


def warmup_chart(table: pl.DataFrame):
    """One figure: each probe (rows; the max attention logit on a log axis) at each LR
    (columns) against step, a line per seed coloured by the warmup's length (in numeric order),
    with a dashed rule in the same colour where that warmup ends."""
    import altair as alt

    from .charts import values

    warmups = sorted(set(table["warmup"].to_list()))
    order = {v: f"LR {v:.3g}" for v in sorted(set(table["lr"].to_list()))}
    data = table.with_columns(lr=pl.col("lr").replace_strict(order, return_dtype=pl.String),
                              line=pl.format("{}-{}", "warmup", "seed"), kind=pl.lit("probe"))
    ends = data.unique(["probe", "lr", "warmup"]).with_columns(
        step=pl.col("warmup").cast(pl.Int64), value=None, kind=pl.lit("end"))
    colour = alt.Color("warmup:N", title="warmup steps", scale=alt.Scale(domain=warmups),
                       legend=alt.Legend(orient="right"))
    rows = []
    for i, (probe, log) in enumerate(((PROBED["max_attention_logit"], True),
                                      (PROBED["attention_entropy_mean"], False))):
        mine = pl.concat([data, ends], how="diagonal_relaxed").filter(pl.col("probe") == probe)
        if log:
            mine = mine.filter((pl.col("kind") == "end") | (pl.col("value") > 0))
        y = (alt.Y("value:Q", title=probe + ", log scale", scale=alt.Scale(type="log"),
                   axis=alt.Axis(values=decades(mine["value"]), format=",~r"))
             if log else alt.Y("value:Q", title=probe))
        x = alt.X("step:Q", title="step" if i else None)
        lines = alt.Chart().mark_line().encode(x=x, y=y, color=colour, detail="line:N"
                                               ).transform_filter(alt.datum.kind == "probe")
        rules = alt.Chart().mark_rule(strokeDash=[5, 3], strokeWidth=1.5).encode(
            x=x, color=colour).transform_filter(alt.datum.kind == "end")
        rows.append(alt.layer(lines, rules, data=values(mine)).properties(width=200, height=150).facet(
            column=alt.Column("lr:N", title=None, sort=list(order.values()),
                              header=alt.Header(labels=i == 0))))  # the LRs over the top row
    ends_at = " or ".join(f"{w:,}" for w in warmups)
    return alt.vconcat(*rows, spacing=12).properties(title=alt.Title(
        [f"The off arm (QK-norm off) through the first fifth of training, a line per seed; "
         f"dashed rule: the warmup's end (step {ends_at})."], orient="bottom", anchor="start",
        fontSize=12, fontWeight="normal", color="#222222", offset=10))


# --- the command line ---------------------------------------------------------------------------

USAGE = """usage: python -m analysis ladder [SOURCE ...] [out=reports/ladder]

The ladder's analysis (docs/report.md). SOURCE: runs/ladder (one sweep folder per point), a
point's sweep folder, results/ladder (point archives) or one <point>.tar.xz; default
results/ladder when it exists, else runs/ladder. Writes tables (points, law; Parquet and CSV),
the warmup figure (when the probe sweeps are there) and summary.md, and prints the summary: with the study point run on a GPU, its measured
onset against the law's prediction."""


def read_points(sources: list[Path], options: ReportOptions, probes: bool = True
                ) -> tuple[list[PointResult], pl.DataFrame | None]:
    """The points the sources hold, in the ladder's order, and the probe sweeps' table (None
    without probe sweeps or when `probes` is false)."""
    with contextlib.ExitStack() as stack:
        folders = [f for s in sources for f in point_dirs(s, stack)]
        probed = [f for f in folders if f.name.startswith("probes-")]
        folders = [f for f in folders if f not in probed]
        probed = probed if probes else []
        names = [f.name for f in folders]
        twice = {n for n in names if names.count(n) > 1}
        if twice:
            raise UsageError(f"ladder point {sorted(twice)[0]} is given twice; give each once")
        results = [load_point(f, options) for f in folders]
        table = warmup_probes(probed) if probed else None
    results.sort(key=lambda r: list(KNOWN).index(r.name))
    return results, table


def analyse_ladder(sources: list[Path]) -> dict[str, object]:
    options = ReportOptions()
    results, probes = read_points(sources, options)
    fitted = [fit_law(results, options, form) for form in FORMS]
    points = pl.DataFrame([point_row(r, options) for r in results])
    fits = [fit for _, fit in fitted]
    return {"points": points, "law": pl.concat([law for law, _ in fitted]), "fits": fits,
            "scores": score(fits, measured_onsets(points)), "probes": probes,
            "body_shift": body_shift(results, options.study.threshold_widening),
            "size": size_analysis(results),
            "rerun": rerun_cells(results),
            "cells": {r.name: cells_of(r.study.gaps, r.point.depth) for r in results}}


def cli(argv: list[str]) -> int:
    from .charts import save_chart
    from .report import write_table

    given = [a for a in argv if "=" not in a]
    pairs = split_key_values([a for a in argv if "=" in a])
    if set(pairs) - {"out"}:
        raise UsageError(f"unknown key {sorted(set(pairs) - {'out'})[0]!r}; keys: out=")
    if not given:
        given = ["results/ladder" if Path("results/ladder").is_dir() else "runs/ladder"]
    out = analyse_ladder([Path(g) for g in given])
    folder = Path(pairs.get("out", "reports/ladder"))
    (folder / "tables").mkdir(parents=True, exist_ok=True)
    for name in ("points", "law", "scores"):
        write_table(out[name], folder / "tables", f"ladder_{name}")  # type: ignore[arg-type]
    if out["probes"] is not None:
        save_chart(warmup_chart(out["probes"]), folder / "charts", "warmup_probes")
    text = summary_text(out)
    (folder / "summary.md").write_text(text)
    sys.stdout.write(text)
    print(f"ladder: {folder}/summary.md, tables/ and charts/", file=sys.stderr)
    return 0
