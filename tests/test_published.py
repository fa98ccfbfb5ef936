"""The published tables come from the published archives: rebuilding them from results/ gives
the text docs/results.md shows, so every published number can be traced and recomputed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "docs" / "results.md").read_text()


def block(name: str) -> str:
    match = re.search(rf"<!-- {name}: [^>]*-->\n(.*?)\n<!-- end {name} -->", RESULTS, re.S)
    assert match, f"docs/results.md has no generated {name} block"
    return match.group(1).strip()


@pytest.mark.skipif(not (ROOT / "results" / "ladder").is_dir(), reason="no ladder archives")
def test_the_ladder_table_is_rebuilt_from_its_archives():
    from analysis.ladder import analyse_ladder, summary_text

    rebuilt = summary_text(analyse_ladder([ROOT / "results" / "ladder"]))
    assert rebuilt.strip() == block("ladder")


STUDIES = {"mini": "## The mini (synthetic corpus, seeds 0-4)",
           "mini-seeds5-9": "## Replication: the mini with five new seeds (5-9)",
           "mini-tinystories": "## The mini on real text: a TinyStories sample (5 fixed seeds)",
           "mini-l2norm": "## A third arm through the variant registry"}


def section(title: str) -> str:
    start = RESULTS.index(title)
    end = RESULTS.find("\n## ", start + 1)
    return RESULTS[start:end if end > 0 else None]


@pytest.mark.parametrize("name", [n for n in STUDIES if (ROOT / "results" / f"{n}.tar.xz").exists()])
def test_a_studys_verdicts_rules_and_gaps_are_rebuilt_from_its_archive(name, tmp_path):
    """`just report results/<study>.tar.xz` computes these same tables (analysis.study)."""
    from analysis.load import load_runs
    from analysis.study import analyse
    from qkstudy.archive import extract
    from tools import results_tables as rt

    folder, _, _ = extract(ROOT / "results" / f"{name}.tar.xz", tmp_path)
    study = analyse(load_runs(folder))
    text = section(STUDIES[name])
    assert rt.verdicts(study.verdicts) in text
    assert rt.rules(study.thresholds) in text
    assert rt.gaps(study.gaps) in text
