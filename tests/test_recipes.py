"""Every recipe in `just --list` runs what exists: each `python -m MODULE [COMMAND]` a recipe
calls answers --help (in this process: cheap), each file it names exists, and the list reads
whole, grouped in the order a user meets them."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JUST = shutil.which("just", path=str(Path(sys.executable).parent)) or shutil.which("just")
pytestmark = pytest.mark.skipif(JUST is None, reason="just is not installed (./setup.sh installs it)")


def just(*args: str) -> str:
    return subprocess.run([JUST, "--justfile", str(ROOT / "justfile"), *args], cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=60).stdout


def body_text(recipe: dict) -> str:
    """A recipe's lines with `{{py}}` written as PY."""
    def text(part) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, list) and part and part[0] == "variable":
            return "PY" if part[1] == "py" else f"{{{{{part[1]}}}}}"
        return "".join(text(p) for p in part)

    return "\n".join(text(line) for line in recipe["body"])


RECIPES = json.loads(just("--dump", "--dump-format", "json"))["recipes"] if JUST else {}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_calls_what_exists(name):
    body = body_text(RECIPES[name])
    calls = re.findall(r"PY -m ([\w.]+)((?: [a-z][a-z-]*)?)", body)
    files = re.findall(r"(?<![\w/.$])((?:\./)?[\w-]+(?:/[\w-]+)*\.(?:py|sh))\b", body)
    assert calls or files or "--list" in body, f"{name}: calls nothing known"
    for path in files:
        assert (ROOT / path).exists(), f"just {name} names {path}, which does not exist"
    for module, command in calls:
        assert importlib.util.find_spec(module), f"just {name} runs {module}, which does not exist"
        if module == "pytest":
            continue
        package = importlib.util.find_spec(module).submodule_search_locations is not None
        main = importlib.import_module(f"{module}.__main__" if package else module).main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([*command.split(), "--help"])
        assert code == 0 and "usage" in out.getvalue().lower(), (
            f"just {name}: python -m {module}{command} --help gave {code}: {out.getvalue()[:200]}")


def test_the_list_reads_whole_in_the_order_a_user_meets_it():
    listing = just()  # the default recipe: the list, in the justfile's order
    groups = re.findall(r"^\s*\[(.+)\]$", listing, re.M)
    assert groups[0] == "1 get started" and groups == sorted(groups)
    order = re.findall(r"^\s{4}([a-z-]+)", listing, re.M)
    assert order.index("setup") < order.index("demo") < order.index("report") < order.index(
        "sweep")
    for name, recipe in RECIPES.items():
        doc = recipe["doc"] or ""
        assert doc and doc.count("(") == doc.count(")"), (
            f"just {name}'s comment is missing or cut: {doc!r}")
        assert f"# {doc}" in listing
