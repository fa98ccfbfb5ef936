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

    import altair as alt
    import marimo as mo
    import polars as pl

    from analysis import charts as C
    from analysis import plots as P
    from analysis.metrics import arm_words
    from analysis.study import load_study, probe_curves, training_curves
    from qkstudy.errors import UsageError

    return (C, P, Path, UsageError, alt, arm_words, load_study, mo, pl, probe_curves, sys,
            training_curves)


@app.cell
def _(Path, mo, sys):
    _bare = [a for a in sys.argv[1:] if a != "--" and not a.startswith("-")]
    _default = (mo.notebook_dir() or Path("analysis")).parent / "runs" / "demo"
    runs_dir = Path(_bare[0] if _bare else _default)
    return (runs_dir,)


@app.cell
def _(UsageError, load_study, mo, runs_dir, sys):
    try:
        study = load_study(runs_dir)
    except UsageError as _e:
        if not mo.running_in_notebook():
            sys.exit(f"error: {_e}")  # headless: a bad folder fails the run, in one line
        mo.stop(True, mo.callout(mo.md(f"**error:** {_e}"), kind="danger"))
    return (study,)


@app.cell
def _(C, arm_words, mo, study):
    # every depth, arm and LR by default: the largest gap may sit at any LR
    _depths = sorted(study.points["depth"].unique().to_list())
    _arms = sorted(study.points["arm"].unique().to_list(),
                   key=lambda a: (a != "none", a))
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


@app.cell
def _(C, P, alt, picked_runs):
    def seed_lines(data, mark, y, title, **encoding):
        """One line per seed, coloured by arm, one panel per depth and LR."""
        data = P.with_lr_label(data).with_columns(C.arm_expr())
        lrs = [f"{v:.2e}" for v in sorted(data["lr"].unique().to_list())]
        color = alt.Color("arm:N", scale=C.arm_scale(picked_runs["arm"].to_list()), title="arm")
        return C.finish(
            alt.Chart(C.values(data)).mark_line(strokeWidth=1.2, opacity=0.8, **mark)
            .encode(x=alt.X("step:Q"), y=y, color=color, detail="seed:N", **encoding)
            .properties(width=180, height=150)
            .facet(row=alt.Row("depth:O", title="depth"),
                   column=alt.Column("lr_label:O", title="learning rate", sort=lrs))
            .resolve_scale(x="independent").properties(title=title))

    return (seed_lines,)


@app.cell(hide_code=True)
def _(alt, mo, picked_runs, pl, seed_lines, study, training_curves):
    def _chart():
        curves = training_curves(study).filter(pl.col("run").is_in(picked_runs["run"].implode()))
        if curves.is_empty():
            return mo.md("_no runs in the selection_")
        # train loss is logged every few steps: ~100 bin means per run keep the page light
        step = max(1, (curves["step"].max() or 0) // 100)
        keys = ["run", "depth", "arm", "lr", "seed"]
        train = (curves.filter(pl.col("train_loss").is_finite())
                 .group_by(*keys, (pl.col("step") // step * step).alias("step"))
                 .agg(loss=pl.col("train_loss").mean())
                 .with_columns(curve=pl.lit("train (binned)")))
        val = (curves.filter(pl.col("val_loss").is_finite())
               .select(*keys, "step", loss="val_loss").with_columns(curve=pl.lit("val")))
        data = pl.concat([train, val]).sort(*keys, "curve", "step")
        # as in the report, the axis ends a little above the initial loss
        top = (picked_runs["init_loss"].max() or data["loss"].max()) * 1.1
        return seed_lines(
            data, {"clip": True}, alt.Y("loss:Q", title="loss (nats)",
                                        scale=alt.Scale(zero=False, domainMax=top)),
            "Training curves: one line per seed",
            strokeDash=alt.StrokeDash("curve:N", title="curve"),
            tooltip=["arm:N", "lr:Q", "seed:Q", "curve:N", "step:Q",
                     alt.Tooltip("loss:Q", format=".3f")])

    mo.vstack([mo.md("## Training curves"), _chart()])
    return


@app.cell(hide_code=True)
def _(C, alt, log_y, mo, picked_runs, pl, probe_curves, probe_pick, seed_lines, study):
    def _chart():
        if probe_pick.value is None:
            return mo.md("_these runs logged no probes_")
        data = probe_curves(study, probe_pick.value).filter(
            pl.col("run").is_in(picked_runs["run"].implode()))
        if log_y.value:
            data = data.filter(pl.col("value") > 0)  # a log axis has no place for 0 or below
        if data.is_empty():
            return mo.md("_no probe values in the selection_")
        name = C.probe_words(probe_pick.value)
        scale = alt.Scale(type="log") if log_y.value else alt.Scale(zero=False)
        return seed_lines(
            data, {"point": True}, alt.Y("value:Q", title=name, scale=scale),
            f"{name} against step (reduced over layers as in the report), one line per seed",
            tooltip=["arm:N", "lr:Q", "seed:Q", "step:Q", alt.Tooltip("value:Q", format=".4g")])

    mo.vstack([mo.md("## Probe curves"), _chart()])
    return


if __name__ == "__main__":
    app.run()
