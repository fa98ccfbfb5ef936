"""Build the study report: tables (Parquet + CSV), charts (PNG, SVG, HTML) and one offline
report.html with the verdicts and the provenance of the runs behind them."""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import altair as alt
import jinja2
import markupsafe
import polars as pl
import vl_convert as vlc

from qkstudy.errors import UsageError

from . import charts as C
from . import metrics as M
from . import verdicts as V
from .load import Runs, load_runs

FINISHED = ("completed", "diverged")


@dataclass(frozen=True)
class ReportOptions:
    """Everything that changes the report besides the runs themselves."""

    loss_threshold: float | None = None  # steps-to-threshold level; None: per depth, see docs
    curve_lrs: tuple[float, ...] = ()  # LRs for training curves; empty: chosen per depth
    probe_names: tuple[str, ...] = ()  # probes for the "other probes" chart; empty: see charts
    study: M.Options = field(default_factory=M.Options)
    png_scale: float = 2.0


@dataclass
class Study:
    """The numbers of one report, before any of it is written."""

    runs: Runs
    framework: str
    setting: str
    points: pl.DataFrame  # finished runs of the primary framework and setting
    others: pl.DataFrame  # finished runs of other frameworks in that setting (overlaid)
    probe_steps: pl.DataFrame  # (run, step, name, value) reduced over layers
    per_run: pl.DataFrame
    arms: pl.DataFrame
    sensitivity_per_seed: pl.DataFrame
    stable_per_seed: pl.DataFrame
    gaps: pl.DataFrame
    thresholds: pl.DataFrame
    spikes: pl.DataFrame
    verdicts: pl.DataFrame
    best_gaps: pl.DataFrame  # H1: off's best loss minus on's, each at its own optimal LR
    h2_tests: pl.DataFrame  # H2: max stable LR ratio and LR sensitivity drop per depth
    h3_tests: pl.DataFrame  # H3: the threshold's shift between each pair of depths
    twins: pl.DataFrame
    loss_thresholds: pl.DataFrame
    notes: list[str]


def _most_common(column: pl.Series, prefer: str | None = None) -> str:
    counts = column.value_counts(sort=True)
    if prefer is not None and prefer in column.to_list():
        return prefer
    return counts.row(0)[0]


def _setting_label(setting: str, all_settings: list[str]) -> str:
    """How this setting differs from the others ("all" when there is only one)."""
    if len(all_settings) <= 1:
        return "all runs share one setting"
    mine = json.loads(setting)
    others = [json.loads(s) for s in all_settings if s != setting]
    keys = sorted({k for o in others for k in set(o) | set(mine) if o.get(k) != mine.get(k)})
    return ", ".join(f"{k}={mine.get(k)}" for k in keys)


def analyse(runs: Runs, options: ReportOptions = ReportOptions()) -> Study:
    """All study numbers: choose the runs, then the per-run table and the study metrics."""
    table = runs.table
    finished = table.filter(pl.col("status").is_in(FINISHED))
    if finished.is_empty():
        raise UsageError(f"no finished runs under {runs.root} (all {table.height} failed)")
    notes = []
    framework = _most_common(finished["framework"], prefer="mlx")
    primary = finished.filter(pl.col("framework") == framework)
    setting = _most_common(primary["setting"])
    settings = primary["setting"].unique().to_list()
    if len(settings) > 1:
        left = primary.filter(pl.col("setting") != setting)
        chosen = primary.height - left.height
        notes.append(f"the study metrics use the largest group of {framework} runs that share "
                     f"one setting: {chosen} runs with {_setting_label(setting, settings)}; the "
                     f"other {left.height} runs differ in that setting and are listed but left "
                     f"out of the metrics (give their sweep folder to report them)")
    points = primary.filter(pl.col("setting") == setting)
    unique = points.unique(subset="identity", keep="first", maintain_order=True)
    if unique.height < points.height:
        notes.append(f"{points.height - unique.height} runs repeat the configuration of another "
                     f"run (same identity, another folder); the first of each is used")
        points = unique
    pairs = points.select("seed", "data_seed").unique()
    if pairs.height > pairs["seed"].n_unique():
        # replicates differ in data order as well as init: count each (seed, data_seed) pair
        points = points.with_columns(
            seed=(pl.struct("seed", "data_seed").rank("dense") - 1).cast(pl.Int64))
        notes.append("seeds count as (seed, data_seed) pairs, numbered from 0 in the metrics")
    others = finished.filter((pl.col("framework") != framework) & (pl.col("setting") == setting))
    if others.height:
        notes.append(f"{others.height} run{'s' if others.height != 1 else ''} of framework "
                     f"{', '.join(sorted(others['framework'].unique()))} are overlaid on their "
                     f"{framework} twins, not mixed into the study metrics")
    study = options.study
    arms = M.arm_table(points)
    gaps = M.gap_table(points, study)
    thresholds = M.necessity_threshold(points, study, gaps)
    verdicts, best_gaps, h2_tests, h3_tests = V.study_verdicts(points, study)
    if options.loss_threshold is not None:
        loss_thresholds = pl.DataFrame({"depth": sorted(table["depth"].unique().to_list())}) \
            .with_columns(loss_threshold=pl.lit(float(options.loss_threshold)))
    else:
        loss_thresholds = M.default_loss_thresholds(points, runs.metrics)
    probe_steps = M.probe_over_layers(runs.probes).collect()
    per_run = per_run_table(runs, probe_steps, loss_thresholds, in_study=points["run"])
    grid = M.mark_base_grid(points).select("run", "in_grid")
    per_run = per_run.join(grid, on="run", how="left")
    twins = twin_table(runs, framework)
    return Study(runs=runs, framework=framework, setting=setting, points=points, others=others,
                 probe_steps=probe_steps, per_run=per_run, arms=arms,
                 sensitivity_per_seed=M.lr_sensitivity_per_seed(points),
                 stable_per_seed=M.max_stable_lr_per_seed(points, study), gaps=gaps,
                 thresholds=thresholds, spikes=M.spike_table(points), verdicts=verdicts,
                 best_gaps=best_gaps, h2_tests=h2_tests, h3_tests=h3_tests,
                 twins=twins,
                 loss_thresholds=loss_thresholds, notes=notes)


def per_run_table(runs: Runs, probe_steps: pl.DataFrame, loss_thresholds: pl.DataFrame,
                  in_study: pl.Series) -> pl.DataFrame:
    """One row per run: design, outcome, steps-to-threshold and probe summaries."""
    t = runs.table
    reached = M.steps_to_threshold(runs.metrics, t, loss_thresholds)
    probes = M.probe_summary(probe_steps)
    first = ["run", "sweep", "run_id", "framework", "depth", "arm", "qk_norm", "lr", "seed",
             "data_seed", "status", "init_loss", "final_val_loss", "final_val_ppl",
             "min_val_loss", "final_train_loss", "diverged_step", "diverged_reason", "steps",
             "tokens_seen", "loss_threshold", "steps_to_threshold", "tokens_to_threshold",
             "peak_max_attention_logit"]
    out = (t.with_columns(final_val_ppl=pl.col("final_val_loss").exp(),
                          in_study=pl.col("run").is_in(in_study.implode()))
           .join(loss_thresholds, on="depth", how="left")
           .join(reached, on="run", how="left")
           .join(probes, on="run", how="left"))
    for name in first:
        if name not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias(name))
    probe_cols = sorted(c for c in out.columns if c.startswith("final_") and c not in first)
    rest = [c for c in out.columns if c not in first and c not in probe_cols]
    return out.select(first + probe_cols + rest).sort("depth", "arm", "lr", "seed",
                                                      "framework")


def twin_table(runs: Runs, framework: str) -> pl.DataFrame:
    """Runs of another framework next to their twin (same identity) of the primary one, with
    the largest val loss difference over the eval steps both logged."""
    t = runs.table.select("run", "framework", "identity", "depth", "arm", "lr", "seed",
                          "status", "final_val_loss")
    base = t.filter(pl.col("framework") == framework).unique(subset="identity", keep="first",
                                                                maintain_order=True)
    other = t.filter(pl.col("framework") != framework)
    pairs = other.join(base.select("identity", twin_run="run", twin_status="status",
                                   twin_final_val_loss="final_val_loss"), on="identity")
    if pairs.is_empty():
        return pairs.drop("identity")
    val = runs.metrics.filter(pl.col("val_loss").is_not_null()).select("run", "step", "val_loss")
    curves = (pairs.lazy().select("run", "twin_run")
              .join(val, on="run")
              .join(val.rename({"run": "twin_run", "val_loss": "twin_val_loss"}),
                    on=["twin_run", "step"])
              .group_by("run").agg(common_eval_steps=pl.len(),
                                   max_abs_val_diff=(pl.col("val_loss")
                                                     - pl.col("twin_val_loss")).abs().max())
              .collect())
    return (pairs.join(curves, on="run", how="left")
            .with_columns(final_loss_diff=pl.col("final_val_loss") - pl.col("twin_final_val_loss"))
            .drop("identity").sort("depth", "arm", "lr", "seed"))


def provenance(runs: Runs) -> pl.DataFrame:
    """Distinct (framework, commit, versions, hardware) combinations with their run counts."""
    rows = []
    for m in runs.manifests.values():
        versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
        rows.append({
            "framework": str(m.get("framework", "?")),
            "git_commit": str(m.get("git_commit") or "unknown")[:12],
            "git_dirty": str(m.get("git_dirty")),
            "versions": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v),
            "platform": str(m.get("platform", "?")),
            "chip": str(m.get("chip", "?")),
            "device": str(m.get("device", "?")),
            "blas": str(m.get("blas", "?")),
            "data_meta_sha256": str(m.get("data_meta_sha256") or "?")[:12],
        })
    if not rows:
        return pl.DataFrame()
    keys = list(rows[0])
    return pl.DataFrame(rows).group_by(keys).agg(runs=pl.len()).sort("runs", descending=True)


def analysis_environment() -> dict[str, str]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "?"

    try:
        git = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], check=False,
                             capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent)
        commit = git.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "analysis git commit": commit or "unknown", "python": platform.python_version(),
            "polars": version("polars"), "altair": version("altair"),
            "vl-convert-python": version("vl-convert-python"),
            "vega-lite": vlc.get_vegalite_versions()[-1], "machine": platform.platform()}


# --- charts -----------------------------------------------------------------------------------

CHARTS = {
    "headline": "The answer at a glance: per depth, the seed-mean final-loss gap off minus on with "
                "its 95% t-interval over seeds at every LR with a paired test, coloured by the "
                "cell's decision (family-adjusted; docs/report.md); the necessity threshold "
                "(black rule) with its 95% bootstrap interval (grey band); the LR where off "
                "first diverges (dashed orange). Above 0 means QK-norm off is worse.",
    "loss_vs_lr": "Final validation loss against learning rate, one panel per depth. The line is "
                  "the seed mean of the clipped loss (a diverged run counts as its initial loss), "
                  "the band spans the seeds, crosses mark diverged runs and open diamonds runs of "
                  "another framework; one colour per arm. Where the off curve rises above "
                  "an arm's curve is where that control starts to matter.",
    "training_curves": "Train loss (binned) and validation loss against step for a few learning "
                       "rates per depth: by default the off arm's optimal, max stable and first "
                       "divergent LR. One line per seed and framework; each panel has its own "
                       "step axis. The loss axis ends a little above the initial loss: a "
                       "triangle on the top edge marks where a run's loss leaves it, a cross "
                       "where a diverged run stopped.",
    "max_attention_logit": "The largest pre-softmax attention logit (over heads and layers) on a "
                           "fixed probe batch, before any soft-cap, seed mean, log scale, one "
                           "row per arm. Logit growth without QK-norm is the instability "
                           "QK-norm removes (Dehghani et al. 2023; Wortsman et al. 2023).",
    "attention_entropy": "Attention entropy on the probe batch: mean over heads and layers "
                         "(solid) and the lowest head (dashed). Entropy collapse towards 0 "
                         "goes with logit growth (Zhai et al. 2023).",
    "other_probes": "Further probes found in the runs (by default residual kurtosis, "
                    "output log-sum-exp (what z-loss pulls towards 0), the soft-capped max "
                    "attention logit, max |activation| / rms, output logit max, q and k rms "
                    "when present; dashes tell the arms apart; "
                    "--probes chooses), reduced over layers (the whole-model value where there "
                    "is one, else max for peaks and outlier measures, min for minima, mean "
                    "otherwise), seed mean. Every probe's final value is in the runs table.",
    "gap_map": "Seed-mean final-loss gap, off minus the compared arm (one row per arm), for "
               "every LR run in both arms at each depth: red means off is worse, blue that "
               "it is better. Grey cells (labelled with their n) had fewer than 2 paired "
               "seeds, so the paired test could not run and the colour would say nothing "
               "about seed noise. Triangles: off worse (family-adjusted paired test, gap at "
               "least min_gap); dashes: no difference (equivalence test within min_gap). Crosses: "
               "off diverged; circles: the compared arm diverged; squares: both. The black "
               "bar is the necessity threshold of that depth (from there on the seed-mean gap "
               "is at least min_gap at every larger informative LR).",
    "lr_sensitivity": "LR sensitivity (Wortsman et al. 2023) per depth: dots are seeds, the "
                      "line joins seed means. Lower means the final loss depends less on the "
                      "learning rate over the base grid.",
    "lr_landmarks": "Optimal LR (circles) and max stable LR (triangles; open when no run "
                    "diverged, so only a lower bound) per arm with the range over seeds, and "
                    "the necessity threshold (diamonds) with its 95% bootstrap interval (a "
                    "censored threshold has no diamond).",
}


def build_charts(study: Study, options: ReportOptions) -> dict[str, alt.TopLevelMixin]:
    runs = study.runs
    points = study.points
    shown = pl.concat([points, study.others])
    probes = study.probe_steps.join(points.select("run"), on="run")
    found = sorted(probes["name"].unique().to_list())
    wanted = [n for n in options.probe_names if n in found] or C.other_probe_names(found)
    picks = C.curve_runs(points, study.arms, list(options.curve_lrs) or None, study.others)
    out = {
        "headline": C.headline_chart(study.gaps, study.thresholds, study.arms),
        "loss_vs_lr": C.loss_vs_lr_chart(points, study.others),
        "training_curves": C.training_curves_chart(shown, runs.metrics, picks),
        "max_attention_logit": C.max_logit_chart(points, probes),
        "attention_entropy": C.entropy_chart(points, probes),
        "gap_map": C.gap_map_chart(study.gaps, study.thresholds),
        "lr_sensitivity": C.sensitivity_chart(points),
        "lr_landmarks": C.landmarks_chart(study.arms, study.thresholds),
    }
    if wanted:
        out["other_probes"] = C.other_probes_chart(points, probes, wanted)
    return {k: out[k] for k in CHARTS if k in out}


# --- HTML -------------------------------------------------------------------------------------

def _cell(value) -> str:
    if value is None:
        return '<td class="na">-</td>'
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, float):
        if math.isnan(value):
            return '<td class="na">nan</td>'
        text = f"{value:.4g}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")
        return f'<td class="num">{text}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def html_table(df: pl.DataFrame, columns: list[str] | None = None, max_rows: int = 2000) -> str:
    if df.is_empty():
        return '<p class="na">(none)</p>'
    columns = [c for c in (columns or df.columns) if c in df.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(_cell(r[c]) for c in columns) + "</tr>"
                     for r in df.head(max_rows).iter_rows(named=True))
    more = (f'<p class="na">{df.height - max_rows} more rows in the CSV/Parquet table</p>'
            if df.height > max_rows else "")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>\n{body}\n' \
           f'</tbody></table></div>{more}'


DEFINITIONS = """
<dl>
<dt>Clipped loss</dt><dd>min(final val loss, loss at initialisation); a diverged run counts as
its initial loss (Wortsman et al. 2023, arXiv:2309.14322, Sec. 2.2).</dd>
<dt>LR sensitivity</dt><dd>Wortsman et al. 2023, Sec. 2.2: the mean over the base LR grid of
the clipped loss minus the best loss on the grid, per seed, then averaged over seeds. The base
grid of a depth is the set of LRs run for every (arm, seed) pair at that depth (or the runs
not marked <code>refine</code>, when such a marker exists); refinement LRs are left out so both
arms are scored on the same points.</dd>
<dt>Max stable LR</dt><dd>Per seed: the largest LR below the smallest diverged LR, using every
LR run (refinement points included); with no divergence it is the largest LR run and only a
lower bound (censored); when every LR diverged it is below the smallest LR run, which is kept
as an upper bound (below_grid). Reported as the geometric mean over seeds with the seed
range.</dd>
<dt>Optimal LR, best loss</dt><dd>Per seed, the LR with the lowest final val loss and that
loss; geometric mean of the LRs and mean of the losses over seeds.</dd>
<dt>Degraded run</dt><dd>A run that did not diverge but whose final loss is above the
training data's unigram entropy minus degraded_margin: it learned token frequencies and little
more. A (depth, LR) cell where every run of both arms diverged or degraded is uninformative and
is not tested.</dd>
<dt>Paired tests</dt><dd>One seed shares its initial weights and batches across arms and LRs,
so arms are compared seed by seed. Every gap is shown with its two-sided 95% t-interval over
seeds. Each cell has three claims fixed in advance: off worse (one-sided t-test), on worse
(one-sided t-test) and no difference (TOST against +-min_gap). Each hypothesis is one family
of tests, adjusted by Benjamini-Hochberg (q-values); a claim needs q &lt; alpha, and a worse
arm also a mean gap of at least min_gap. "Undetermined": none of the three claims passed.</dd>
<dt>Necessity threshold</dt><dd>Per depth: from the largest informative LR down, the LRs whose
seed-mean gap is at least min_gap; the threshold is where the gap, linear in log LR, crosses
min_gap below the last of them. Its 95% interval comes from a parametric bootstrap over seeds
(each LR's mean gap drawn from its t distribution). A depth whose largest informative LR is
under min_gap is censored ("&gt; largest LR"), one needed at every LR is "&lt;= smallest LR":
a censored threshold is never a number.</dd>
<dt>Steps to threshold</dt><dd>The first evaluation step at which the val loss is at or below
the loss threshold of the run's depth (by default: the largest, over arms and seeds, of the
best run's val loss at mid-training, a level every arm reaches well before the end).</dd>
</dl>
"""


MEASURED_HELP = ("measured: in how many of a hypothesis's parts (one per depth, and for H2 "
                 "its two measures per depth) the data decided for or against, out of the "
                 "parts in total, and in brackets how many parts had the data at all (enough "
                 "paired seeds and runs in both arms). \"2 of 3 depths decided (3 had the data)"
                 "\": every depth could be judged, at 2 the result was decided, at 1 it was "
                 "undecided.")


def _verdict_rows(verdicts: pl.DataFrame) -> list[dict[str, str]]:
    """The verdict table's rows for the template (text is escaped there)."""
    return [{**r, "css": "verdict-" + r["verdict"].split(" (")[0].replace(" ", "-"),
             "arm": M.arm_words(r["on_kind"])}
            for r in verdicts.iter_rows(named=True)]


def _script_json(obj) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


def _templates() -> jinja2.Environment:
    """The report's templates (analysis/templates), HTML-escaped unless marked safe."""
    return jinja2.Environment(loader=jinja2.PackageLoader("analysis", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True)


# Columns of the runs table the HTML leaves out (every one is in tables/runs.*): run_id repeats
# the run's folder name, which `run` already shows.
HIDDEN_RUN_COLUMNS = ("identity", "setting", "run_dir", "run_id")


def render_html(study: Study, specs: dict[str, dict], options: ReportOptions) -> str:
    runs, t = study.runs, study.runs.table
    env = analysis_environment()
    o = options.study
    threshold_text = (f"{options.loss_threshold:g} for every depth" if options.loss_threshold
                      is not None else "per depth, the largest mid-training loss of the arms' "
                      "best runs")
    per_seed = study.sensitivity_per_seed.join(study.stable_per_seed, how="full", coalesce=True,
                                               on=["depth", "arm", "seed"])
    arm_cols = ["depth", "arm", "runs", "seeds", "lrs", "diverged", "grid_points",
                "grid_lr_min", "grid_lr_max", "lr_sensitivity", "lr_sensitivity_lo",
                "lr_sensitivity_hi", "sensitivity_seeds", "max_stable_lr", "max_stable_lr_lo",
                "max_stable_lr_hi", "censored_seeds", "below_grid_seeds", "first_divergent_lr",
                "optimal_lr", "optimal_lr_lo", "optimal_lr_hi", "best_loss", "best_loss_lo",
                "best_loss_hi", "nonfinite_final"]
    # the HTML shows the attention and kurtosis probes; every final_<probe> is in the files
    shown_probes = [f"final_{n}" for n in C.ATTENTION_PROBES] + [
        c for c in study.per_run.columns if c.startswith("final_") and "kurtosis" in c]
    run_cols = [c for c in study.per_run.columns if c not in HIDDEN_RUN_COLUMNS
                and (not c.startswith("final_") or c in shown_probes
                     or c in ("final_val_loss", "final_val_ppl", "final_train_loss"))]
    safe = markupsafe.Markup
    return _templates().get_template("report.html.j2").render(
        env=env, root=str(runs.root), n_runs=t.height,
        status=", ".join(f"{n} {s}" for s, n in t["status"].value_counts(sort=True).iter_rows()),
        n_points=study.points.height, framework=study.framework,
        depths=", ".join(str(d) for d in sorted(study.points["depth"].unique())),
        n_seeds=study.points["seed"].n_unique(), alpha=f"{o.alpha:g}", min_gap=f"{o.min_gap:g}",
        threshold_text=threshold_text, notes=study.notes, warnings=runs.warnings,
        verdicts=_verdict_rows(study.verdicts), measured_help=MEASURED_HELP,
        arms_table=safe(html_table(study.arms, arm_cols)),
        per_seed_table=safe(html_table(per_seed)),
        necessity_table=safe(html_table(study.thresholds)),
        best_table=safe(html_table(study.best_gaps)),
        h2_table=safe(html_table(study.h2_tests)), h3_table=safe(html_table(study.h3_tests)),
        degraded_margin=f"{o.degraded_margin:g}", lr_ratio_margin=f"{o.lr_ratio_margin:g}",
        threshold_margin=f"{o.threshold_margin:g}",
        figures=[(name, CHARTS[name]) for name in specs if name != "headline"],
        headline_caption=CHARTS["headline"], sentences=headline(study),
        gaps_table=safe(html_table(study.gaps)), twins_table=safe(html_table(study.twins)),
        spikes_table=safe(html_table(study.spikes)),
        runs_table=safe(html_table(study.per_run, run_cols)),
        provenance_table=safe(html_table(provenance(runs))),
        definitions=safe(DEFINITIONS), specs_json=safe(_script_json(specs)),
        javascript_bundle=safe(vlc.javascript_bundle()))


def _lr_list(lrs: list[float]) -> str:
    lrs = sorted(lrs)
    return f"{lrs[0]:.3g}" if len(lrs) == 1 else f"{lrs[0]:.3g}-{lrs[-1]:.3g}"


def headline(study: Study) -> list[str]:
    """Three to five plain sentences of the answer, generated from the verdicts and their
    numbers (each claim with error control, each "no difference" from the equivalence test)."""
    gaps, th = study.gaps, study.thresholds
    out = []
    for on in M.on_kinds(study.points):
        g = gaps.filter(pl.col("on_kind") == on)
        who = f"QK-norm ({on})" if on in M.QK_NORM_KINDS else M.arm_words(on)
        worse, calm = [], []
        for d in sorted(g["depth"].unique().to_list()):
            cells = g.filter(pl.col("depth") == d)
            w = cells.filter(pl.col("decision") == M.OFF_WORSE)
            if w.height:
                worse.append(f"at LR {_lr_list(w['lr'].to_list())} at depth {d} "
                             f"({w['mean_gap'].min():.2f}-{w['mean_gap'].max():.2f} nats)")
            c = cells.filter(pl.col("decision") == M.NO_DIFFERENCE)
            if c.height:
                calm.append(f"LR {_lr_list(c['lr'].to_list())} at depth {d}")
        out.append((f"Without {who} the final loss is worse, with error control, "
                    + "; ".join(worse) + ".") if worse else
                   f"No LR shows {who} off worse with error control.")
        out.append(("No difference within the margin (equivalence test) at "
                    + "; ".join(calm) + ".") if calm else
                   "No LR passes the equivalence test: \"no difference\" is shown nowhere.")
        t = th.filter(pl.col("on_kind") == on).filter(pl.col("threshold").is_not_null())
        if t.height:
            out.append("The necessity threshold (95% interval) is "
                       + ", ".join(f"{r['threshold']} at depth {r['depth']}"
                                   for r in t.iter_rows(named=True)) + ".")
        v = study.verdicts.filter(pl.col("on_kind") == on)
        out.append("Verdicts: " + "; ".join(
            f"{r['hypothesis']} {r['verdict']} ({r['family_size']} tests, n={r['seeds']})"
            for r in v.iter_rows(named=True)) + ".")
    p = study.per_run
    params = p["params_total"].drop_nulls() if "params_total" in p.columns else pl.Series([])
    tokens = p["tokens_seen"].drop_nulls().max() if "tokens_seen" in p.columns else None
    data = json.loads(study.setting).get("data", "?") if study.setting else "?"
    if params.len() and tokens:
        out.append(f"Scale: {params.min() / 1e6:.2f}-{params.max() / 1e6:.2f}M parameters, at "
                   f"most {tokens / 1e6:.2g}M tokens a run, on {data}: this says nothing "
                   f"directly about larger models, longer training or other corpora.")
    return out


# --- writing ----------------------------------------------------------------------------------

def write_table(df: pl.DataFrame, folder: Path, name: str) -> None:
    df.write_parquet(folder / f"{name}.parquet")
    df.write_csv(folder / f"{name}.csv")


def _check_out(out: Path) -> None:
    """Refuse to replace anything but an earlier report (or an empty folder)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / "report.html").exists())):
        raise UsageError(f"{out} exists and is not a report folder; choose another --out")


def _prepare_out(out: Path) -> Path:
    """A fresh temporary sibling of `out` to write into."""
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace `out` by the finished `tmp`: readers see the old report or the new one."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _failed_only(runs: Runs, out: Path) -> Path:
    """The report of a folder where no run finished: it says so and lists every failed run with
    its error line (and the runs table), instead of metrics that cannot exist."""
    tmp = _prepare_out(out)
    try:
        (tmp / "tables").mkdir()
        write_table(runs.table, tmp / "tables", "runs")
        items = "".join(f"<li>{html.escape(w)}</li>" for w in runs.warnings)
        (tmp / "report.html").write_text(
            "<!doctype html><html><head><meta charset='utf-8'><title>QK-norm study: no finished "
            f"runs</title></head><body><h1>No finished runs</h1><p>All {runs.table.height} runs "
            f"under <code>{html.escape(str(runs.root))}</code> failed, so there are no study "
            "metrics, charts or verdicts. Each failed run keeps its traceback.txt; the next "
            f"sweep retries it.</p><ul>{items}</ul></body></html>\n")
        (tmp / "warnings.txt").write_text("".join(w + "\n" for w in runs.warnings))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, out)
    return out / "report.html"


def build_report(runs_dir: str | Path, out: str | Path,
                 options: ReportOptions = ReportOptions()) -> tuple[Path, Study | None]:
    """Load, analyse, draw and write everything; returns the report.html path and the study
    (None when no run finished: the page then lists the failed runs)."""
    out = Path(out)
    _check_out(out)
    runs = load_runs(runs_dir)
    if runs.table.filter(pl.col("status").is_in(FINISHED)).is_empty():
        return _failed_only(runs, out), None
    print(f"building the report of {runs.table.height} runs in {out} (tables, charts, page) ...",
          file=sys.stderr, flush=True)
    study = analyse(runs, options)
    tmp = _prepare_out(out)
    try:
        tables = tmp / "tables"
        tables.mkdir()
        write_table(study.per_run, tables, "runs")
        write_table(study.arms, tables, "arms")
        write_table(study.sensitivity_per_seed, tables, "lr_sensitivity_per_seed")
        write_table(study.stable_per_seed, tables, "max_stable_lr_per_seed")
        write_table(study.gaps, tables, "gaps")
        write_table(study.thresholds, tables, "necessity")
        write_table(study.spikes, tables, "spikes")
        write_table(study.verdicts, tables, "verdicts")
        write_table(study.best_gaps, tables, "h1_best_loss")
        write_table(study.h2_tests, tables, "h2_tests")
        write_table(study.h3_tests, tables, "h3_tests")
        write_table(study.twins, tables, "twins")
        specs = {}
        for name, chart in build_charts(study, options).items():
            specs[name] = chart.to_dict()
            C.save_chart(specs[name], tmp / "charts", name, scale=options.png_scale)
        (tmp / "report.html").write_text(render_html(study, specs, options))
        (tmp / "warnings.txt").write_text("".join(w + "\n" for w in runs.warnings))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, out)
    return out / "report.html", study
