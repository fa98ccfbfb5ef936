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
