"""Explore a runs folder in a marimo notebook (docs/analysis.md): `just explore runs/mini`, or
`marimo edit analysis/explore.py -- runs/mini`; `python analysis/explore.py -- runs/mini` runs
it headless. The runs folder (default runs/demo) comes after `--`; every number comes from
`analysis.load_study`, the report's own.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="QK-norm study explorer")


@app.cell(hide_code=True)
def _(mo, runs_dir, study):
    # the answer first: the verdicts, then what was left out and why
    _notes = [*study.notes, *study.runs.warnings]
    _verdicts = study.verdicts.select(
        "hypothesis", "compared_arm", "verdict", "measured", "seeds", "family_size", "correction",
        "claim", "evidence")
    mo.vstack([
        mo.md(f"# QK-norm study: `{runs_dir}`\n\n"
              f"{study.points.height} runs in the study metrics ({study.framework}); "
              "verdicts as in the report (docs/report.md)."),
        mo.ui.table(_verdicts, selection=None, pagination=False, show_column_summaries=False,
                    wrapped_columns=["verdict", "measured"],
                    label="Verdicts"),
        mo.accordion({f"Notes and skipped runs ({len(_notes)})":
                      mo.md("\n".join(f"- {n}" for n in _notes) or "none")}),
    ])
    return


@app.cell
def _():
    import sys
    from pathlib import Path

    import marimo as mo
    import polars as pl

    from analysis import charts as C
    from analysis import plots as P
    from analysis.metrics import arm_words
    from analysis.study import load_study
    from qkstudy.errors import UsageError

    return C, P, Path, UsageError, arm_words, load_study, mo, pl, sys


@app.cell
def _(Path, UsageError, load_study, mo, sys):
    _bare = [a for a in sys.argv[1:] if a != "--" and not a.startswith("-")]
    _default = (mo.notebook_dir() or Path("analysis")).parent / "runs" / "demo"
    runs_dir = Path(_bare[0] if _bare else _default)
    try:
        study = load_study(runs_dir)
    except UsageError as _e:
        if not mo.running_in_notebook():
            sys.exit(f"error: {_e}")  # headless: a bad folder fails the run, in one line
        mo.stop(True, mo.callout(mo.md(f"**error:** {_e}"), kind="danger"))
    return runs_dir, study


@app.cell
def _(C, arm_words, mo, study):
    # every depth, arm and LR by default: the largest gap may sit at any LR
    _depths = sorted(study.points["depth"].unique().to_list())
    _arms = sorted(study.points["arm"].unique().to_list(), key=lambda a: (a != "none", a))
    _lrs = sorted(study.points["lr"].unique().to_list())
    _probes = sorted(study.probe_steps["name"].unique().to_list())
    _probe = next((p for p in C.ATTENTION_PROBES if p in _probes), _probes[0] if _probes else None)
    depth_pick = mo.ui.multiselect({str(d): d for d in _depths}, value=[str(d) for d in _depths],
                                   label="depth")
    arm_pick = mo.ui.multiselect({arm_words(a): a for a in _arms},
                                 value=[arm_words(a) for a in _arms], label="arms")
    lr_pick = mo.ui.multiselect({f"{lr:g}": lr for lr in _lrs},
                                value=[f"{lr:g}" for lr in _lrs], label="learning rates")
    probe_pick = mo.ui.dropdown({C.probe_words(p) + f" ({p})": p for p in _probes},
                                value=C.probe_words(_probe) + f" ({_probe})" if _probe else None,
                                label="probe", searchable=True)
    # a max logit grows by orders of magnitude: on a linear axis the small ones are a flat line
    log_y = mo.ui.checkbox(value=True, label="probe on a log axis")
    mo.vstack([mo.md("## Pick a slice"),
               mo.hstack([depth_pick, arm_pick, lr_pick, probe_pick, log_y], justify="start",
                         wrap=True)])
    return arm_pick, depth_pick, log_y, lr_pick, probe_pick


@app.cell
def _(arm_pick, depth_pick, lr_pick, pl, study):
    picked = (pl.col("depth").is_in(depth_pick.value) & pl.col("lr").is_in(lr_pick.value))
    picked_runs = study.points.filter(picked & pl.col("arm").is_in(arm_pick.value))
    picked_gaps = study.gaps.filter(picked & pl.col("compared_arm").is_in(arm_pick.value))
    return picked_gaps, picked_runs


@app.cell(hide_code=True)
def _(C, mo, pl, picked_gaps, study):
    _cols = ["depth", "compared_arm", "lr", "pairs", "mean_gap", "ci_lo", "ci_hi", "p_off_worse",
             "q_off_worse", "q_equivalent", "family_size", "decision", "seed_gaps"]
    _depths = picked_gaps["depth"].unique()
    _thresholds = study.thresholds.filter(pl.col("depth").is_in(_depths.implode()))
    mo.vstack([
        mo.md("## Off minus on: the paired final-loss gap (nats; > 0: QK-norm off is worse)"),
        C.headline_chart(picked_gaps, _thresholds, study.arms),
        mo.ui.table(picked_gaps.select(_cols), selection=None, show_column_summaries=False,
                    format_mapping={**{c: "{:+.3f}" for c in ("mean_gap", "ci_lo", "ci_hi")},
                                    **{c: "{:.2g}" for c in _cols if c[:2] in ("p_", "q_")}},
                    label="Gap table, filtered to the selection"),
        mo.ui.table(_thresholds.select("depth", "compared_arm", "onset", "onset_lr", "ci_lo",
                                       "ci_hi", "outside", "tested_rule"),
                    selection=None, show_column_summaries=False,
                    format_mapping={c: "{:.3g}" for c in ("onset_lr", "ci_lo", "ci_hi")},
                    label="The onset and the tested rule of the selected depths"),
    ])
    return


@app.cell(hide_code=True)
def _(P, mo, picked_runs, study):
    # the report's charts over the selection: every picked LR, one line per run
    _picks = picked_runs.select("depth", "lr").unique()
    mo.vstack([mo.md("## Training curves"),
               P.training_curves_chart(picked_runs, study.runs.metrics, _picks)])
    return


@app.cell(hide_code=True)
def _(C, P, log_y, mo, picked_runs, probe_pick, study):
    _probe = probe_pick.value
    mo.vstack([mo.md("## Probe curves"), mo.md("_these runs logged no probes_") if not _probe
               else P.probe_chart(picked_runs, study.probe_steps, [_probe],
                                  f"{C.probe_words(_probe)} against step (reduced over layers "
                                  "as in the report, seed mean)", log=log_y.value)])
    return


if __name__ == "__main__":
    app.run()
