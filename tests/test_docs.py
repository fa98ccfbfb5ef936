"""What the docs state agrees: the times the project states live in one place each and agree
where they are repeated; the analysis commands shown use the words their parsers accept."""

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


# `python -m analysis report ...`, `{{py}} -m analysis calibrate ...`, `just report ...`: the
# words up to the end of the code span or line
ANALYSIS_COMMAND = re.compile(r"(?:-m analysis|\bjust) (report|calibrate)\b([^`\n]*)")


def test_the_analysis_commands_shown_use_the_words_they_accept():
    """Every report and calibrate command in the README, the docs and the justfile uses only
    the keys its parser knows, in key=value form; one with concrete values parses as shown."""
    from dataclasses import fields

    from analysis.calibrate import CalibrateArgs
    from analysis.report import ReportArgs, parse_args

    keys = {"report": {f.name for f in fields(ReportArgs)},
            "calibrate": {f.name for f in fields(CalibrateArgs)}}
    shown = 0
    for path in [ROOT / "README.md", ROOT / "justfile", *sorted((ROOT / "docs").glob("*.md"))]:
        for command, rest in ANALYSIS_COMMAND.findall(path.read_text()):
            rest = rest.split("#")[0].split("(")[0]  # a comment or a remark after it
            words = rest.replace("[", " ").replace("]", " ").split()
            where = (path.name, f"{command}{rest}")
            assert not any(w.startswith("-") for w in words), where
            assert {w.split("=")[0] for w in words if "=" in w} <= keys[command] | {"key"}, where
            concrete = not any(c in rest for c in "[<.") and rest == rest.lower()
            if command == "report" and concrete:
                parse_args(words)  # raises UsageError on a word it does not accept
            shown += 1
    assert shown >= 10
