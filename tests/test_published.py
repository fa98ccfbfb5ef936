"""The published answer comes from the published archives: rebuilding the README's answer table
and docs/results.md's generated blocks from results/ gives the text the pages show, so every
published number can be traced and recomputed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def block(page: Path, name: str) -> str:
    match = re.search(rf"<!-- {re.escape(name)}: [^>]*-->\n(.*?)\n<!-- end {re.escape(name)} -->",
                      page.read_text(), re.S)
    assert match, f"{page.name} has no generated {name} block"
    return match.group(1)


@pytest.fixture(scope="module")
def made() -> dict[str, str]:
    from tools import results_tables as rt

    return rt.blocks(*rt.analyse_all(ROOT))


def test_the_readmes_answer_table_is_rebuilt_from_the_archives(made):
    assert block(ROOT / "README.md", "answer") == made["answer"]


@pytest.mark.parametrize("name", ["mini", "mini-seeds5-9", "mini-tinystories", "mini-l2norm",
                                  "ladder"])
def test_each_studys_block_in_results_md_is_rebuilt_from_its_archive(made, name):
    assert block(ROOT / "docs" / "results.md", name) == made[name]
