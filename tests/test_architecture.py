"""The import graph: the framework-free core (qkstudy/) below both engines (mlx_gpt/, torch_ref/,
siblings that never import each other) and the analysis, the cross-engine checks (crosscheck/)
above both engines, with no arrow back, and a core that plans sweeps and reads run folders where MLX and torch are absent
(a CUDA node without MLX, a laptop without torch)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("qkstudy", "mlx_gpt", "torch_ref", "analysis", "crosscheck")

# package -> the top-level modules it must never import (anywhere, lazily included)
FORBIDDEN = {
    "qkstudy": {"mlx", "torch", "mlx_gpt", "torch_ref", "crosscheck", "analysis",
                "polars", "altair"},
    "analysis": {"mlx", "torch", "mlx_gpt", "torch_ref", "crosscheck"},
    "mlx_gpt": {"torch", "torch_ref", "analysis", "crosscheck"},
    "torch_ref": {"mlx", "mlx_gpt", "analysis", "crosscheck"},
    "crosscheck": {"analysis"},  # above both engines: it may import either, never the analysis
}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module `path` imports, at any depth (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_arrow_points_up_or_across_the_frameworks():
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            bad = imported_modules(path) & FORBIDDEN[package]
            wrong += [f"{rel} imports {name}" for name in sorted(bad)]
    assert not wrong, "\n".join(wrong)



# who imports whom among the packages: the core at the bottom; the two engines and the analysis
# on it, side by side; the cross-engine checks on top of both engines
GRAPH = {"qkstudy": set(), "mlx_gpt": {"qkstudy"}, "torch_ref": {"qkstudy"},
         "analysis": {"qkstudy"}, "crosscheck": {"qkstudy", "mlx_gpt", "torch_ref"}}


def test_the_engines_are_siblings_over_the_core():
    found = {package: set() for package in PACKAGES}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[package] |= imported_modules(path) & set(PACKAGES) - {package}
    assert found == GRAPH
    # every package of the repository is in the picture
    assert {p.parent.name for p in ROOT.glob("*/*.py")} - {"tests"} == set(PACKAGES)


def imports_for_type_checking_only(path: Path) -> list[str]:
    """The project modules `path` imports under `if TYPE_CHECKING:`: an import circle hidden
    from the interpreter."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (
                        inner.level or (inner.module or "").split(".")[0] in PACKAGES):
                    found.append("." * inner.level + (inner.module or ""))
    return found


CIRCLE_FREE = ("qkstudy", "mlx_gpt", "torch_ref", "crosscheck", "analysis")


def test_no_import_circle_is_hidden_behind_type_checking(tmp_path):
    hidden = [f"{path.relative_to(ROOT)} imports {name}" for package in CIRCLE_FREE
              for path in sorted((ROOT / package).rglob("*.py"))
              for name in imports_for_type_checking_only(path)]
    assert not hidden, "\n".join(hidden)
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from .trainer import Engine\n    import tiktoken\n")
    assert imports_for_type_checking_only(sneaky) == [".trainer"]

def test_the_rule_sees_a_lazy_import(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    from mlx_gpt.engine import build_model\n    import torch\n")
    assert {"mlx_gpt", "torch"} <= imported_modules(sneaky)


BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mlx", "torch"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
""")


def run_blocked(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED + textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_core_plans_a_sweep_and_reads_runs_without_mlx_or_torch(tiny_cfg, tmp_path):
    from qkstudy.run_folder import RunFolder
    from qkstudy.trainer import train

    cfg = tiny_cfg()
    train(cfg, verbose=False)  # a run folder written by the MLX backend, read below without it
    run_dir = RunFolder.of(cfg).path
    out = run_blocked(f"""
        import json, sys
        from qkstudy import run_folder, status
        from qkstudy.__main__ import main
        from qkstudy.config import load_config
        from qkstudy.parameters import initial_weights
        from qkstudy.config import model_args

        # plan the study preset (dry run: the plan, its memory check, sweep.json unwritten)
        assert main(["sweep", "preset=mini", "runs_dir={tmp_path / 'plan'}", "--dry-run"]) == 0
        # read the run folder the MLX backend wrote
        summary = run_folder.RunFolder(__import__("pathlib").Path({str(run_dir)!r})).intact_summary()
        cfg = load_config({str(run_dir / 'config.json')!r})
        assert summary["status"] == "completed" and cfg.run_id == summary["run_id"]
        assert run_folder.read_parts(__import__("pathlib").Path({str(run_dir / 'metrics')!r})).num_rows
        assert main(["status", {str(run_dir.parent)!r}]) == 0
        # the initial weights both backends load
        assert initial_weights(model_args(cfg, 257), cfg.seed)["wte.weight"].shape == (320, 32)
        # the analysis reads it too
        from analysis import load_study
        assert load_study({str(run_dir.parent)!r}).runs.table.height == 1
        # and asking for a framework that is absent is one line, not a traceback
        sys.exit(main(["train", "backend=torch", "runs_dir={tmp_path / 'none'}"]))
    """, ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: PyTorch is not installed: pip install -e '.[torch]' (or ./setup.sh torch on a "
        "GPU machine)"]
    assert not (tmp_path / "none").exists()  # nothing written for a run that cannot start
    assert "sweep mini (preset mini): 240 grid runs" in out.stdout, out.stdout[-2000:]


NOT_INSTALLED = textwrap.dedent("""
    import runpy, sys
    sys.modules.update(dict.fromkeys(["mlx", "mlx.core", "torch"]))  # as if not installed
    sys.argv = ["qkstudy", *sys.argv[1:]]
    runpy.run_module("qkstudy", run_name="__main__", alter_sys=True)
""")


def test_the_core_alone_plans_a_sweep_by_the_flop_model_and_names_the_extra(tmp_path):
    """Neither engine importable and backend=auto (no QKSTUDY_BACKEND): the dry run plans and
    its time comes from the FLOP model; a command that needs an engine says what to install."""
    env = {k: v for k, v in os.environ.items() if k != "QKSTUDY_BACKEND"}

    def qkstudy(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", NOT_INSTALLED, *words], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    out = qkstudy("sweep", "preset=mini", f"runs_dir={tmp_path}", "--dry-run")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "backend=auto: neither MLX nor PyTorch is installed" in out.stdout
    assert re.search(r"time        ~.* for the 240 unfinished grid runs .* tok/s from the FLOP "
                     r"model: 30% of numpy's float32 matmul peak here \([\d,]+ GFLOP/s\), not "
                     r"timed \(PyTorch is not installed: pip install -e '\.\[torch\]'", out.stdout)
    out = qkstudy("train", f"runs_dir={tmp_path}")
    assert (out.returncode, out.stderr.count("\n")) == (2, 1), out.stderr
    assert out.stderr.startswith("error: PyTorch is not installed: pip install -e '.[torch]'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("package", ["qkstudy", "analysis"])
def test_importing_the_core_or_the_analysis_loads_no_framework(package):
    out = subprocess.run([sys.executable, "-c", f"import sys, {package}, {package}.__main__; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                          "('mlx', 'torch', 'mlx_gpt', 'torch_ref')))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# each analysis module imported alone: the trainer, the engines and the command lines stay out
# (the docs promise the analysis reads files only). The interpreter below loads the third-party
# libraries once, then forks a child per module, so each child starts with no project module
# loaded and imports only its own (one fresh interpreter per module would take ~2 s each here).
ALONE = textwrap.dedent("""
    import importlib, json, os, sys
    import altair, jinja2, numpy, polars, pyarrow, scipy.stats  # noqa: F401 (shared, allowed)
    assert not [m for m in sys.modules if m.split(".")[0] in ("qkstudy", "analysis")]

    def loaded_wrongly(module):
        # the analysis's own entry point is a command line: it loads the shared frame
        frame = {"qkstudy.cli"} if module == "analysis.__main__" else set()
        return sorted(m for m in sys.modules if m not in frame and (
            m == "qkstudy.trainer" or m.split(".")[0] in ("mlx", "torch", "mlx_gpt", "torch_ref")
            or m.rsplit(".", 1)[-1] == "cli"))

    found = {}
    for module in sys.argv[1:]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                importlib.import_module(module)
                answer = loaded_wrongly(module)
            except BaseException as e:
                answer = [f"import failed: {type(e).__name__}: {e}"]
            os.write(write, json.dumps(answer).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            found[module] = json.loads(pipe.read() or '["no answer"]')
        os.waitpid(pid, 0)
    print(json.dumps(found))
""")


def analysis_modules() -> list[str]:
    return sorted("analysis" if p.stem == "__init__" else f"analysis.{p.stem}"
                  for p in (ROOT / "analysis").glob("*.py"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child per module")
def test_no_analysis_module_loads_the_trainer_an_engine_or_a_command_line():
    modules = analysis_modules()
    assert {"analysis.law", "analysis.advise", "analysis.ladder", "analysis.calibrate",
            "analysis.published", "analysis.report"} <= set(modules)
    out = subprocess.run([sys.executable, "-c", ALONE, *modules], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert sorted(found) == modules
    wrong = {module: loaded for module, loaded in found.items() if loaded}
    assert not wrong, wrong


def test_the_import_check_sees_a_module_that_loads_the_sweeps_command_line(tmp_path):
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "__init__.py").write_text("")
    (tmp_path / "analysis" / "leaky.py").write_text("import qkstudy.sweep.cli\n")
    out = subprocess.run([sys.executable, "-c", ALONE, "analysis.leaky"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    leaked = json.loads(out.stdout)["analysis.leaky"]
    assert {"qkstudy.sweep.cli", "qkstudy.trainer"} <= set(leaked)
