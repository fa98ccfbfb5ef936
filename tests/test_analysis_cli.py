"""The analysis commands: bad input and bad options are one line and exit 2, words become the
report's options, every command has help, calibrate prints its table, and a folder of only
failed runs still gives a report that says so."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analysis import metrics as M
from analysis.__main__ import main
from analysis.load import load_runs
from analysis.report import ReportOptions
from qkstudy.errors import UsageError
from qkstudy.run_folder import RunFolder


# --- bad input --------------------------------------------------------------------------------

def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output folder is reports/<name> under here
    missing = tmp_path / "nope"
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: runs folder") and str(missing) in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert capsys.readouterr().err.startswith("error: no runs under")
    bad = tmp_path / "bad" / "sweep" / "run-a"
    bad.mkdir(parents=True)
    (bad / "summary.json").write_text('{"status": "completed"}')
    assert main(["report", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no usable runs") and "sweep/run-a" in err
    assert not (tmp_path / "reports").exists()  # nothing half-written
    with pytest.raises(UsageError, match="does not exist"):
        load_runs(missing)


@pytest.mark.parametrize("words, message", [
    (["colour=red"], "unknown key 'colour'"),
    (["alpha=1.5"], "alpha must be between 0 and 1, not 1.5"),
    (["alpha=0"], "alpha must be between 0 and 1, not 0"),
    (["alpha=x"], "alpha must be a number; got 'x'"),
    (["min_gap=-0.1"], "min_gap must be >= 0 nats, not -0.1"),
    (["min_gap=nan"], "min_gap must be >= 0 nats"),
    (["threshold=0"], "threshold must be a finite loss > 0"),
    (["curve_lrs=a,b"], "curve_lrs takes comma-separated numbers, not 'a,b'"),
    (["curve_lrs=0.01,-1"], "learning rates must be finite and > 0"),
    (["--out", "x"], "unknown flag --out: options are key=value words"),
    (["alpha=0.1", "other"], "RUNS_DIR (and OTHER_RUNS_DIR) come first"),
    (["runs"], "compared with itself: give framework=A,B"),  # the same folder again
    (["alpha=0.1", "alpha=0.2"], "alpha is given twice"),
])
def test_a_bad_report_option_is_one_line_and_writes_nothing(words, message, tmp_path, capsys,
                                                           monkeypatch):
    """Every option is checked before anything is read or written: one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    assert main(["report", str(runs), *words, f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing written


def test_report_words_become_the_report_options(tmp_path, monkeypatch):
    from analysis.report import parse_args

    monkeypatch.chdir(tmp_path)
    runs_dir, out, options = parse_args([])
    assert (runs_dir, out) == (Path("runs"), Path("reports") / "runs")
    assert options == ReportOptions()  # the defaults are the report's own
    runs_dir, out, options = parse_args(
        ["runs/demo", "out=elsewhere", "threshold=2.5", "curve_lrs=0.01, 0.1", "probes=q_rms,",
         "alpha=0.1", "min-gap=0.05"])
    assert (runs_dir, out) == (Path("runs/demo"), Path("elsewhere"))
    assert options == ReportOptions(loss_threshold=2.5, curve_lrs=(0.01, 0.1),
                                    probe_names=("q_rms",),
                                    study=M.Options(alpha=0.1, min_gap=0.05))
    assert parse_args(["runs/demo", "threshold="])[2].loss_threshold is None
    assert parse_args(["runs/demo"])[1] == Path("reports") / "demo"


@pytest.mark.parametrize("command", ["report", "calibrate"])
def test_every_analysis_command_has_help(command, capsys):
    assert main([command, "help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m analysis {command}")
    assert main([command, "-h"]) == 0 and capsys.readouterr().out == out


def test_the_analysis_commands_are_listed_and_an_unknown_one_is_one_line(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {c} " in out for c in ("report", "calibrate"))
    assert main(["plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown command 'plot'") and err.count("\n") == 1


@pytest.mark.parametrize("words, message", [
    (["studies=0"], "studies must be >= 1, not 0"),
    (["studies=2.5"], "studies must be an integer; got '2.5'"),
    (["seeds=3,6"], "seeds must be an integer; got '3,6'"),
    (["seeds=1"], "seeds must be >= 2 (a paired test needs two), not 1"),
    (["--studies", "5"], "expected key=value, got '--studies'"),
    (["trials=5"], "unknown key 'trials'"),
    (["scenarios=nul"], "unknown scenario 'nul'; known: null, same onset"),
    (["onset_sd=-0.1"], "onset_sd must be >= 0 decades, not -0.1"),
])
def test_a_bad_calibrate_option_is_one_line(words, message, capsys):
    assert main(["calibrate", *words]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_calibrate_command_prints_the_table_and_its_verdict(capsys):
    # one study per scenario bounds no rate below 5% (0 of 1: up to 97.5%): exit 1
    assert main(["calibrate", "studies=1", "seeds=3", "scenarios=null", "onset_sd=0.05"]) == 1
    out = capsys.readouterr().out
    assert "onsets scatter by 0.050 decades" in out
    assert out.count("| null | H") >= 5 and "same onset" not in out
    assert "largest upper 95% bound" in out and "must be < 5%" in out


def test_a_folder_of_only_failed_runs_gives_a_report_that_says_so(tiny_cfg, tmp_path,
                                                                   monkeypatch, capsys):
    from mlx_gpt import engine
    from qkstudy import trainer

    cfg = tiny_cfg()

    def boom(*args, **kwargs):
        raise RuntimeError("the model could not be built")

    monkeypatch.setattr(engine, "build_model", boom)
    with pytest.raises(RuntimeError):
        trainer.train(cfg, verbose=False)
    out = tmp_path / "failed-report"
    assert main(["report", str(RunFolder.of(cfg).path.parent), f"out={out}"]) == 0
    assert "no finished runs" in capsys.readouterr().out
    page = (out / "report.html").read_text()
    assert "All 1 runs" in page and "the model could not be built" in page
    assert pl.read_csv(out / "tables" / "runs.csv")["status"].to_list() == ["failed"]
