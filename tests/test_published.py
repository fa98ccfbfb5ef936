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
    from tests import results_tables as rt

    return rt.blocks(*rt.analyse_all(ROOT))


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
