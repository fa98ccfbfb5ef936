"""The charts: each renders to a PNG of real size, panels fill the page, the headline and the
landmarks draw what the tables hold, and legends name every marker and arm in words."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis import charts as C
from analysis import hypotheses as H
from analysis import metrics as M
from analysis import plots as P
from tests.known_answers import GRID, gap_table, onset_sweep, thresholds, with_gaps
from tests.png import png_size


def test_charts_render_to_png_of_real_size(tmp_path):
    table = onset_sweep({2: 3e-2, 4: 3e-3})
    arms = M.arm_table(table)
    gaps, th = gap_table(table), thresholds(table)
    made = {"loss_vs_lr": C.loss_vs_lr_chart(table), "headline": C.headline_chart(gaps, th, arms),
            "lr_sensitivity": P.sensitivity_chart(table),
            "lr_landmarks": P.landmarks_chart(arms, th)}
    for name, chart in made.items():
        paths = C.save_chart(chart, tmp_path, name, scale=1.0)
        width, height = png_size(paths["png"])
        assert width >= 300 and height >= 150, (name, width, height)
        assert "<svg" in paths["svg"].read_text()[:500]
        assert "vegaEmbed" in paths["html"].read_text()
    # the headline's onset rule sits at the onset, its band is its interval
    rows = pl.DataFrame(made["headline"].to_dict()["data"]["values"], infer_schema_length=None)
    onset = rows.filter(pl.col("kind") == "onset").sort("depth")
    assert onset["lr"].to_list() == pytest.approx(th.sort("depth")["onset_lr"].to_list())
    assert onset["band_lo"].to_list() == pytest.approx(th.sort("depth")["ci_lo"].to_list())


def test_panels_fill_the_page_and_the_lr_axis_spans_every_lr():
    one, three = C.panel_width(1), C.panel_width(3)
    assert one >= 900 and 3 * three + 2 * C.SPACING + C.AXIS_W + C.LEGEND_W <= C.PAGE_W
    assert 3 * three >= 0.8 * one  # three panels take about the width one does
    assert C.panel_width(12) == C.PANEL_W  # never narrower: the page scales the chart instead
    x, scale = C.lr_x([3e-3, 1e-2, 0.0, 3.0])  # a zero LR has no place on a log axis
    assert scale.domain == pytest.approx([3e-3 / 1.3, 3.0 * 1.3])
    assert "values" not in x.to_dict()["axis"]  # Vega-Lite picks the ticks


def test_headline_spans_the_gaps_and_every_lr_run():
    """One wide interval does not flatten the gaps: the y axis spans the seed-mean gaps and the
    interval is cut at its edge with a triangle; an LR where neither arm learned is on the x
    axis, greyed and labelled; the divergence rule sits at its true LR."""
    table = with_gaps(onset_sweep({2: 3e-2}), 1e-3, [-4.0, 0.0, 4.0])
    both = (pl.col("lr") == 1e-1)  # every run of both arms diverges at the largest LR
    table = table.with_columns(status=pl.when(both).then(pl.lit("diverged"))
                               .otherwise("status"),
                               final_val_loss=pl.when(both).then(None)
                               .otherwise("final_val_loss"))
    arms, gaps, th = M.arm_table(table), gap_table(table), thresholds(table)
    assert gaps.filter(pl.col("lr") == 1e-1)["decision"].to_list() == [H.UNINFORMATIVE]
    spec = C.headline_chart(gaps, th, arms).to_dict()
    rows = pl.DataFrame(spec["data"]["values"], infer_schema_length=None)
    cells = rows.filter(pl.col("kind") == "cell").sort("lr")
    assert cells["lr"].to_list() == GRID  # every LR run, the uninformative one too
    top = max(la["encoding"]["y"]["scale"]["domain"][1] for la in spec["spec"]["layer"]
              if "scale" in la["encoding"].get("y", {}))
    assert top < 1.0  # the gaps (0 and 0.5 nats), not the +-10 nats of the wide interval
    cut = rows.filter(pl.col("kind") == "cut")
    assert sorted(cut["edge"].to_list()) == ["down", "up"] and set(cut["lr"]) == {1e-3}
    grey = cells.filter(~pl.col("tested"))
    assert grey["lr"].to_list() == [1e-1] and grey["outcome"].to_list() == [C.BOTH_DIVERGED]
    assert grey["y"].to_list() == [0.0]
    rule = rows.filter(pl.col("kind") == "divergence")
    assert rule["lr"].to_list() == pytest.approx([1e-1]) and rule["label"][0] == "off diverges"
    assert "a triangle marks an interval" in json.dumps(spec["title"])


def test_landmarks_draw_an_open_onset_interval_to_the_edge():
    table = onset_sweep({2: 3e-2})
    arms = M.arm_table(table)
    th = thresholds(table).with_columns(ci_hi=pl.lit(None, pl.Float64))
    spec = P.landmarks_chart(arms, th).to_dict()
    rows = pl.DataFrame(spec["data"]["values"], infer_schema_length=None)
    onset = rows.filter(pl.col("measure") == "onset").row(0, named=True)
    top = spec["layer"][0]["encoding"]["y"]["scale"]["domain"][1]
    assert onset["edge"] == "up" and onset["hi"] == top  # not cut at the onset
    usable = rows.filter(pl.col("measure") == "max usable LR")
    assert set(usable["arm"]) == {"QK-norm off", "QK-norm on (rmsnorm)"}
    assert any(la["mark"].get("shape") == "triangle-up" for la in spec["layer"])


def test_legends_name_every_marker_and_probes_read_as_words():
    table = onset_sweep({2: 3e-2})
    spec = C.loss_vs_lr_chart(table).to_dict()
    shapes = [la["encoding"]["shape"] for la in spec["spec"]["layer"] if "shape" in la["encoding"]]
    assert shapes and shapes[0]["scale"]["domain"] == [C.MEAN_MARK, C.DIVERGED_MARK]
    assert shapes[0]["scale"]["range"] == ["circle", "cross"]
    probes = pl.DataFrame({"run": ["r"] * 4, "step": [0, 10] * 2,
                           "name": ["residual_kurtosis"] * 2 + ["output_logsumexp_mean"] * 2,
                           "value": [3.0, 9.0, 1.0, 2.0]})
    runs = pl.DataFrame({"run": ["r"], "depth": [2], "arm": ["none"], "lr": [0.01]})
    chart = P.probe_chart(runs, probes, ["residual_kurtosis", "output_logsumexp_mean"], "other",
                          row="probe")
    spec = chart.to_dict()
    names = {row["probe"] for row in spec["data"]["values"]}
    assert names == {"residual kurtosis", "output log-sum-exp (mean)"}
    assert spec["facet"]["row"]["field"] == "probe"
    assert C.probe_words("some_new_probe") == "some new probe"


def test_chart_legend_names_each_arm_in_words_with_its_own_colour():
    arms = ["zloss1e-4", "none", "softcap50", "rmsnorm"]
    scale = C.arm_scale(arms)
    assert list(scale.domain) == ["QK-norm off", "QK-norm on (rmsnorm)", "attention soft-cap 50",
                                  "z-loss 1e-4"]
    assert len(set(scale.range)) == 4 and scale.range[0] == C.ARM_COLORS["none"]
    found = ["residual_kurtosis", "output_logsumexp_mean", "max_attention_logit_capped", "q_rms",
             "max_attention_logit"]
    assert {"output_logsumexp_mean", "max_attention_logit_capped"} <= set(
        P.other_probe_names(found))
