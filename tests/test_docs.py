"""What the docs state agrees: the times the project states live in one place each and agree
where they are repeated; the analysis commands shown use the words their parsers accept."""

from __future__ import annotations

import dataclasses
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


def test_the_mini_time_is_measured_in_one_place():
    """docs/results.md holds the mini's wall time (median and range of 3 idle runs, machine
    and commit named); no other file states another."""
    results = (ROOT / "docs" / "results.md").read_text()
    _one(r"At that commit, on an idle 2-core[^`]+`just mini backend=torch` took (\d+m\d+s), the"
         r"\s+median of 3 runs\s+\(\d+m\d+s-\d+m\d+s\)", results, "docs/results.md")
    for path in [ROOT / "README.md", ROOT / "justfile", *(ROOT / "docs").glob("*.md")]:
        if path.name != "results.md":
            assert not re.search(r"\bmini\b[^.\n]*\b\d+m\d+s", path.read_text()), path


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


# --- facts the docs restate from the code -----------------------------------------------------


def test_the_generated_tables_match_the_code():
    """The presets' and run keys' tables in the docs are rendered from the code: `just docs`
    rewrites them, and this fails while one differs."""
    from analysis.doc_tables import BLOCK, stale

    assert not stale(), f"out of date (run `just docs`): {stale()}"
    blocks = {(path, m.group(2)) for path in ("docs/sweeps.md", "docs/model.md")
              for m in BLOCK.finditer((ROOT / path).read_text())}
    assert blocks >= {("docs/sweeps.md", "presets"), ("docs/sweeps.md", "preset-parameters"),
                      ("docs/model.md", "run-keys")}, blocks


def test_the_generator_rewrites_a_block_and_names_an_unknown_one(tmp_path):
    from analysis import doc_tables

    (tmp_path / "docs").mkdir()
    stale_doc = "a\n<!-- generated: run-keys -->\nold\n<!-- end generated -->\nb\n"
    (tmp_path / "README.md").write_text(stale_doc)
    (tmp_path / "docs" / "x.md").write_text("<!-- generated: nope -->\n<!-- end generated -->\n")
    assert doc_tables.stale(tmp_path) == ["README.md: run-keys", "docs/x.md: nope (no such table)"]
    fresh = doc_tables.render(stale_doc)
    assert fresh.startswith("a\n<!-- generated: run-keys -->\n| key |") and fresh.endswith(
        "<!-- end generated -->\nb\n")
    assert "| `lr` | `0.003` |" in fresh


def _shown(value) -> str:
    """A default as the usage text writes it: 0,1,2 / true / 0.02 / runs."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_the_sweep_usage_shows_the_defaults_of_the_default_preset():
    """`python -m qkstudy sweep --help` writes key=value with the values a sweep gets when the
    key is not given: those of the default preset, which SweepConfig's defaults agree with."""
    from qkstudy.sweep.cli import USAGE
    from qkstudy.sweep.config import PRESETS, SweepConfig, parse_sweep_config
    from qkstudy.sweep.slurm import KEYS, SlurmOptions

    default = parse_sweep_config([])
    assert dataclasses.replace(default, backend_why="") == PRESETS[default.preset]
    assert re.search(rf"preset={default.preset} \(default\)", USAGE)
    assert set(re.findall(r"Presets: (.*?)\.\n", USAGE, re.S)[0].replace("preset=", "")
               .replace(" (default)", "").replace(" or ", ", ").replace("\n", " ")
               .split(", ")) == set(PRESETS)
    examples = {"lrs", "slurm_extra", "slurm_max_parallel"}  # values that illustrate, not defaults
    seen = set()
    for key, value in re.findall(r"\b(\w+)=(\S+)", USAGE):
        if key in seen or key in examples or key == "preset":
            continue
        seen.add(key)
        if key in KEYS:
            assert value == _shown(getattr(SlurmOptions(), KEYS[key])), (key, value)
        elif key in {f.name for f in dataclasses.fields(SweepConfig)}:
            assert value == _shown(getattr(default, key)), (key, value)
            assert value == _shown(getattr(SweepConfig(), key)), (key, value)
    assert {"depth", "seeds", "arms", "refine", "max_seeds", "jobs", "slurm_cpus"} <= seen


NUMBER = r"-?\d[\d,.]*(?:e-?\d+)?"


def test_defaults_stated_in_the_docs_match_the_code():
    """`key` (default N), `key` (N), `key`, default N, `key` = N: for a run key, N is its
    TrainConfig default; for a sweep key, the default preset's value."""
    from qkstudy.config import TrainConfig
    from qkstudy.sweep.config import parse_sweep_config

    defaults = {f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)}
    sweep = parse_sweep_config([])
    defaults |= {f.name: getattr(sweep, f.name) for f in dataclasses.fields(sweep)
                 if f.name != "train"}
    stated = re.compile(rf"`(\w+)`(?: \w+)?(?: \(|, | = )(?:default )?({NUMBER})")
    checked = 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for key, value in stated.findall(path.read_text()):
            if key in defaults and isinstance(defaults[key], (int, float)):
                assert float(value.replace(",", "").rstrip(".")) == defaults[key], (
                    path.name, key, value, defaults[key])
                checked += 1
    assert checked >= 5


def test_the_mini_preset_is_described_as_it_is():
    from qkstudy.sweep.config import PRESETS

    mini = PRESETS["mini"]
    readme = (ROOT / "README.md").read_text()
    justfile = (ROOT / "justfile").read_text()
    depths, lrs, seeds = _one(r"just mini +# depths ([\d, ]+) x both arms x (\d+) LRs "
                              r"x (\d+) seeds", readme, "README.md")
    assert (tuple(int(d) for d in depths.split(", ")), int(lrs), int(seeds)) == (
        mini.depth, len(mini.grid_lrs()), len(mini.seeds))
    depths, lrs, seeds, most = _one(r"depths ([\d,]+) x both arms x (\d+) LRs x (\d+) seeds "
                                    r"fixed in advance \(\+ boundary and crossing bisection; max_seeds (\d+): no "
                                    r"adaptive seeds\)",
                                    justfile, "justfile")
    assert (tuple(int(d) for d in depths.split(",")), int(lrs), int(seeds), int(most)) == (
        mini.depth, len(mini.grid_lrs()), len(mini.seeds), mini.max_seeds)


def test_the_commands_shown_are_the_current_ones():
    for path in [ROOT / "README.md", ROOT / "justfile", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        assert "python -m mlx_gpt" not in text and "mlx_gpt bench" not in text, path.name


# --- what each install brings ------------------------------------------------------------------

# import name -> the distribution that provides it
DISTRIBUTION = {"tiktoken_ext": "tiktoken"}
# what a torch run on a GPU node must not pull in: MLX and the analysis stack
NOT_FOR_A_TORCH_RUN = {"mlx", "polars", "altair", "vl-convert-python", "statsmodels"}
# the modules a backend=torch run, sweep, status, the spot check and the GPU check import
TORCH_RUN = ["qkstudy/**/*.py", "torch_ref/__init__.py", "torch_ref/engine.py",
             "torch_ref/model.py", "torch_ref/device.py", "crosscheck/__init__.py",
             "crosscheck/__main__.py", "crosscheck/spot_check.py", "crosscheck/gpu_check.py",
             "crosscheck/gpu_stages.py"]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-")
            for r in requirements}


def test_the_torch_extra_is_what_a_torch_run_imports_and_no_more():
    """`pip install -e '.[torch]'` (`./setup.sh torch`) brings every package the core and the
    torch engine import, and neither MLX nor the analysis stack; `dev` brings every extra."""
    import ast
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    torch_run = _requirement_names(project["dependencies"] + extras["torch"])
    assert not torch_run & NOT_FOR_A_TORCH_RUN, torch_run & NOT_FOR_A_TORCH_RUN
    imported = set()
    for pattern in TORCH_RUN:
        for path in ROOT.glob(pattern):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"qkstudy", "torch_ref", "crosscheck"}
    needed = {DISTRIBUTION.get(name, name).replace("_", "-") for name in third_party}
    assert needed <= torch_run, needed - torch_run
    assert "qknorm-study[mlx,torch,analysis]" in extras["dev"]
    setup = (ROOT / "setup.sh").read_text()
    assert 'extra=torch' in setup and 'pip install -e ".[$extra]"' in setup
    assert "./setup.sh torch" in (ROOT / "README.md").read_text()
