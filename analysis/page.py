"""The report page: report.html rendered from analysis/templates with jinja2, its HTML tables,
the provenance of the runs and of the analysis, the drill-down data and the linked views."""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
from pathlib import Path

import jinja2
import markupsafe
import polars as pl
import vl_convert as vlc

from qkstudy import provenance
from qkstudy.run_folder import RunFolder

from . import charts as C
from . import metrics as M
from .compare import Comparison
from .load import Runs
from .prose import CHARTS, headline
from .study import ReportOptions, Study


TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("analysis", "templates"),
                               autoescape=True, undefined=jinja2.StrictUndefined,
                               keep_trailing_newline=True)

# Every chart reads two signals the page's script sets: arms_shown (arm labels, null: all) and
# depths_shown (null: all). In a chart's own HTML file they stay null.

ARMS, DEPTHS = "arms_shown", "depths_shown"


def link(name: str, spec: dict) -> dict:
    """`spec` with the page's signals and one filter that reads them."""
    if name not in CHARTS or "data" not in spec:
        return spec
    if name == "headline":  # rows of off minus an arm: all of them when off is chosen
        arm = (f"!{ARMS} || indexof({ARMS}, '{C.OFF_LABEL}') >= 0 || !datum.compared"
               f" || indexof({ARMS}, slice(datum.compared, {len('off minus ')})) >= 0")
    else:  # a landmark's onset row is no arm's: it stays
        arm = (f"!{ARMS} || !datum.arm || indexof({ARMS}, datum.arm) >= 0"
               f" || indexof(datum.arm, 'onset') == 0")
    depth = f"!{DEPTHS} || datum.depth == null || indexof({DEPTHS}, datum.depth) >= 0"
    return {**spec, "params": [*spec.get("params", []),
                               *({"name": n, "value": None} for n in (ARMS, DEPTHS))],
            "transform": [{"filter": f"({arm}) && ({depth})"}, *spec.get("transform", [])]}


MAX_POINTS = 40  # per run and curve: a curve's shape, small enough for a 300-run page
SHOWN = ("run", "depth", "lr", "seed", "status", "final_val_loss", "diverged_step", "framework")


def _binned(frame: pl.LazyFrame, value: str) -> dict[str, list[list[float]]]:
    """{run: [[step, value], ...]}: at most MAX_POINTS bin means per run."""
    frame = frame.filter(pl.col(value).is_not_null()).select("run", "step", value).collect()
    binned = (frame.with_columns(
                  bin=pl.col("step") // (pl.col("step").max().over("run") // MAX_POINTS + 1))
              .group_by("run", "bin").agg(step=pl.col("step").max(), v=pl.col(value).mean())
              .filter(pl.col("v").is_finite()).sort("run", "step"))
    out: dict[str, list[list[float]]] = {}
    for run, step, v in binned.select("run", "step", "v").iter_rows():
        out.setdefault(run, []).append([step, round(v, 5)])
    return out


def run_details(study: Study) -> dict:
    """Each shown run's row, binned curves and own config keys; the keys all share."""
    shown = pl.concat([study.points, study.others], how="diagonal_relaxed")
    table = study.runs.table.join(shown.select("run"), on="run")
    names = table["run"].to_list()
    metrics = study.runs.metrics.filter(pl.col("run").is_in(names))
    train, val = _binned(metrics, "train_loss"), _binned(metrics, "val_loss")
    logit = _binned(study.probe_steps.lazy().filter((pl.col("name") == "max_attention_logit")
                                                    & pl.col("run").is_in(names)), "value")
    configs = {}
    for row in table.iter_rows(named=True):
        run_dir = row.get("run_dir")
        config = RunFolder(Path(run_dir)).read_config() if run_dir else None
        configs[row["run"]] = config if isinstance(config, dict) else {}
    keys = sorted({k for c in configs.values() for k in c})
    common = {k: configs[names[0]].get(k) for k in keys
              if names and len({repr(c.get(k)) for c in configs.values()}) == 1}
    runs = {}
    for row in table.iter_rows(named=True):
        run = row["run"]
        runs[run] = {**{k: row.get(k) for k in SHOWN}, "arm": M.arm_words(row[M.ARM]),
                     "config": {k: v for k, v in configs[run].items() if k not in common},
                     "train": train.get(run, []), "val": val.get(run, []),
                     "logit": logit.get(run, [])}
    return {"runs": runs, "common": common}


def _cell(column: str, value) -> tuple[str, str, str]:
    """A table cell's css class, tooltip and text; a run id without its hash (whole in the tooltip)."""
    if value is None:
        return "na", "", "-"
    if isinstance(value, bool):
        return "", "", "yes" if value else "no"
    if isinstance(value, float):  # nan, inf and -inf as Python writes them
        return "na" if math.isnan(value) else "num", "", f"{value:.4g}"
    if isinstance(value, int):
        return "num", "", str(value)
    if column == "run" and isinstance(value, str):
        return "id", value, value.rsplit("-", 1)[0] if value.count("-") >= 2 else value
    return "", "", str(value)


MAX_ROWS = 2000  # a table's rows on the page; the CSV and Parquet tables have every row


def data_table(df: pl.DataFrame, columns: list[str] | None = None, first: tuple[str, ...] = (),
               name: str = "") -> dict:
    """What the template's sortable data_table draws: the columns (with `name`, a filter box, the
    `first` lead and the others behind a toggle), the cells of the first MAX_ROWS rows."""
    columns = [c for c in (columns or df.columns) if c in df.columns]
    lead = [c for c in first if c in columns] if name else []
    columns = lead + [c for c in columns if c not in lead]
    return {"columns": columns, "name": name,
            "lead": len(lead) if len(columns) > len(lead) else 0, "more": df.height - MAX_ROWS,
            "rows": [[_cell(c, r[c]) for c in columns]
                     for r in df.head(MAX_ROWS).iter_rows(named=True)]}


def _script_json(obj) -> str:
    return json.dumps(obj).replace("</", "<\\/").replace("<!--", "<\\!--")


# the runs table's columns the HTML leaves out (tables/runs.* has them)
HIDDEN_RUN_COLUMNS = ("identity", "setting", "run_dir", "run_id")
# the runs table's columns shown before "show all columns"
RUN_COLUMNS_FIRST = ("run", "depth", "arm", "lr", "seed", "framework", "status",
                     "final_val_loss", "final_train_loss", "diverged_step", "steps",
                     "peak_max_attention_logit", "final_attention_entropy_min_head",
                     "final_residual_kurtosis", "loss_spikes", "tokens_per_second", "in_study")

# the arms table's columns in the HTML
ARM_COLUMNS = ("depth", "arm", "runs", "seeds", "lrs", "diverged", "grid_points", "grid_lr_min",
               "grid_lr_max", "lr_sensitivity", "lr_sensitivity_lo", "lr_sensitivity_hi",
               "sensitivity_seeds", "max_usable_lr", "max_usable_lr_lo", "max_usable_lr_hi",
               "lower_bound_seeds", "first_divergent_lr", "optimal_lr", "optimal_lr_lo",
               "optimal_lr_hi", "best_loss", "best_loss_lo", "best_loss_hi", "nonfinite_final")


def run_provenance(runs: Runs) -> pl.DataFrame:
    """Distinct (framework, commit, versions, hardware) combinations with their run counts."""
    rows = []
    for m in runs.manifests.values():
        versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
        rows.append({
            "framework": str(m.get("framework", "?")),
            "git_commit": str(m.get("git_commit") or "unknown")[:12],
            "git_dirty": str(m.get("git_dirty")),
            "versions": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v),
            **{k: str(m.get(k, "?")) for k in ("platform", "chip", "device", "blas")},
            "data_meta_sha256": str(m.get("data_meta_sha256") or "?")[:12]})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows).group_by(pl.all()).len("runs").sort("runs", descending=True)


def analysis_environment() -> dict[str, str]:
    """The page's own provenance: when, from which commit and with which libraries."""
    code = provenance.provenance()
    commit = (code["git_commit"] or "unknown")[:12]
    if code["git_dirty"]:
        commit += " (with local changes)"
    versions = provenance.versions("polars", "altair", "vl-convert-python")
    return {"generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "analysis git commit": commit, **{k: v or "?" for k, v in versions.items()},
            "vega-lite": vlc.get_vegalite_versions()[-1], "machine": platform.platform()}


def render_html(study: Study, specs: dict[str, dict], options: ReportOptions,
                comparison: Comparison | None = None) -> str:
    runs, t = study.runs, study.runs.table
    env = analysis_environment()
    o = options.study
    threshold_text = (f"{options.loss_threshold:g} for every depth" if options.loss_threshold
                      is not None else "per depth, the largest mid-training loss of the arms' "
                      "best runs")
    per_seed = study.sensitivity_per_seed.join(study.usable_per_seed, how="full", coalesce=True,
                                               on=["depth", "arm", "seed"])
    # the HTML shows the attention and kurtosis probes; every final_<probe> is in the files
    shown_probes = [f"final_{n}" for n in C.ATTENTION_PROBES] + [
        c for c in study.per_run.columns if c.startswith("final_") and "kurtosis" in c]
    run_cols = [c for c in study.per_run.columns if c not in HIDDEN_RUN_COLUMNS
                and (not c.startswith("final_") or c in shown_probes
                     or c in ("final_val_loss", "final_val_ppl", "final_train_loss"))]
    safe = markupsafe.Markup
    return TEMPLATES.get_template("report.html.j2").render(
        env=env, root=str(runs.root), n_runs=t.height,
        status=", ".join(f"{n} {s}" for s, n in t["status"].value_counts(sort=True).iter_rows()),
        n_points=study.points.height, framework=study.framework,
        depths=", ".join(str(d) for d in sorted(study.points["depth"].unique())),
        n_seeds=study.points["seed"].n_unique(), **{k: f"{getattr(o, k):g}" for k in (
            "alpha", "min_gap", "threshold_widening", "degraded_margin", "lr_ratio_margin",
            "slope_margin")},
        threshold_text=threshold_text, notes=study.notes, warnings=runs.warnings,
        verdicts=[{**r, "css": "verdict-" + r["verdict"].split(" (")[0].replace(" ", "-"),
                   "arm": M.arm_words(r["compared_arm"])}
                  for r in study.verdicts.iter_rows(named=True)],
        arms_table=data_table(study.arms, list(ARM_COLUMNS)),
        **{f"{k}_table": data_table(v) for k, v in (
            ("per_seed", per_seed), ("onset", study.thresholds), ("best", study.best_gaps),
            ("h2", study.h2_tests), ("h3", study.h3_tests), ("gaps", study.gaps),
            ("twins", study.twins), ("spikes", study.spikes),
            ("provenance", run_provenance(runs)))},
        figures=[(name, CHARTS[name]) for name in specs if name in CHARTS and name != "headline"],
        headline_caption=CHARTS["headline"], sentences=headline(study),
        comparison=comparison and {
            "a": comparison.a, "b": comparison.b, "sentences": comparison.sentences,
            **{name: data_table(getattr(comparison, name))
               for name in ("gaps", "onsets", "verdicts")}},
        runs_table=data_table(study.per_run, run_cols, RUN_COLUMNS_FIRST, "runs-table"),
        specs_json=safe(_script_json(specs)),
        details_json=safe(_script_json(run_details(study))),
        links_json=safe(_script_json({
            "arms": [M.arm_words(a) for a in sorted(study.points[M.ARM].unique().to_list(),
                                                    key=lambda k: (k != M.OFF, k))],
            "depths": sorted(study.points["depth"].unique().to_list()),
            "signals": {"arms": ARMS, "depths": DEPTHS}})),
        javascript_bundle=safe(vlc.javascript_bundle()))


def failed_page(runs: Runs) -> str:
    """The page of a folder where no run finished: every failed run with its error line."""
    return TEMPLATES.get_template("failed.html.j2").render(
        n_runs=runs.table.height, root=str(runs.root), warnings=runs.warnings)
