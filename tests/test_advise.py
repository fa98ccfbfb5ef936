"""`just advise` (analysis/advise.py): bad input and a damaged table get one `error:` line and
exit 2; the verdict reads the measured cell first, says "not needed" only on the measured model
body and schedules, names the body it assumed, and answers from results/advice.json (the table
the archives generate; tests/test_published.py holds it equal to them) without the analysis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import advice_table as T
from analysis import advise as A
from analysis.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
GOOD = ["lr=1e-3", "warmup=30", "steps=300"]


@pytest.fixture(scope="module")
def table() -> dict:
    return T.read(ROOT / T.PATH)


def run(table: dict, **knobs) -> list[str]:
    return A.advise(A.parse([f"{k}={v}" for k, v in knobs.items()]), table)


def _refuse(*_a, **_k):
    raise AssertionError("the table was read")


@pytest.mark.parametrize("argv", [
    [], ["lr=1e-3", "warmup=30"], ["lr=x", "warmup=30", "steps=300"],
    ["lr=0", "warmup=30", "steps=300"],
    ["lr=-1e-3", "warmup=30", "steps=300"], ["lr=nan", "warmup=30", "steps=300"],
    ["lr=1e-3", "warmup=-1", "steps=300"], ["lr=1e-3", "warmup=300", "steps=300"],
    ["lr=1e-3", "warmup=3.5", "steps=300"], [*GOOD, "colour=red"], [*GOOD, "300"],
    [*GOOD, "lr=2e-3"], [*GOOD, "d_model=0"], [*GOOD, "depth=x"]])
def test_bad_input_gets_one_line_and_exit_2_before_the_table_is_read(argv, capsys, monkeypatch):
    monkeypatch.setattr(T, "read", _refuse)
    assert main(["advise", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: ") and out.err.count("\n") == 1


@pytest.mark.parametrize("content", [None, "", "{", "[]", '{"conditions": []}',
                                     '{"conditions": [{"name": "x"}]}', "table"])
def test_a_missing_or_damaged_table_gets_one_line(content, table, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if content == "table":  # a good table with one cell's LR damaged
        bad = json.loads(json.dumps(table))
        bad["conditions"][0]["cells"][0]["lr"] = "0.01"
        content = json.dumps(bad)
    if content is not None:
        (tmp_path / "results").mkdir()
        (tmp_path / T.PATH).write_text(content)
    assert main(["advise", *GOOD]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(T.PATH) in err


def test_without_a_shape_the_verdict_names_the_body_it_assumed(table):
    line = run(table, lr=0.01, warmup=1000, steps=24414)[0]
    assert "d_model 64, depth 4 (assumed d_model and depth: the ladder's model" in line
    assert "(assumed" not in run(table, lr=0.01, warmup=1000, steps=24414, d_model=64,
                                 depth=4)[0]


def test_at_a_measured_condition_the_verdict_is_its_cell(table):
    line = run(table, lr=0.03, warmup=480, steps=1200, d_model=192, depth=6)[0]
    assert ": needed: measured at this LR at w192-d6-s1200-wu480" in line
    assert "off minus on +1.109" in line and "off worse decided" in line
    between = run(table, lr=0.02, warmup=480, steps=4800)[0]  # 0.01 and 0.03 both decided
    assert "not needed: measured at the LRs either side at w64-s4800" in between


def test_nearness_weighs_each_knob_by_how_far_it_moves_the_onset(table):
    w = table["weights"]
    c = {"d_model": 64, "depth": 4, "warmup": 480, "steps": 1200}
    longer = A.distance(c, {"warmup": 480, "steps": 24000}, w)  # 20x the steps
    wider = A.distance(c, {"warmup": 480, "steps": 1200, "d_model": 192, "depth": 4}, w)
    assert longer < wider and w["steps"] < w["warmup"]


def test_the_warnings_agree_with_the_measured_conditions(table):
    lines = run(table, lr=0.01, warmup=1000, steps=24414)
    assert not [x for x in lines if x.startswith("warning: steps")]  # 24,414 was measured


def test_not_needed_never_comes_from_another_schedule_or_vocabulary(table):
    gpt2 = run(table, lr=0.0006, warmup=2000, steps=100000)
    assert "not needed" not in gpt2[0] and "not measured: warmup 2,000" in gpt2[0]
    assert not [x for x in gpt2 if x.startswith("predicted onset")]
    byte_only = run(table, lr=0.01, warmup=1000, steps=24414, vocab=50257)[0]
    assert ": uncertain: " in byte_only and "not your vocabulary" in byte_only


def test_outside_the_measured_warmups_no_interval_is_printed(table):
    lines = run(table, lr=0.001, warmup=0, steps=1000)
    assert "not measured: warmup 0 is outside" in lines[0]
    assert not [x for x in lines if x.startswith("predicted onset")]


def test_the_cells_near_the_lr_are_shown_with_where_qk_norm_merely_learns_faster(table):
    lines = run(table, lr=0.003, warmup=100, steps=2000, d_model=64, depth=4)
    assert "  measured there: LR 0.003: off minus on -0.066" in "\n".join(lines)
    slow = run(table, lr=0.0003, warmup=480, steps=4800)[0]
    assert "off worse decided; below the smallest gap, where QK-norm learns faster" in slow


def test_a_body_never_measured_is_not_measured(table):
    line = run(table, lr=0.001, warmup=480, steps=1200, d_model=768, depth=12)[0]
    assert ": not measured: no condition at d_model 768, depth 12" in line


def test_advise_answers_from_the_table_without_loading_the_analysis():
    code = ("import sys; from analysis.advise import cli; cli(['lr=0.003', 'warmup=100', "
            "'steps=2000']); heavy = [m for m in ('scipy', 'polars', 'statsmodels', "
            "'analysis.study') if m in sys.modules]; sys.exit(f'loaded {heavy}' if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    module = subprocess.run([sys.executable, "-m", "analysis.advise", "lr=0.003", "warmup=100",
                             "steps=2000"], cwd=ROOT, capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout.startswith("LR 0.003, warmup 100")
