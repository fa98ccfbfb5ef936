"""Every `just` command the README or the docs name exists in the justfile."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JUST = shutil.which("just", path=str(Path(sys.executable).parent)) or shutil.which("just")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def named_recipes() -> dict[str, set[str]]:
    """recipe -> the pages that name it (`just NAME` in inline code, or a code block's line)."""
    found: dict[str, set[str]] = {}
    for page in PAGES:
        for name in re.findall(r"(?:`|^ {4,}|/bin/)just ([a-z][a-z0-9-]*)", page.read_text(), re.M):
            found.setdefault(name, set()).add(page.name)
    return found


@pytest.mark.skipif(JUST is None, reason="just is not installed (./setup.sh installs it)")
def test_every_just_command_the_pages_name_exists():
    listed = set(subprocess.run([JUST, "--justfile", str(ROOT / "justfile"), "--summary"],
                                capture_output=True, text=True, check=True).stdout.split())
    named = named_recipes()
    assert {"demo", "test", "ladder", "report"} <= named.keys()  # the reader meets these first
    missing = {n: sorted(p) for n, p in named.items() if n not in listed}
    assert not missing, f"named in the docs but not in the justfile: {missing}"
