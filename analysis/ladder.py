"""`python -m analysis ladder [SOURCE ...] [out=reports/ladder]`: per ladder point the tested rule,
the onset, H2's two measures and the off arm's peak logit; across the width-64 points the warmup
law, its claims and its prediction at the study preset's schedule (docs/report.md)."""

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
from qkstudy.sweep.ladder import KNOWN, STUDY_POINT, WARMUP_POINTS, Point, point_words
from qkstudy.sweep.plan import remaining_runs

from . import stats as S
from .hypotheses import small_sample_widening
from .load import load_runs
from .metrics import OFF, paired_gaps
from .study import ReportOptions, Study, analyse
from .threshold import DepthDraws, depth_draws, estimate_text, gap_matrix, tested_rule, \
    threshold_interval

ON = "rmsnorm"
WARMUP0, STEPS0 = 30, 300  # the anchor: the law's coefficients are per doubling from here
MARGIN = math.log10(2) / 4  # decades per doubling: under x2 across the 16x range of steps


@dataclass
class PointResult:
    name: str
    point: Point
    study: Study | None
    complete: bool
    left: int  # runs the sweep still has to train
    onset: DepthDraws  # the estimate (log10 LR, +-inf outside the LRs tested) and its draws
    seeds: int


# --- reading the points -----------------------------------------------------------------------

def point_dirs(source: Path, stack: contextlib.ExitStack) -> list[Path]:
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
            found += point_dirs(child, stack)
    if not found:
        raise UsageError(f"{source} holds no ladder point (a sweep folder with sweep.json, or "
                         f"a <point>{archive.SUFFIX})")
    return found


def load_point(folder: Path, options: ReportOptions) -> PointResult:
    name = folder.name
    if name not in KNOWN:
        raise UsageError(f"{folder}: {name!r} is not a ladder point; known: {', '.join(KNOWN)}")
    point = KNOWN[name]
    todo, extra = remaining_runs(parse_sweep_config(point_words(point, [], str(folder.parent))))
    study = analyse(load_runs(folder), options)
    on = paired_gaps(study.points, options.study).filter(pl.col("compared_arm") == ON)
    cells = study.gaps.filter((pl.col("compared_arm") == ON) & pl.col("informative"))
    lrs = sorted(cells["lr"].to_list())
    seeds = sorted(set(on["seed"].to_list()))
    if not lrs or len(seeds) < 2:
        raise UsageError(f"{folder}: no informative cell with 2 or more paired seeds yet")
    values = gap_matrix(on.filter(pl.col("lr").is_in(lrs)), seeds, lrs)
    # each point's own seed draws: the points share no run
    draws = S.seed_draws(len(seeds), options.study.bootstrap, f"ladder/{name}")
    onset = depth_draws(values, lrs, draws, options.study.min_gap,
                        trained_up_to=tested_rule(cells)["trained_up_to"])
    return PointResult(name=name, point=point, study=study, complete=not todo and not extra,
                       left=len(todo) + len(extra), onset=onset,
                       seeds=int((~np.isnan(values)).sum(axis=0).min()))


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


def onset_columns(d: DepthDraws, k: float) -> dict:
    """The onset of one point: estimate, widened interval and its text."""
    lo, hi = threshold_interval(d, k)
    lrs = [10 ** v if math.isfinite(v) else None for v in (d.point, lo, hi)]
    return {**dict(zip(("onset_lr", "onset_lo", "onset_hi"), lrs)),
            "onset": estimate_text(d.point, lo, hi, d.lrs)}


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
        "run_seconds": float(s.points["wall_seconds"].sum()),
    }


def peak_logits(study: Study) -> pl.DataFrame:
    """Per completed run: its peak max attention logit over probe steps (and layers)."""
    probes = study.probe_steps.filter(pl.col("name") == "max_attention_logit")
    peak = probes.group_by("run").agg(peak_logit=pl.col("value").max())
    runs = study.points.filter(pl.col("status") == "completed").select("run", "arm", "lr", "seed")
    return runs.join(peak, on="run").filter(pl.col("peak_logit").is_finite()
                                            & (pl.col("peak_logit") > 0))


# --- the warmup law -----------------------------------------------------------------------------

def design(points: list[Point]) -> np.ndarray:
    return np.array([[1.0, math.log2(p.warmup / WARMUP0), math.log2(p.steps / STEPS0)]
                     for p in points])


STUDY_X = design([STUDY_POINT])[0]  # 1,000 warmup steps of 24,414
CLAIMS = {"p_raises": "warmup raises it", "p_steps": "it follows the warmup's steps",
          "p_share": "it follows the warmup's share of the run"}
LAW_SCHEMA = {"term": pl.String, "estimate": pl.Float64, "ci_lo": pl.Float64,
              "ci_hi": pl.Float64}


def _equal(x: np.ndarray, undefined: np.ndarray) -> float:
    """Bootstrap p-value of |x| < MARGIN (both one-sided tests)."""
    return max(S.p_bootstrap(undefined | (x >= MARGIN)), S.p_bootstrap(undefined | (x <= -MARGIN)))


def fit_law(results: list[PointResult], options: ReportOptions) -> tuple[pl.DataFrame, dict]:
    """The warmup law's terms (a, b, c and b + c) with intervals, its three claims under Holm
    and the prediction at the study preset's schedule. A censored point is left out and named;
    the claims are then exploratory."""
    ready = [r for r in results if r.name in WARMUP_POINTS and r.complete]
    law = [r for r in ready if math.isfinite(r.onset.point)]
    left_out = [f"{r.name} ({'below' if r.onset.point < 0 else 'above'} the LRs tested)"
                for r in ready if r not in law]
    fit = {"points": ", ".join(r.name for r in law), "left_out": ", ".join(left_out),
           "log10_lr": None, "lr": None, "ci_lo": None, "ci_hi": None, "note": ""}
    pts = [r.point for r in law]
    if len({p.warmup for p in pts}) < 2 or len({p.steps for p in pts}) < 2 or len(law) < 4:
        fit["note"] = ("not estimable yet: the law needs four complete points at two warmups "
                       f"and two lengths (has {fit['points'] or 'none'})")
        return pl.DataFrame(schema=LAW_SCHEMA), fit
    pinv = np.linalg.pinv(design(pts))
    est = pinv @ np.array([r.onset.point for r in law])
    y = np.stack([r.onset.draws for r in law], axis=1)  # (B, points): each point's own draws
    undefined = ~np.isfinite(y).all(axis=1)
    boot = np.where(undefined[:, None], np.nan, np.where(np.isfinite(y), y, 0.0) @ pinv.T)
    boot = est + small_sample_widening(min(r.seeds for r in law)) * (boot - est)
    b, c = boot[:, 1], boot[:, 2]
    terms = {"a": (est[0], boot[:, 0]), "b": (est[1], b), "c": (est[2], c),
             "b + c": (est[1] + est[2], b + c)}
    rows = []
    for term, (e, draws) in terms.items():
        lo, hi = S.percentile_interval(draws[~undefined]) if (~undefined).any() else (None, None)
        rows.append({"term": term, "estimate": float(e), "ci_lo": lo, "ci_hi": hi})
    tests = {"p_raises": S.p_bootstrap(undefined | (b <= 0)), "p_steps": _equal(c, undefined),
             "p_share": _equal(b + c, undefined)}
    S.adjust_family([(tests, k) for k in CLAIMS], options.study.alpha, method="holm")
    decided = [CLAIMS[k] for k in CLAIMS if tests["q" + k[1:]] < options.study.alpha]
    pdraws = boot[~undefined] @ STUDY_X
    pred = float(STUDY_X @ est)
    lo, hi = S.percentile_interval(pdraws) if pdraws.size else (math.nan, math.nan)
    fit.update(tests, decided="; ".join(decided) or "none decided", log10_lr=pred, lr=10 ** pred,
               ci_lo=10 ** lo, ci_hi=10 ** hi, exploratory=bool(left_out))
    return pl.DataFrame(rows, schema=LAW_SCHEMA), fit


# --- text ---------------------------------------------------------------------------------------

def _interval(r: dict) -> str:
    return f"{r['estimate']:+.2f} [{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}]"


def law_text(law: pl.DataFrame, fit: dict) -> str:
    """The law's fit, claims and prediction in three sentences, or why it was not fitted."""
    if fit["lr"] is None:
        return f"Warmup law: {fit['note']}."
    t = {r["term"]: r for r in law.iter_rows(named=True)}
    out = (f"Warmup law over {fit['points']}: log10(onset) = {t['a']['estimate']:+.2f} "
           f"{t['b']['estimate']:+.2f} log2(warmup/30) {t['c']['estimate']:+.2f} "
           f"log2(steps/300); b {_interval(t['b'])}, c {_interval(t['c'])}, b + c "
           f"{_interval(t['b + c'])} decades per doubling. Decided (Holm, 0.05; margin "
           f"{MARGIN:.3f}): {fit['decided']} (adjusted p: warmup raises it "
           f"{fit['q_raises']:.2g}, steps {fit['q_steps']:.2g}, share {fit['q_share']:.2g}). "
           f"Predicted onset at the study preset's schedule (1,000 warmup steps of 24,414): LR "
           f"{fit['lr']:.3g} [{fit['ci_lo']:.3g}, {fit['ci_hi']:.3g}] (an extrapolation).")
    if fit["left_out"]:
        out += f" Left out: {fit['left_out']}; the claims are exploratory."
    return out


def prediction_check(points: pl.DataFrame, fit: dict) -> str:
    """The study point's measured onset against the law's prediction, in one sentence, or ""
    when the study point has not been run or the law was not fitted."""
    if fit.get("lr") is None or "study-point" not in points["point"].to_list():
        return ""
    r = points.filter(pl.col("point") == "study-point").row(0, named=True)
    head = (f"Study point ({r['runs']} runs{'' if r['complete'] else ', unfinished'}): measured "
            f"onset {r['onset']} against the predicted {fit['lr']:.3g} "
            f"[{fit['ci_lo']:.3g}, {fit['ci_hi']:.3g}]")
    if r["onset_lr"] is None:
        return f"{head}: outside the LRs tested, so the prediction is not tested."
    inside = fit["ci_lo"] <= r["onset_lr"] <= fit["ci_hi"]
    overlap = ((r["onset_lo"] or 0.0) <= fit["ci_hi"]
               and (r["onset_hi"] or math.inf) >= fit["ci_lo"])
    return (f"{head}: the measured estimate lies {'inside' if inside else 'outside'} the "
            f"prediction interval, and the two intervals {'overlap' if overlap else 'do not overlap'}.")


def ci_text(r: dict, key: str, fmt: str, prefix: str = "") -> str:
    """r[key] with its interval (r[key_lo], r[key_hi]) as text, or "-" without one."""
    if r.get(key) is None or r.get(f"{key}_lo") is None:
        return "-"
    return (f"{prefix}{r[key]:{fmt}} [{prefix}{r[f'{key}_lo']:{fmt}}, "
            f"{prefix}{r[f'{key}_hi']:{fmt}}]")


def summary_text(out: dict) -> str:
    """The ladder's tables as Markdown (what docs/results.md publishes)."""
    t: pl.DataFrame = out["points"]  # type: ignore[assignment]
    lines = ["| point | d_model | steps | warmup | runs | tested rule | onset [95% CI] "
             "| LR-sensitivity gap [95% CI] | max usable LR on/off [95% CI] | off peak logit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in t.iter_rows(named=True):
        runs = f"{r['runs']}" + ("" if r["complete"] else f" ({r['runs_left']} left)")
        lines.append(f"| `{r['point']}` | {r['d_model']} | {r['steps']:,} | {r['warmup']:,} | "
                     f"{runs} | {r['rule']} | {r['onset']} | "
                     f"{ci_text(r, 'sensitivity_gap', '+.3f')} | "
                     f"{ci_text(r, 'usable_ratio', '.2f', 'x')} | {r['off_peak_logit']:,.0f} |")
    fit = out["fit"]
    lines += ["", law_text(out["law"], fit)]  # type: ignore[arg-type]
    check = prediction_check(t, fit)  # type: ignore[arg-type]
    return "\n".join(lines + (["", check] if check else [])) + "\n"


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


def warmup_chart(table: pl.DataFrame):
    """One figure: each probe (rows) at each LR (columns) against step, a line per seed,
    coloured by the warmup's length."""
    import altair as alt

    data = table.with_columns(lr=pl.format("LR {}", pl.col("lr").round_sig_figs(3)),
                              line=pl.format("{}-{}", "warmup", "seed"))
    return alt.Chart(data).mark_line().encode(
        x=alt.X("step:Q", title="step"), y=alt.Y("value:Q", title=None),
        color=alt.Color("warmup:N", title="warmup steps"), detail="line:N",
    ).properties(width=200, height=140).facet(
        row=alt.Row("probe:N", title=None), column=alt.Column("lr:N", title=None)
    ).resolve_scale(y="independent")


# --- the command line ---------------------------------------------------------------------------

USAGE = """usage: python -m analysis ladder [SOURCE ...] [out=reports/ladder]

The ladder's analysis (docs/report.md). SOURCE: runs/ladder (one sweep folder per point), a
point's sweep folder, results/ladder (point archives) or one <point>.tar.xz; default
results/ladder when it exists, else runs/ladder. Writes tables (points, law; Parquet and CSV),
the warmup figure (when the probe sweeps are there) and summary.md, and prints the summary: with the study point run on a GPU, its measured
onset against the law's prediction."""


def analyse_ladder(sources: list[Path], options: ReportOptions | None = None
                   ) -> dict[str, object]:
    options = options or ReportOptions()
    with contextlib.ExitStack() as stack:
        folders = [f for s in sources for f in point_dirs(s, stack)]
        probed = [f for f in folders if f.name.startswith("probes-")]
        folders = [f for f in folders if f not in probed]
        names = [f.name for f in folders]
        twice = {n for n in names if names.count(n) > 1}
        if twice:
            raise UsageError(f"ladder point {sorted(twice)[0]} is given twice; give each once")
        results = [load_point(f, options) for f in folders]
        probes = warmup_probes(probed) if probed else None
    results.sort(key=lambda r: list(KNOWN).index(r.name))
    law, fit = fit_law(results, options)
    return {"points": pl.DataFrame([point_row(r, options) for r in results]), "law": law,
            "fit": fit, "probes": probes}


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
    for name in ("points", "law"):
        write_table(out[name], folder / "tables", f"ladder_{name}")  # type: ignore[arg-type]
    if out["probes"] is not None:
        save_chart(warmup_chart(out["probes"]), folder / "charts", "warmup_probes")
    text = summary_text(out)
    (folder / "summary.md").write_text(text)
    sys.stdout.write(text)
    print(f"ladder: {folder}/summary.md, tables/ and charts/", file=sys.stderr)
    return 0
