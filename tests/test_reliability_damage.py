"""Reliability against damage: checkpoints and parts damaged before a resume, a finished run
with a damaged part, summaries that are not summaries, a full disk, leftover temporary files,
a run that kills its process, and failed runs trained again or listed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qkstudy import files, run_folder
from qkstudy.run_folder import RunFolder
from qkstudy.sweep.plan import command_line
# what a run is compared by, here, in the signal tests and in the storm test
from reliability.compare import metric_rows as _metric_rows, probe_rows as _probe_rows

ROOT = Path(__file__).resolve().parents[1]


# --- damaged files -------------------------------------------------------------------------------

def _interrupted_at_10(cfg, monkeypatch):
    """Train `cfg` and stop it by Ctrl-C at step 10 (a checkpoint there)."""
    from qkstudy import trainer

    real = trainer.Display.update

    def update(self, step, *args):
        if step == 10:
            raise KeyboardInterrupt
        return real(self, step, *args)

    monkeypatch.setattr(trainer.Display, "update", update)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, verbose=False)
    monkeypatch.setattr(trainer.Display, "update", real)
    assert (RunFolder.of(cfg).path / "checkpoint.safetensors").exists()


@pytest.fixture
def reference(tiny_cfg):
    from qkstudy.trainer import train

    cfg = tiny_cfg(max_steps=20, ckpt_every=10)
    train(cfg, verbose=False)
    return cfg


def _same_as(cfg, ref) -> None:
    assert _metric_rows(RunFolder.of(cfg).path) == _metric_rows(RunFolder.of(ref).path)
    assert _probe_rows(RunFolder.of(cfg).path) == _probe_rows(RunFolder.of(ref).path)


@pytest.mark.parametrize("damage", ["flip a tensor byte", "truncate", "garbage",
                                    "drop a metrics part", "truncate a probes part"])
def test_damage_found_at_resume_restarts_from_step_0(reference, tmp_path, monkeypatch, capsys,
                                                     damage):
    import dataclasses

    from qkstudy.trainer import train

    cfg = dataclasses.replace(reference, runs_dir=str(tmp_path / "damaged"))
    _interrupted_at_10(cfg, monkeypatch)
    folder = RunFolder.of(cfg).path
    ckpt = folder / "checkpoint.safetensors"
    data = bytearray(ckpt.read_bytes())
    if damage == "flip a tensor byte":
        data[-5] ^= 0x40
        ckpt.write_bytes(bytes(data))
    elif damage == "truncate":
        ckpt.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "garbage":
        ckpt.write_bytes(b"not a checkpoint")
    elif damage == "drop a metrics part":
        run_folder.parts(folder / "metrics")[0][1].unlink()
    else:
        part = run_folder.parts(folder / "probes")[0][1]
        part.write_bytes(part.read_bytes()[:100])
    capsys.readouterr()
    assert train(cfg, verbose=False)["status"] == "completed"
    err = capsys.readouterr().err
    assert "restarting the run from step 0" in err and err.count("\n") == 1, err
    assert "resumed_from_step" not in json.loads((folder / "manifest.json").read_text())
    _same_as(cfg, reference)


def test_finished_run_with_a_damaged_part_is_reported_with_its_repair(reference, capsys):
    from qkstudy.__main__ import main

    folder = RunFolder.of(reference).path
    part = run_folder.parts(folder / "metrics")[-1][1]
    intact = part.read_bytes()
    part.write_bytes(intact[:50])
    words = command_line(reference).split()[4:]
    assert main(["train", *words]) == 2
    err = capsys.readouterr().err
    assert "completed but damaged" in err and "repair=true" in err and err.count("\n") == 1
    (folder / "final.safetensors").write_bytes(b"x")  # final weights are checked too
    part.write_bytes(intact)
    assert main(["train", *words]) == 2
    assert "final.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["[1, 2]", "{\"status\": 3}", "{not json", "\"completed\""])
def test_summary_that_is_not_a_summary_is_one_line(reference, capsys, content):
    from qkstudy.__main__ import main

    path = RunFolder.of(reference).path / "summary.json"
    path.write_text(content)
    assert main(["train", *command_line(reference).split()[4:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(path) in err and "rm " in err and err.count("\n") == 1


def test_disk_full_is_one_line_and_the_run_resumes(reference, tmp_path, monkeypatch, capsys):
    import dataclasses
    import errno

    from qkstudy.__main__ import main

    cfg = dataclasses.replace(reference, runs_dir=str(tmp_path / "full"))
    real = files.save_tensors

    def full(path, *args):
        if path.name == "final.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args)

    monkeypatch.setattr(files, "save_tensors", full)
    words = command_line(cfg).split()[4:]
    assert main(["train", *words]) == 2
    err = capsys.readouterr().err
    assert "No space left on device; free some space" in err and err.count("\n") == 1
    folder = RunFolder.of(cfg).path
    assert (folder / "checkpoint.safetensors").exists() and not (folder / "summary.json").exists()
    monkeypatch.setattr(files, "save_tensors", real)
    assert main(["train", *words]) == 0
    _same_as(cfg, reference)


def test_leftover_temp_files_of_dead_processes_are_removed(tiny_cfg):
    from qkstudy.trainer import train

    cfg = tiny_cfg(max_steps=10)
    folder = RunFolder.of(cfg).path
    (folder / "metrics").mkdir(parents=True)
    dead = 2**22 + 17  # above the default pid_max: no such process
    leftovers = [folder / ".checkpoint.tmp.safetensors", folder / f".manifest.json.tmp-{dead}",
                 folder / "metrics" / f".part-00000000-00000009.parquet.tmp-{dead}"]
    alive = folder / f".summary.json.tmp-{os.getppid()}"  # a live process's file stays
    for path in [*leftovers, alive]:
        path.write_bytes(b"x" * 100)
    assert train(cfg, verbose=False)["status"] == "completed"
    assert not any(p.exists() for p in leftovers) and alive.exists()
    assert files.read_tensors(folder / "final.safetensors")[1]["sha256"] == json.loads(
        (folder / "summary.json").read_text())["final_weights_sha256"]


CRASH = textwrap.dedent("""
    import faulthandler, sys
    import mlx_gpt
    from qkstudy import trainer
    trainer.resume_point = lambda *args: faulthandler._sigsegv()  # inside a run, not calibration
    from qkstudy.__main__ import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_run_that_kills_its_process_is_recorded_failed_and_not_retried(tiny_data, tmp_path,
                                                                         capsys):
    from qkstudy import sweep
    from qkstudy.__main__ import main

    words = ["preset=demo", f"data={tiny_data}", f"runs_dir={tmp_path / 'runs'}", "name=t",
             "depth=1", "d_model=16", "n_heads=2", "block_size=16", "batch_size=2",
             "max_steps=5", "warmup_steps=1", "eval_every=5", "eval_batches=1", "probe_every=5",
             "log_every=5", "ckpt_every=5", "arms=none", "seeds=0", "lrs=1e-3,1e-2", "jobs=1",
             "--no-notify"]
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    out = subprocess.run([sys.executable, str(script), "sweep", *words], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == -signal.SIGSEGV
    crashed, fine = sweep.grid(sweep.parse_sweep_config(words[:-1]))
    assert main(["sweep", *words]) == 0  # the next sweep records it failed and goes on
    summary = json.loads((RunFolder.of(crashed).path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["fatal_signal"]
    assert "Segmentation fault" in summary["error"]
    assert "Segmentation fault" in (RunFolder.of(crashed).path / "traceback.txt").read_text()
    assert json.loads((RunFolder.of(fine).path / "summary.json").read_text())["status"] == "completed"
    capsys.readouterr()
    assert main(["sweep", *words]) == 0  # and does not retry it
    assert "not retried" in capsys.readouterr().out


def test_a_failed_run_trained_again_keeps_no_traceback(tiny_cfg, monkeypatch):
    """traceback.txt belongs to a failed summary: once the run is retried and finishes, it goes
    (found by the storm test: a completed run still held an earlier attempt's traceback)."""
    from qkstudy import recorder
    from qkstudy.trainer import train

    cfg = tiny_cfg(max_steps=10)
    real = recorder.Recorder.finish

    def broken(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(recorder.Recorder, "finish", broken)
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, verbose=False)
    folder = RunFolder.of(cfg).path
    assert json.loads((folder / "summary.json").read_text())["status"] == "failed"
    assert "boom" in (folder / "traceback.txt").read_text()
    monkeypatch.setattr(recorder.Recorder, "finish", real)
    assert train(cfg, verbose=False)["status"] == "completed"
    assert not (folder / "traceback.txt").exists()


def test_failed_runs_are_listed_by_the_analysis(reference, tmp_path):
    from analysis.load import load_runs
    from qkstudy.trainer import summary_base

    failed = RunFolder.of(reference).path.parent / "d2-noqk-lr0.1-s0-failedrun"
    failed.mkdir()
    cfg = reference.__class__(**{**reference.__dict__, "lr": 0.1})
    RunFolder(failed).record_failure({**summary_base(cfg), "run_id": failed.name},
                                     RuntimeError("boom"))
    runs = load_runs(RunFolder.of(reference).path.parent)
    row = runs.table.filter(runs.table["status"] == "failed").to_dicts()
    assert len(row) == 1 and row[0]["lr"] == 0.1
    assert any("RuntimeError: boom" in w for w in runs.warnings)
