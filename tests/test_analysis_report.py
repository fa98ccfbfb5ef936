"""A report built from a tiny real sweep: every section, its tables and charts, its training
curves, and the page rendered in headless Chromium when it is installed."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from analysis import charts as C
from analysis import plots as P
from analysis.__main__ import main
from analysis.prose import CHARTS
from analysis.report import ReportOptions, build_report
from qkstudy.config import TrainConfig
from tests.png import png_size


# --- a tiny real sweep ------------------------------------------------------------------------

def _copy_run(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


@pytest.fixture(scope="module")
def sweep(tiny_data, tmp_path_factory) -> Path:
    """2 depths x 2 arms x 3 LRs x 2 seeds (+ 2 refinement runs), a copy of one run in another
    sweep folder, a torch twin of it, and three broken run folders."""
    from qkstudy.trainer import train

    runs = tmp_path_factory.mktemp("analysis") / "runs"
    base = TrainConfig(data=tiny_data, n_heads=2, d_model=32, block_size=32, batch_size=4,
                       max_steps=30, warmup_steps=5, eval_every=10, eval_batches=2,
                       probe_every=10, log_every=5, ckpt_every=10, runs_dir=str(runs),
                       sweep="tiny", divergence_window=10)  # a window that fits in 30 steps
    grid = [(lr, seed) for lr in (3e-3, 3e-2, 1.0) for seed in (0, 1)] + [(0.3, 0)]
    first = None
    for depth in (1, 2):
        for qk in ("none", "rmsnorm"):
            for lr, seed in grid:
                if lr == 0.3 and depth == 2:
                    continue
                cfg = dataclasses.replace(base, depth=depth, qk_norm=qk, lr=lr, seed=seed)
                train(cfg.validate(), verbose=False)
                first = first or runs / "tiny" / cfg.run_id
    # the sweep folder declares its base grid: lr 0.3 is then a marked refinement point
    (runs / "tiny" / "sweep.json").write_text(json.dumps({"grid_lrs": [3e-3, 3e-2, 1.0]}))
    twin = _copy_run(first, runs / "torch-check" / first.name)
    for name in ("summary.json", "config.json", "manifest.json"):
        obj = json.loads((twin / name).read_text())
        obj["framework"] = "torch"
        if name == "summary.json":
            obj["final_val_loss"] += 0.01
        (twin / name).write_text(json.dumps(obj))
    _copy_run(first, runs / "copied" / first.name)  # the same run merged in from elsewhere
    foreign = _copy_run(first, runs / "broken" / "foreign-schema")
    for part in (foreign / "metrics").glob("*.parquet"):
        pl.DataFrame({"iteration": [1, 2], "loss": [1.0, 2.0]}).write_parquet(part)
    no_metrics = _copy_run(first, runs / "broken" / "no-metrics")
    shutil.rmtree(no_metrics / "metrics")
    unfinished = _copy_run(first, runs / "broken" / "unfinished")
    (unfinished / "summary.json").unlink()
    return runs


@pytest.fixture(scope="module")
def report(sweep) -> tuple[Path, object]:
    out = sweep.parent / "report"
    return build_report(sweep, out, ReportOptions(png_scale=1.0))[:2]  # no comparison


def test_report_from_tiny_sweep_has_every_section(report, sweep):
    path, study = report
    text = path.read_text()
    for section in ("answer", "summary", "warnings", "verdicts", "study-metrics", "onset",
                    "charts", "gaps", "spikes", "twins", "runs", "provenance", "definitions"):
        assert f'<section id="{section}">' in text, section
    # the first section is the answer: the headline figure and the sentences made from the
    # verdicts and their numbers
    answer = text.split('<section id="answer">', 1)[1].split("</section>", 1)[0]
    assert text.index('<section id="answer">') < text.index('<section id="summary">')
    assert 'id="chart-headline"' in answer
    sentences = re.findall(r"<li>(.*?)</li>", answer, re.S)
    assert 3 <= len(sentences) <= 6 and sentences[-1].startswith("Scale:")
    assert any(s.startswith("Verdicts: H1 ") for s in sentences)
    for name in study_charts(path):
        assert f'id="chart-{name}"' in text
        assert png_size(path.parent / "charts" / f"{name}.png")[0] >= 300
    assert re.search(r'(src|href)="(https?:)?//', text) is None  # nothing fetched: offline
    # the three broken folders are named in warnings, and the good runs are all analysed
    warnings = "\n".join(study.runs.warnings)
    for name in ("broken/foreign-schema", "broken/no-metrics", "broken/unfinished"):
        assert name in warnings and name in text
    assert "foreign schema" in warnings
    assert study.points.height == 26 and study.framework == "mlx"  # the copy counted once
    assert any("repeat the configuration" in note for note in study.notes)
    assert study.others["framework"].to_list() == ["torch"]
    # tables: per-run (Parquet + CSV) with steps-to-threshold and probe summaries
    runs = pl.read_parquet(path.parent / "tables" / "runs.parquet")
    assert runs.height == 28 and runs["in_study"].sum() == 26
    assert pl.read_csv(path.parent / "tables" / "runs.csv").height == 28
    for column in ("final_val_ppl", "steps_to_threshold", "peak_max_attention_logit",
                   "final_max_attention_logit", "final_attention_entropy_mean", "diverged_step"):
        assert column in runs.columns, column
    assert runs.filter(pl.col("status") == "diverged").height >= 4  # lr 1.0 diverges here
    assert runs["steps_to_threshold"].drop_nulls().len() >= 2
    twins = pl.read_parquet(path.parent / "tables" / "twins.parquet")
    assert twins.height == 1
    assert twins["final_loss_diff"][0] == pytest.approx(0.01)
    assert twins["max_abs_val_diff"][0] == 0.0
    verdicts = pl.read_parquet(path.parent / "tables" / "verdicts.parquet")
    assert verdicts["hypothesis"].to_list() == ["H1", "H2", "H3"]
    # LR sensitivity uses the base grid only: the refinement LR 0.3 is left out
    arms = pl.read_parquet(path.parent / "tables" / "arms.parquet")
    assert set(arms["grid_points"].to_list()) == {3} and set(arms["grid_rule"]) == {"marked"}
    refinement = runs.filter(pl.col("lr") == 0.3)
    assert refinement["refine"].all() and not refinement["in_grid"].any()
    assert arms.filter(pl.col("depth") == 1)["lrs"].to_list() == [4, 4]


def test_report_tables_explain_measured_and_show_each_run_once(report):
    path, study = report
    text = path.read_text()
    verdicts = text.split('<section id="verdicts">', 1)[1].split("</section>", 1)[0]
    assert 'id="measured-help"' in verdicts and "had the data at all" in verdicts
    for row in study.verdicts.iter_rows(named=True):
        assert html.escape(row["measured"]) in verdicts
    runs = text.split('<section id="runs">', 1)[1].split("</section>", 1)[0]
    header = re.findall(r"<th>([^<]*)</th>", runs.split("</thead>", 1)[0])
    assert "run" in header and "run_id" not in header
    assert "run_id" in pl.read_parquet(path.parent / "tables" / "runs.parquet").columns


def study_charts(path: Path) -> list[str]:
    names = re.findall(r'id="chart-([a-z_]+)"', path.read_text())
    assert set(names) <= set(CHARTS) and len(names) >= 7
    return names


def test_training_curves_keep_both_arms_of_a_diverged_lr(report):
    _, study = report
    lr = 1.0  # off diverges there in the tiny sweep (at least one seed)
    shown = pl.concat([study.points, study.others])
    picks = pl.DataFrame({"depth": [1], "lr": [lr]})
    spec = P.training_curves_chart(shown, study.runs.metrics, picks).to_dict()
    rows = pl.DataFrame(spec["data"]["values"], infer_schema_length=None)
    top = rows["y_edge"].max()
    assert set(rows["arm"]) == {C.OFF_LABEL, "QK-norm on (rmsnorm)"}
    diverged = shown.filter((pl.col("depth") == 1) & (pl.col("lr") == lr)
                            & (pl.col("status") == "diverged"))["run"].to_list()
    ends = rows.filter(pl.col("marker") == P.DIVERGED_AT)
    assert diverged and sorted(ends["run"]) == sorted(diverged)  # one cross per diverged run
    assert ends["step"].null_count() == 0
    # at most one "leaves the axis" marker per run and series, drawn at the top edge
    left = rows.filter(pl.col("marker") == P.ABOVE_MARK)
    assert left.group_by("run", "series").len()["len"].max() == 1
    assert all(la["encoding"]["y"]["scale"]["domain"][1] == top for la in spec["spec"]["layer"])
    legend = spec["spec"]["layer"][0]["encoding"]["strokeDash"]
    assert legend["legend"] is None  # one framework: no framework legend
    two = P.training_curves_chart(shown, study.runs.metrics,
                                  P.curve_runs(study.points, study.arms, None, study.others))
    assert two.to_dict()["spec"]["layer"][0]["encoding"]["strokeDash"].get("legend", {}) \
        is not None


def test_refuses_to_overwrite_a_folder_that_is_not_a_report(sweep, tmp_path, capsys):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert main(["report", str(sweep), f"out={precious}"]) == 2
    assert "not a report folder" in capsys.readouterr().err
    assert (precious / "notes.txt").read_text() == "keep me"


def test_the_chosen_group_of_settings_is_named_with_why(report):
    from analysis.study import analyse

    _, study = report
    runs = study.runs
    wider = json.dumps({**json.loads(runs.table["setting"][0]), "d_model": 48}, sort_keys=True)
    table = runs.table.with_columns(setting=pl.when(pl.col("depth") == 2).then(pl.lit(wider))
                                    .otherwise(pl.col("setting")))
    mlx = table.filter(pl.col("status").is_in(["completed", "diverged"])
                       & (pl.col("framework") == "mlx"))
    chosen, left = (mlx.filter(pl.col("depth") == d).height for d in (1, 2))
    assert chosen > left  # depth 1 also holds a refinement run
    other = analyse(dataclasses.replace(runs, table=table))
    note = next(n for n in other.notes if "largest group" in n)
    assert f"{chosen} runs with d_model=32" in note and f"other {left} runs" in note
    assert set(other.points["depth"].to_list()) == {1}


LAYOUT = """(() => {
  const box = (el) => { const r = el.getBoundingClientRect();
                        return {left: r.left, right: r.right, width: r.width, top: r.top}; };
  const out = {innerWidth: window.innerWidth,
               scrollWidth: document.documentElement.scrollWidth,
               verdicts: box(document.querySelector("table.verdicts")), charts: {}};
  document.querySelectorAll(".chart").forEach((c) => {
    const svg = c.querySelector("svg");
    out.charts[c.id] = {box: box(c), svg: svg && box(svg),
                        viewBox: svg && svg.getAttribute("viewBox"),
                        marks: !!c.querySelector("svg .marks, svg g.role-mark")};
  });
  return out;
})()"""


def test_report_renders_in_headless_chromium(report, browser):
    """Every chart draws (a Vega SVG with marks), nothing is logged, and at a wide and a narrow
    window the verdict table and every chart fit the page: the charts scale down (their SVG
    keeps its viewBox), only data tables scroll in their box."""
    path, _ = report
    charts = study_charts(path)
    for width in (1400, 800):
        page = browser.page(path.resolve().as_uri(), width, 2000)
        page.wait_for("document.body.dataset.chartsDrawn")
        assert page.evaluate("document.body.dataset.chartsDrawn") == str(len(charts))
        assert page.evaluate("document.body.dataset.chartErrors") == "0"
        layout = page.evaluate(LAYOUT)
        shot = path.parent / f"report-screenshot-{width}.png"
        shot.write_bytes(page.screenshot())
        assert png_size(shot)[0] == width
        assert not page.console, page.console  # the page logs nothing when every chart draws
        page.close()
        assert layout["innerWidth"] == width
        assert layout["scrollWidth"] <= width, layout
        assert layout["verdicts"]["right"] <= width and layout["verdicts"]["left"] >= 0
        # the answer's sentences, then its chart, come first (the first screen: the test below)
        assert layout["charts"]["chart-headline"]["box"]["top"] < 600
        assert set(layout["charts"]) == {f"chart-{n}" for n in charts}
        for name, chart in layout["charts"].items():
            assert chart["svg"] and chart["viewBox"] and chart["marks"], name
            assert chart["svg"]["right"] <= width and chart["box"]["right"] <= width, (name, chart)
            drawn = float(chart["viewBox"].split()[2])
            if width == 1400:  # a chart uses the page: at least 2/3 of it, at full size
                assert chart["svg"]["width"] >= 0.66 * (width - 32), (name, chart)
            else:  # drawn wider than the window: shrunk to fit, not cut
                assert drawn > width and chart["svg"]["width"] < drawn, (name, chart)


FIRST_SCREEN = """(() => {
  const box = (el) => { const r = el.getBoundingClientRect();
                        return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
  const chart = document.querySelector("#chart-headline svg");
  const frames = [...chart.querySelectorAll("g.cell > g > path.background")].map(box);
  const points = [...chart.querySelectorAll("g.mark-symbol.role-mark path")].map(box);
  const sentences = [...document.querySelectorAll("ul.sentences li")].map(
    (li) => ({text: li.textContent, box: box(li)}));
  return {width: window.innerWidth, height: window.innerHeight, frames, points, sentences};
})()"""

DRAWN_MARKS = """[...document.querySelectorAll("#chart-NAME g.role-mark path, #chart-NAME g.role-mark line")]
  .filter((e) => e.getAttribute("d") !== "M0,0Z" && e.getBoundingClientRect().width +
                 e.getBoundingClientRect().height > 0).length"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the browser tests of this file (DevTools protocol)."""
    from tests import browser as B

    if not B.available():
        pytest.skip("chromium or the websockets client is not installed")
    b = B.Browser(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


RUNS_TABLE = """(() => {
  const table = document.querySelector("#runs table.data");
  const heads = [...table.tHead.rows[0].cells].map((th) => th.textContent);
  const lr = heads.indexOf("lr");
  table.tHead.rows[0].cells[lr].click();
  const sorted = [...table.tBodies[0].rows].map((r) => Number(r.cells[lr].textContent));
  const box = document.querySelector("#runs input.table-filter");
  box.value = "diverged rmsnorm";
  box.dispatchEvent(new Event("input"));
  const shown = [...table.tBodies[0].rows].filter((r) => !r.hidden);
  const id = table.tBodies[0].rows[0].cells[heads.indexOf("run")];
  const visible = () => [...table.tHead.rows[0].cells].filter((th) => th.offsetWidth).length;
  const compact = visible();
  document.querySelector("#runs label.table-columns input").click();
  return {sorted, shown: shown.map((r) => r.textContent), all: table.tBodies[0].rows.length,
          id: id.textContent, title: id.title, height: id.getBoundingClientRect().height,
          compact, every: visible(), columns: heads.length};
})()"""


def _check_first_screen(page) -> None:
    """The verdict sentences and every point of the headline chart, inside its plot area, are
    on the first screen of 1366x768."""
    screen = page.evaluate(FIRST_SCREEN)
    assert screen["width"] == 1366 and screen["frames"] and screen["points"]
    for p in screen["points"]:
        x, y = (p["left"] + p["right"]) / 2, (p["top"] + p["bottom"]) / 2
        assert 0 <= x <= 1366 and 0 <= y <= 768, p  # on the first screen
        assert any(f["left"] - 1 <= x <= f["right"] + 1 and f["top"] - 1 <= y <= f["bottom"] + 1
                   for f in screen["frames"]), (p, screen["frames"])  # inside a plot area
    verdicts = [s for s in screen["sentences"] if s["text"].startswith("Verdicts: H1 ")]
    assert verdicts and verdicts[0]["box"]["bottom"] <= 768
    assert screen["sentences"][0]["box"]["bottom"] <= 768


def _check_the_legend_filters_the_other_charts(page) -> None:
    """Linked views: one arm chosen in the loss chart's legend filters the others."""
    on = "QK-norm on (rmsnorm)"
    counts = {n: page.evaluate(DRAWN_MARKS.replace("NAME", n))
              for n in ("attention_entropy", "lr_sensitivity", "loss_vs_lr")}
    label = page.evaluate(f"""(() => {{
      const el = [...document.querySelectorAll("#chart-loss_vs_lr g.role-legend-label text")]
        .find((t) => t.textContent === {json.dumps(on)});
      el.scrollIntoView({{block: "center"}});
      const r = el.getBoundingClientRect();
      return {{x: (r.left + r.right) / 2, y: (r.top + r.bottom) / 2}};
    }})()""")
    page.click(label["x"], label["y"])
    page.wait_for("JSON.stringify(views.attention_entropy.signal('arms_shown')) === "
                  + json.dumps(json.dumps([on])))
    page.evaluate("Promise.all(Object.values(views).map((v) => v.runAsync())).then(() => true)")
    after = {n: page.evaluate(DRAWN_MARKS.replace("NAME", n)) for n in counts}
    assert all(0 < after[n] < counts[n] for n in counts), (counts, after)
    pressed = page.evaluate("[...document.querySelectorAll('#filters button[aria-pressed=true]')]"
                            ".map((b) => b.textContent)")
    assert pressed == [on]


def _check_the_runs_table(page, study) -> None:
    """The runs table: compact ids on one line, sorted by a header click, filtered by words."""
    table = page.evaluate(RUNS_TABLE)
    assert table["sorted"] == sorted(table["sorted"])
    diverged = study.per_run.filter((pl.col("status") == "diverged")
                                    & (pl.col("qk_norm") == "rmsnorm")).height
    assert 0 < len(table["shown"]) == diverged < table["all"]
    assert all("diverged" in row and "rmsnorm" in row for row in table["shown"])
    assert table["title"].startswith(table["id"]) and len(table["id"]) < len(table["title"])
    assert table["height"] < 30  # one line
    assert table["compact"] < 20 < table["every"] == table["columns"]  # the rest on request


def test_first_screen_holds_the_answer_and_legends_filter_every_chart(report, browser):
    """At 1366x768 the first screen shows the verdict sentences and the headline chart with
    every data point inside its plot area; clicking an arm in the loss chart's legend filters
    the other charts to that arm."""
    path, study = report
    page = browser.page(path.resolve().as_uri(), 1366, 768)
    page.wait_for("document.body.dataset.chartsDrawn")
    assert page.evaluate("document.body.dataset.chartErrors") == "0", page.console
    _check_first_screen(page)
    _check_the_legend_filters_the_other_charts(page)
    _check_the_runs_table(page, study)
    page.close()
