"""The published answer comes from the published archives: rebuilding the README's answer table
and docs/results.md's generated blocks from results/ gives the text the pages show, so every
published number can be traced and recomputed."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]


def block(page: Path, name: str) -> str:
    match = re.search(rf"<!-- {re.escape(name)}: [^>]*-->\n(.*?)\n<!-- end {re.escape(name)} -->",
                      page.read_text(), re.S)
    assert match, f"{page.name} has no generated {name} block"
    return match.group(1)


@pytest.fixture(scope="module")
def analysed() -> tuple:
    from analysis import published as rt

    return rt.analyse_all(ROOT)


@pytest.fixture(scope="module")
def made(analysed) -> dict[str, str]:
    from analysis import published as rt

    return rt.blocks(*analysed)


@pytest.mark.parametrize("name", ["practitioner", "advise", "answer"])
def test_the_readmes_answer_tables_are_rebuilt_from_the_archives(made, name):
    assert block(ROOT / "README.md", name) == made[name]


@pytest.mark.parametrize("name", ["mini", "mini-seeds5-9", "mini-tinystories", "mini-l2norm",
                                  "ladder", "warmup-probes"])
def test_each_studys_block_in_results_md_is_rebuilt_from_its_archive(made, name):
    assert block(ROOT / "docs" / "results.md", name) == made[name]


DESIGN = {"0.1", "2", "8", "30", "64", "120", "256", "300", "480", "1,000", "1,920", "4,800", "24,414",
          "12M", "100M"}  # the conditions and the margin, set by the design


def test_every_number_in_the_readmes_answer_comes_from_a_generated_table(made):
    """The sentences under the answer table cite its numbers (or the ladder block's law and the
    warmup probes' table) as the archives give them, so none can go stale unseen."""
    text = (ROOT / "README.md").read_text()
    answer = text[text.index("## The answer at laptop scale"):text.index("Tables, figures and what")]
    answer = re.sub(r"<!-- (\S+): .*?<!-- end \1 -->", "", answer, flags=re.S)
    answer = re.sub(r"et al\. \(\d{4}\)", "", answer)  # a citation
    tables = made["practitioner"] + made["answer"] + made["ladder"] + made["warmup-probes"]
    numbers = re.findall(r"(?<![\w./])[+-]?\d(?:[\d,]*\d)?(?:\.\d+)?M?", answer)
    stray = [n for n in numbers if n.lstrip("+-") not in DESIGN and n not in tables]
    assert not stray, f"numbers in the README's answer that no generated table holds: {stray}"


def test_the_answer_figure_is_drawn_from_the_archives(analysed, made):
    """docs/results/answer.png's spec: training steps coloured in numeric order, an arrow for
    each width-64 point's interval end or onset beyond the LRs read, and the straight law's band
    and study-schedule prediction as the ladder block states it."""
    from analysis import published as rt

    studies, ladder = analysed
    spec = rt.figure(studies, ladder).to_dict()
    warmup = {lay["name"].rsplit("_", 1)[0]: lay["data"]["values"]
              for lay in spec["hconcat"][0]["layer"]}
    domain = spec["hconcat"][0]["layer"][0]["encoding"]["color"]["scale"]["domain"]
    assert domain == sorted(domain, key=lambda v: int(v.replace(",", ""))) and len(domain) >= 3
    rows = ladder["points"].filter((pl.col("d_model") == 64) & (pl.col("depth") == 4))
    beyond = {(r["point"], "up") for r in rows.iter_rows(named=True)
              if r["onset_hi"] is None or r["onset_side"] == "above"}
    beyond |= {(r["point"], "down") for r in rows.iter_rows(named=True)
               if r["onset_lo"] is None or r["onset_side"] == "below"}
    assert {(a["name"], a["dir"]) for a in warmup["arrows"]} == beyond
    assert warmup["law-band"] and all(b["lo"] < b["y"] < b["hi"] for b in warmup["law-band"])
    guess, = warmup["prediction"]
    assert f"LR {guess['text']} (an extrapolation)" in made["ladder"]


SCORED = {"The first scored point": "w192-d6-s1200-wu480",
          "The second scored point": "w64-s24414-wu1000"}


def test_the_scored_points_paragraphs_cite_their_archives(made, tmp_path):
    """Each number in the paragraphs that score the new points is the ladder block's or the
    plan's registered prediction, or a
    seed-mean gap, its interval or a seed's gap as the point's archive gives them (the
    pre-registered seeds, or with the added ones), or a condition of the design."""
    from analysis.load import load_runs
    from analysis.study import analyse
    from qkstudy.archive import extract

    text = (ROOT / "docs" / "results.md").read_text()
    for title, point in SCORED.items():
        study = analyse(load_runs(extract(ROOT / "results" / "ladder" / f"{point}.tar.xz",
                                          tmp_path / point)[0]))
        plan = (ROOT / "docs" / "report.md").read_text()
        registered = plan[plan.index("**The scored points**"):plan.index("**Scoring**")]
        cited = [made["ladder"], registered, "44e502f 5-seed 0-2 3 4",  # commit, seeds named
                 " ".join(f"{lr:.3g}" for lr in study.points["lr"].unique())]
        for r in pl.concat([study.gaps, study.exploratory_gaps]).iter_rows(named=True):
            cited += [f"{r[k]:.3g} {r[k]:.3f}" for k in ("mean_gap", "ci_lo", "ci_hi")]
            cited.append(r["seed_gaps"])
        start = text.index(f"**{title}")
        paragraph = text[start:text.index("\n\n", start)]
        numbers = re.findall(r"(?<![\w./])[+-]?\d(?:[\d,]*\d)?(?:\.\d+)?M?(?![\w])", paragraph)
        stray = [n for n in numbers if n.lstrip("+-") not in DESIGN
                 and not any(n.lstrip("+") in c for c in cited)]
        assert not stray, f"{title}: numbers no table or archive holds: {stray}"


def test_the_advice_table_is_the_archives_and_its_prediction_the_laws(analysed):
    """results/advice.json, which `just advise` reads, is what the archives give; its law
    prediction equals law.predict's at schedules inside and between the measured ones."""
    from analysis import advice_table as T
    from analysis.advise import predict
    from analysis.law import predict as law_predict
    from qkstudy.sweep.ladder import Point

    studies, ladder = analysed
    table = T.build(studies["mini"], ladder)
    assert (ROOT / T.PATH).read_text() == T.text(table)
    fit = next(f for f in ladder["fits"] if f["form"] == "straight")
    for warmup, steps in ((100, 2000), (1000, 24414), (30, 300)):
        mine = predict(T.read(ROOT / T.PATH), {"warmup": warmup, "steps": steps})
        theirs = law_predict(fit, Point(f"w64-s{steps}-wu{warmup}", 64, steps, warmup))
        for k in ("lr", "ci_lo", "ci_hi"):
            assert mine[k] == pytest.approx(theirs[k], rel=2e-3)
