"""Repair without loss: a finished run whose files are damaged is moved aside whole to
<sweep>/.damaged/ and trained again, by `train repair=true` and by every sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkstudy import files as qfiles
from qkstudy import run_folder, status, sweep, trainer
from qkstudy.__main__ import main
from qkstudy.errors import UsageError
from qkstudy.sweep.plan import command_line
from qkstudy.sweep.run import finished_after_grid
from qkstudy.run_folder import RunFolder

COLUMNS = ["step", "train_loss", "grad_norm", "val_loss", "lr"]


def files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, but the run lock (a repair takes it)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def rows(folder: Path) -> dict:
    return run_folder.read_parts(folder / "metrics").select(COLUMNS).to_pydict()


def damage(folder: Path, how: str) -> None:
    part = run_folder.parts(folder / "metrics")[-1][1]
    if how == "truncated metrics part":
        part.write_bytes(part.read_bytes()[:60])
    elif how == "deleted metrics part":
        part.unlink()
    elif how == "summary.json not JSON":
        (folder / "summary.json").write_text("{not json")
    else:  # a JSON value that is not an object
        (folder / "summary.json").write_text("[1, 2]")


HOWS = ["truncated metrics part", "deleted metrics part", "summary.json not JSON",
        "summary.json a list"]


@pytest.fixture
def finished(tiny_cfg):
    """A finished tiny run: (config, its metric rows, its summary)."""
    cfg = tiny_cfg(max_steps=12, ckpt_every=10, eval_every=6, probe_every=6)
    summary = trainer.train(cfg, verbose=False)
    return cfg, rows(RunFolder.of(cfg).path), summary


def moved_aside(cfg) -> Path:
    aside = sorted(p for p in (RunFolder.of(cfg).path.parent / ".damaged").iterdir()
                   if p.is_dir())
    assert [p.name.rsplit("-", 1)[0] for p in aside] == [cfg.run_id]
    return aside[0]


@pytest.mark.parametrize("how", HOWS)
def test_train_repair_moves_the_damaged_run_aside_whole_and_retrains_it(finished, how, capsys):
    cfg, before, summary = finished
    folder = RunFolder.of(cfg).path
    damage(folder, how)
    damaged = files(folder)
    words = command_line(cfg).split()[4:]
    assert main(["train", *words]) == 2  # without repair=true: reported, nothing moved
    assert files(folder) == damaged and not (folder.parent / ".damaged").exists()
    capsys.readouterr()

    assert main(["train", *words, "repair=true"]) == 0
    out = capsys.readouterr().out
    old = moved_aside(cfg)
    assert "repair: " in out and str(old) in out
    assert files(old) == damaged  # every old file, byte for byte
    record = json.loads(old.with_name(old.name + ".json").read_text())
    assert record["run_id"] == cfg.run_id and record["moved_to"] == str(old) and record["damage"]
    # the run is trained again, to the same result (training is deterministic)
    again = qfiles.read_json(folder / "summary.json")
    assert again["status"] == "completed"
    assert again["final_weights_sha256"] == summary["final_weights_sha256"]
    assert rows(folder) == before
    # intact now: a second repair=true skips it and moves nothing
    assert main(["train", *words, "repair=true"]) == 0
    assert "already completed; skipping" in capsys.readouterr().out
    assert moved_aside(cfg) == old


@pytest.mark.parametrize("word", ["repair=maybe", "repair", "repair=true repair=false"])
def test_bad_repair_word_is_one_line(word, tiny_cfg, capsys):
    words = command_line(tiny_cfg()).split()[4:]
    assert main(["train", *words, *word.split()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "repair" in err and err.count("\n") == 1


def test_repair_does_not_change_the_run_id(tiny_cfg):
    words = command_line(tiny_cfg()).split()[4:]
    plain, repair = trainer.parse_args(words)
    assert not repair
    cfg, repair = trainer.parse_args([*words, "repair=true"])
    assert repair and cfg.run_id == plain.run_id
    with pytest.raises(UsageError, match="repair must be true or false"):
        trainer.parse_args([*words, "repair=maybe"])


def sweep_words(data: str, runs_dir: Path) -> list[str]:
    return ["sweep", "preset=demo", f"data={data}", f"runs_dir={runs_dir}", "name=t", "depth=1",
            "d_model=32", "n_heads=2", "block_size=32", "batch_size=4", "max_steps=10",
            "warmup_steps=2", "eval_every=5", "eval_batches=2", "probe_every=5", "log_every=5",
            "ckpt_every=10", "arms=none", "seeds=0", "lrs=1e-3,3e-3", "jobs=1",
            "divergence_window=5", "--no-notify"]


@pytest.mark.parametrize("how", ["truncated metrics part", "summary.json not JSON"])
def test_the_sweep_repairs_a_damaged_run_and_says_where_the_old_files_are(
        how, tiny_data, tmp_path, monkeypatch, capsys):
    from analysis.load import load_runs

    monkeypatch.setattr(sweep.plan, "step_speed", lambda cfg, vocab, **k: (1000.0, 3))
    words = sweep_words(tiny_data, tmp_path / "runs")
    assert main(words) == 0
    first, second = sweep.grid(sweep.parse_sweep_config(words[1:-1]))
    folder = RunFolder.of(first).path
    before = rows(folder)
    damage(folder, how)
    damaged = files(folder)
    capsys.readouterr()

    assert main(words) == 0  # the same command
    out = capsys.readouterr().out
    old = moved_aside(first)
    assert files(old) == damaged
    assert rows(folder) == before and qfiles.read_json(folder / "summary.json")["status"] == \
        "completed"
    closing = next(line for line in out.splitlines() if line.startswith("sweep t: "))
    assert "2 of 2 runs have a result" in closing and "1 damaged run repaired" in closing
    assert f"repaired: {first.run_id}" in out and str(old) in out

    shown = status.render(folder.parent)
    assert "repaired" in shown and first.run_id in shown and str(old) in shown
    # the analysis reads the new folder only: the copy under .damaged/ is not a run
    loaded = load_runs(tmp_path / "runs")
    assert sorted(loaded.table["run_id"].to_list()) == sorted([first.run_id, second.run_id])
    assert not any(".damaged" in w for w in loaded.warnings)


def test_the_analysis_skips_dot_folders(finished, tmp_path):
    import shutil

    from analysis.load import load_runs

    cfg, _, _ = finished
    sweep_dir = RunFolder.of(cfg).path.parent
    shutil.copytree(RunFolder.of(cfg).path, sweep_dir / ".damaged" / f"{cfg.run_id}-x")
    loaded = load_runs(sweep_dir.parent)
    assert loaded.table["run_id"].to_list() == [cfg.run_id]
    assert not loaded.warnings


def test_the_sweep_repairs_a_damaged_refinement_run(tiny_data, tmp_path, monkeypatch, capsys):
    """Runs after the grid are read by the replay from summary.json alone; their files are
    checked by the sweep too (found by the storm test: a truncated part of a refinement run
    stayed damaged)."""
    monkeypatch.setattr(sweep.plan, "step_speed", lambda cfg, vocab, **k: (1000.0, 3))
    words = sweep_words(tiny_data, tmp_path / "runs")
    words = [w for w in words[:-1] if not w.startswith("lrs=")] + [
        "lrs=1e-3,30", "refine=true", "refine_steps=1", words[-1]]
    assert main(words) == 0
    cfg = sweep.parse_sweep_config(words[1:-1])
    after = finished_after_grid(cfg, sweep.grid(cfg))
    assert [c.lr for c in after] == [0.173]  # the bisection point between 1e-3 and 30
    folder = RunFolder.of(after[0]).path
    before = rows(folder)
    damage(folder, "truncated metrics part")
    damaged = files(folder)
    capsys.readouterr()

    assert main(words) == 0  # the same command
    out = capsys.readouterr().out
    old = moved_aside(after[0])
    assert files(old) == damaged and rows(folder) == before
    assert f"repaired: {after[0].run_id}" in out
