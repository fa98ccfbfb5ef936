"""The times the project states live in one place each and agree where they are repeated."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _one(pattern: str, text: str, where: str) -> str:
    found = re.findall(pattern, text, re.S)
    assert len(found) == 1, (where, pattern, found)
    return found[0]


def test_the_demo_time_agrees_in_readme_justfile_and_docs():
    readme = (ROOT / "README.md").read_text()
    justfile = (ROOT / "justfile").read_text()
    sweeps = (ROOT / "docs" / "sweeps.md").read_text()
    times = {
        "README.md": _one(r"`just demo` took (\d+m\d+s)", readme, "README.md"),
        "justfile": _one(r"then its report \((\d+m\d+s) on 2 idle cores", justfile, "justfile"),
        "docs/sweeps.md": _one(r"then the report\) took\s+(\d+m\d+s), the median of 3 runs",
                               sweeps, "docs/sweeps.md"),
    }
    assert len(set(times.values())) == 1, times


def test_the_suite_time_is_stated_once_with_its_range():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"the test suite \(\d+m\d+s\*\)", readme)
    assert re.search(r"\* median of 3 runs \(\d+m\d+s-\d+m\d+s\)", readme)
    for path in [ROOT / "justfile", *(ROOT / "docs").glob("*.md")]:
        assert not re.search(r"\d+ tests in \d+m\d+s", path.read_text()), path
