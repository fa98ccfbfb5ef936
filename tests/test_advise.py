"""`just advise` (analysis/advise.py): bad input gets one `error:` line and exit 2 before any
analysis; the verdict, the nearest condition and the warnings follow the measured conditions; on
the published archives it gives the known answers and the published study-preset prediction."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from analysis import advise as A
from analysis.__main__ import main
from analysis.law import PREDICTED, fit_law, predict, predict_at
from analysis.study import ReportOptions
from qkstudy.sweep.config import MINI
from qkstudy.sweep.ladder import POINTS, SCORED_POINTS, STUDY_POINT, Point
from tests.test_ladder import planted

ROOT = Path(__file__).resolve().parents[1]
GOOD = ["lr=1e-3", "warmup=30", "steps=300"]


def _refuse(*_a, **_k):
    raise AssertionError("the analysis ran")


def _tar(path: Path) -> None:
    with tarfile.open(path, "w:xz") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))


@pytest.mark.parametrize("argv", [
    [], ["lr=1e-3", "warmup=30"], ["lr=x", "warmup=30", "steps=300"],
    ["lr=0", "warmup=30", "steps=300"],
    ["lr=-1e-3", "warmup=30", "steps=300"], ["lr=nan", "warmup=30", "steps=300"],
    ["lr=1e-3", "warmup=-1", "steps=300"], ["lr=1e-3", "warmup=300", "steps=300"],
    ["lr=1e-3", "warmup=3.5", "steps=300"], [*GOOD, "colour=red"], [*GOOD, "300"],
    [*GOOD, "lr=2e-3"], [*GOOD, "d_model=0"], [*GOOD, "depth=x"]])
def test_bad_input_gets_one_line_and_exit_2_before_any_analysis(argv, capsys, monkeypatch):
    monkeypatch.setattr(A, "sources", _refuse)
    monkeypatch.setattr(A, "measured", _refuse)
    assert main(["advise", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: ") and out.err.count("\n") == 1


@pytest.mark.parametrize("layout", ["missing", "a file", "empty", "not an archive", "no mini"])
def test_results_that_are_not_the_archives_get_one_line_before_any_analysis(
        layout, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(A, "measured", _refuse)
    ladder = tmp_path / "results" / "ladder"
    if layout == "a file":
        ladder.parent.mkdir()
        ladder.write_text("")
    elif layout != "missing":
        ladder.mkdir(parents=True)
        (ladder / "README.md").write_text("not a point")
    if layout == "not an archive":
        (ladder / "w64-s300.tar.xz").write_text("not a tar")
    if layout == "no mini":
        _tar(ladder / "w64-s300.tar.xz")
    assert main(["advise", *GOOD, *(["depth=4"] if layout == "no mini" else [])]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: ") and out.err.count("\n") == 1


def _condition(name: str, p: Point, study: str, a: float | None) -> dict:
    return {"name": name, "study": study, "d_model": p.d_model, "depth": p.depth,
            "steps": p.steps, "warmup": p.warmup, "lrs": p.lrs, "no_difference_up_to": a,
            "off_worse_from": 0.1, "onset": "0.01 [0.005, 0.02]"}


@pytest.fixture(scope="module")
def planted_law() -> tuple[list[dict], dict]:
    """The ladder's points and the mini's depths as conditions (planted rules), and a straight
    law fitted to planted onsets."""
    ladder = [_condition(n, p, "ladder", 3e-3 if p.warmup == 30 else None)
              for n, p in POINTS.items() if not p.probe_every and p not in SCORED_POINTS]
    t = MINI.train
    mini = [_condition(f"mini depth {d}", Point("m", t.d_model, t.max_steps, t.warmup_steps, d,
                                                lrs=MINI.lrs), "mini", 1e-3) for d in MINI.depth]
    return ladder + mini, fit_law(planted(-2.0, 0.2, 0.0, spread=0.02), ReportOptions())[1]


def test_the_prediction_at_the_published_schedules_is_the_published_one(planted_law):
    _, fit = planted_law
    for p in PREDICTED:  # the study preset's schedule gives the study preset's prediction
        same = STUDY_POINT if (p.warmup, p.steps) == (STUDY_POINT.warmup, STUDY_POINT.steps) else p
        assert predict_at(fit, p.warmup, p.steps) == fit["predictions"][
            PREDICTED.index(same)]
    elsewhere = predict(fit, Point("w64-s2000-wu100", 64, 2000, 100))
    assert predict_at(fit, 100, 2000) == elsewhere


def test_the_verdict_follows_the_tested_rule_and_the_onsets_interval(planted_law):
    conditions, fit = planted_law
    lines = {lr: A.advise({"lr": lr, "warmup": 30, "steps": 300}, conditions, fit)[0]
             for lr in (1e-3, 3e-3, 4e-3, 0.01, 1.0)}
    onset = predict_at(fit, 30, 300)
    assert onset["ci_lo"] > 4e-3 and onset["ci_lo"] < 0.01 < onset["ci_hi"] < 1.0
    assert "not needed: below the tested no-difference LR" in lines[1e-3]
    assert "not needed" in lines[3e-3]  # at A itself
    assert "uncertain: between the tested no-difference LR" in lines[4e-3]
    assert "uncertain: inside the onset's interval" in lines[0.01]
    assert "needed: above the tested onset" in lines[1.0]
    # no LR decided "no difference" at the nearest condition: never "not needed"
    assert "uncertain" in A.advise({"lr": 1e-4, "warmup": 480, "steps": 4800}, conditions, fit)[0]
    # below a far condition's no-difference LR but inside the onset predicted here: uncertain
    far = {**conditions[0], "no_difference_up_to": 1.0}
    assert A.verdict(0.01, far, onset).startswith("uncertain: inside the onset's interval")


def test_the_nearest_condition_and_the_warnings(planted_law):
    conditions, fit = planted_law

    def run(**knobs) -> list[str]:
        return A.advise({"lr": 0.01, "warmup": 30, "steps": 300, **knobs}, conditions, fit)

    assert len(run()) == 3 and ": w64-s300 (" in run()[2]
    assert ": w64-s1200 (" in run(warmup=100, steps=2000)[2]
    assert ": w256-s300 (" in run(d_model=200)[2] and ": mini depth 8 (" in run(depth=8)[2]
    assert len(run(depth=8)) == 3 and len(run(depth=6)) == 3 and len(run(depth=4, steps=1200)) == 3
    warned = run(warmup=0, steps=24_414, d_model=512, depth=6, vocab=50257, lr=5.0)[3:]
    assert [w.split()[1] for w in warned] == ["warmup", "steps", "warmup", "d_model", "depth",
                                             "vocabulary", "LR"]
    assert "outside the measured 300-4,800" in warned[1] and "64-256" in warned[3]
    assert "0.41 nats per token" in warned[5]
    assert "depth 16" in run(depth=16)[3]
    assert "LR 1e-05 is outside the measured 0.0001-3" in run(lr=1e-5)[3]


@pytest.fixture(scope="module")
def published() -> tuple[list[dict], dict]:
    """The measured conditions and the law, from the published ladder archives (once)."""
    with pytest.MonkeyPatch.context() as m:
        m.chdir(ROOT)
        return A.measured(*A.sources(False))


def test_the_published_archives_answer(published, capsys, monkeypatch):
    conditions, fit = published

    def run(lr: float, warmup: int, steps: int, **knobs) -> list[str]:
        return A.advise({"lr": lr, "warmup": warmup, "steps": steps, **knobs}, conditions, fit)

    assert run(0.001, 30, 300)[0].startswith("LR 0.001, warmup 30 of 300 steps: not needed: ")
    assert run(0.1, 30, 300)[0].startswith("LR 0.1, warmup 30 of 300 steps: needed: ")
    study = run(0.03, 1000, 24_414, vocab=50257)
    onset = f"LR {fit['lr']:.3g} [{fit['ci_lo']:.3g}, {fit['ci_hi']:.3g}]"
    assert f"schedule): {onset} (95%" in study[1]
    assert (f"(1,000 warmup steps of 24,414): {onset}"
            in (ROOT / "docs" / "results.md").read_text())  # the published sentence
    assert [w.split()[1] for w in study[3:]] == ["steps", "vocabulary"]
    assert len(run(0.01, 30, 300)) == 3  # a measured condition: no warning
    # another model body: what the scored body point measured, as results.md scores it
    *_, body = run(0.03, 1000, 24_414, d_model=192)
    measured_there, predicted = re.search(
        r"depth 4; at d_model 192, depth 6 .* onset is (.+), where the law predicts (.+)$",
        body).groups()
    assert (f"| `w192-d6-s1200-wu480` | straight | {predicted} | {measured_there} ["
            in (ROOT / "docs" / "results.md").read_text())
    assert len(run(0.03, 1000, 24_414, d_model=64)) == 4  # the law's body: steps only
    # below the study schedule's tested no-difference LR: not needed on the model it was
    # measured with, uncertain on the study preset's body, whose onset was below 0.01
    assert "not needed: below" in run(0.005, 1000, 24_414, d_model=64)[0]
    assert run(0.005, 1000, 24_414, d_model=192)[0].endswith(
        "uncertain: below the tested no-difference LR (0.03 at w64-s24414-wu1000), measured at "
        "d_model 64, not yours")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(A, "measured", lambda *_: published)
    assert main(["advise", "lr=0.1", "warmup=30", "steps=300"]) == 0
    assert capsys.readouterr().out.splitlines() == run(0.1, 30, 300)
