"""`qkstudy status`: a fixture sweep with a run in every state, the ETA arithmetic, Slurm
columns, read-only behaviour and the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qkstudy import files, provenance, run_folder, status
from qkstudy.run_folder import RunFolder, SweepFolder
from qkstudy.__main__ import main

from qkstudy.sweep import slurm

TPS = 4 * 32  # tokens a step in the fixture


def fake_run(sweep: Path, run_id: str, lr: float, qk: str = "none", *, summary: dict | None = None,
             checkpoint: tuple[int, float] | None = None, rows: int = 0) -> Path:
    """A run folder as train.py leaves it: config.json, optional summary.json, a checkpoint
    (step, training seconds) and metrics rows 0..rows-1 (train loss 5 - step/100)."""
    folder = sweep / run_id
    folder.mkdir(parents=True)
    files.write_json(folder / "config.json", {
        "run_id": run_id, "depth": 1, "lr": lr, "qk_norm": qk, "seed": 0, "batch_size": 4,
        "block_size": 32, "max_steps": 100, "budget_tokens": 0})
    if summary is not None:
        files.write_json(folder / "summary.json", {"run_id": run_id, "steps": 100, **summary})
    if checkpoint is not None:
        step, seconds = checkpoint
        files.save_tensors(folder / "checkpoint.safetensors", {"opt.step": np.array(step)},
                            {"step": str(step), "train_seconds": repr(seconds)})
    if rows:
        run_folder.write_part(folder / "metrics", [
            {"step": s, "tokens": s * TPS, "lr": lr, "train_loss": 5 - s / 100, "grad_norm": 1.0,
             "val_loss": None, "val_ppl": None, "elapsed_s": float(s)} for s in range(rows)],
            run_folder.METRICS_SCHEMA)
    return folder


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    """Sweep `s`: grid LRs 1e-3, 1e-2, 1e-1, 1 x arms none, rmsnorm; one run in each state and
    two grid points with no folder yet."""
    sweep = tmp_path / "runs" / "s"
    sweep.mkdir(parents=True)
    files.write_json(sweep / "sweep.json", {"grid_lrs": [1e-3, 1e-2, 1e-1, 1.0], "depths": [1],
                                             "seeds": [0], "arms": ["none", "rmsnorm"],
                                             "refine": False})
    done = fake_run(sweep, "d1-noqk-lr0.001-s0-aaa", 1e-3, summary={
        "status": "completed", "final_val_loss": 2.5, "tokens_per_second": 1000.0}, rows=99)
    run_folder.write_part(done / "metrics", [  # the last part ends on an evaluation-only row
        {"step": 99, "tokens": 99 * TPS, "lr": 1e-3, "train_loss": 4.01, "grad_norm": 1.0,
         "val_loss": None, "val_ppl": None, "elapsed_s": 99.0},
        {"step": 100, "tokens": 100 * TPS, "lr": 1e-3, "train_loss": None, "grad_norm": None,
         "val_loss": 2.5, "val_ppl": 12.2, "elapsed_s": 100.0}], run_folder.METRICS_SCHEMA)
    fake_run(sweep, "d1-qkrmsnorm-lr0.001-s0-bbb", 1e-3, "rmsnorm", summary={
        "status": "completed", "final_val_loss": 2.4, "tokens_per_second": 3000.0})
    fake_run(sweep, "d1-noqk-lr1-s0-ccc", 1.0, summary={"status": "diverged",
                                                      "diverged_step": 37})
    fake_run(sweep, "d1-qkrmsnorm-lr1-s0-ddd", 1.0, "rmsnorm", summary={
        "status": "failed", "error": "RuntimeError: out of memory\nmore"})
    fake_run(sweep, "d1-noqk-lr0.01-s0-eee", 1e-2, checkpoint=(40, 2.56), rows=40)  # running
    stale = fake_run(sweep, "d1-qkrmsnorm-lr0.01-s0-fff", 1e-2, "rmsnorm", checkpoint=(20, 1.0),
                     rows=20)
    (stale / ".lock").write_text("999999999\n")  # a holder that is gone: interrupted
    return sweep


def row(text: str, run_id: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(run_id))


def snapshot(folder: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_every_state_on_one_screen(sweep_dir):
    running = sweep_dir / "d1-noqk-lr0.01-s0-eee"
    with RunFolder(running).lock() as acquired:
        assert acquired
        before = snapshot(sweep_dir.parent)
        text = status.render(sweep_dir)
        assert snapshot(sweep_dir.parent) == before  # reads only: no file written or touched
    assert "8 runs: 2 completed, 1 diverged, 1 failed, 1 running, 1 interrupted, 2 waiting" in text
    assert "completed val 2.5000" in row(text, "d1-noqk-lr0.001-s0-aaa")
    assert row(text, "d1-noqk-lr0.001-s0-aaa").split()[-2] == "4.0100"  # its latest train loss
    assert "diverged at step 37" in row(text, "d1-noqk-lr1-s0-ccc")
    failed = row(text, "d1-qkrmsnorm-lr1-s0-ddd")
    assert "failed RuntimeError: out of memory" in failed and "more" not in failed
    live = row(text, "d1-noqk-lr0.01-s0-eee").split()
    # step from the checkpoint, loss from the last metrics row, tok/s = 40 x 128 / 2.56 s
    assert live[1:4] == ["running", "pid", str(os.getpid())]
    assert live[4:7] == ["40/100", "4.6100", "2,000"]
    assert "interrupted checkpoint at step 20" in row(text, "d1-qkrmsnorm-lr0.01-s0-fff")
    for name in ("d1-none-lr0.1-s0", "d1-rmsnorm-lr0.1-s0"):
        assert row(text, name).split()[1] == "waiting"
    # done: 2 completed + 1 diverged in full (300 steps) + 40 + 20 steps of 8 x 100 planned
    assert "progress 45% of 102,400 planned tokens" in text
    # left: 440 steps x 128 tokens at the running run's 2,000 tok/s
    assert f"ETA {status.format_seconds(440 * TPS / 2000)} at 2,000 tok/s (1 run training)" in text
    # in one process: 60 + 80 + 100 + 100 steps left (the failed run waits for a retry) at
    # the median tok/s of depth 1's finished runs (1,000 and 3,000)
    assert (f"time left: ~{status.format_seconds(340 * TPS / 2000)} for 4 of the 4 runs left in "
            f"one process here, on {provenance.host()} (training only; tok/s measured by its "
            "runs finished here (depth 1))") in text
    assert f"report: none yet in reports/s (just report {sweep_dir})" in text


def test_time_left_from_the_calibration_then_the_report(sweep_dir, tmp_path, monkeypatch):
    SweepFolder(sweep_dir).write_speeds({2: 640.0})  # this machine's calibration
    SweepFolder(sweep_dir, "gpu-1").write_speeds({2: 64e6})  # another's, copied in: not used
    fake_run(sweep_dir, "d2-noqk-lr0.001-s0-ggg", 1e-3)  # depth 1 in fake_run's config ...
    config = files.read_json(sweep_dir / "d2-noqk-lr0.001-s0-ggg" / "config.json")
    files.write_json(sweep_dir / "d2-noqk-lr0.001-s0-ggg" / "config.json", config | {"depth": 2})
    text = status.render(sweep_dir)
    assert (f"time left: ~{status.format_seconds(340 * TPS / 2000 + 100 * TPS / 640)} for 5 of "
            f"the 5 runs left in one process here, on {provenance.host()} (training only; tok/s "
            "measured by its runs finished here (depth 1) and calibrated here at the sweep's "
            "start (depth 2))") in text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "s").mkdir(parents=True)
    (tmp_path / "reports" / "s" / "report.html").write_text("<html></html>")
    os.utime(tmp_path / "reports" / "s" / "report.html", (1, 1))  # built before every run
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(1))
    assert (f"report: reports/s/report.html (built {built}; 4 runs ended since: just report "
            f"{sweep_dir})") in status.render(sweep_dir)


def test_lock_held_by_another_process_is_running(sweep_dir):
    folder = sweep_dir / "d1-noqk-lr0.01-s0-eee"
    code = ("import sys, time; from pathlib import Path; from qkstudy.run_folder import RunFolder\n"
            "with RunFolder(Path(sys.argv[1])).lock() as ok:\n    print(ok, flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        runs = {r.run_id: r for r in status.sweep_runs(sweep_dir, status.flock_holders())}
        assert (runs[folder.name].state, runs[folder.name].holder) == ("running", holder.pid)
    finally:
        holder.kill()
        holder.wait()
    runs = {r.run_id: r for r in status.sweep_runs(sweep_dir, status.flock_holders())}
    assert runs[folder.name].state == "interrupted"  # its holder died: the lock is free


def test_eta_arithmetic():
    def run(state, step, tok_s=None):
        return status.Run("r", steps=100, tokens_per_step=10, state=state, step=step,
                          tok_s=tok_s)

    runs = [run("completed", 100, 400.0), run("diverged", 30), run("running", 40, 50.0),
            run("interrupted", 20), run("waiting", 0)]
    done, total, rate, n = status.progress(runs)
    assert (done, total, rate, n) == (1000 + 1000 + 400 + 200, 5000, 50.0, 1)
    # two processes add up; a run with no measured rate yet counts at the finished runs' mean
    runs += [run("running", 0)]
    assert status.progress(runs)[2:] == (450.0, 2)
    assert status.format_seconds(3725) == "1h02m" and status.format_seconds(65) == "1m05s"


def test_slurm_task_states_beside_runs(sweep_dir, monkeypatch):
    folder = sweep_dir / "slurm" / "001"
    folder.mkdir(parents=True)
    runs = [{"run_id": r, "depth": 1, "lr": 1e-2, "arm": qk, "seed": 0, "steps": 100,
             "tokens_per_step": TPS} for r, qk in (("d1-noqk-lr0.01-s0-eee", "none"),
                                                    ("d1-qkrmsnorm-lr0.01-s0-fff", "rmsnorm"),
                                                    ("d1-noqk-lr0.1-s0-ggg", "none"))]
    files.write_json(folder / "submission.json", {"job_id": "77", "runs": runs})
    (folder / "task-1.log").write_text("task 1: ...\n")
    monkeypatch.setattr(slurm, "task_states",
                        lambda jobs, ended=False: None if ended else {("77", 0): "RUNNING"})
    text = status.render(sweep_dir)
    assert "Slurm task states from squeue" in text
    assert row(text, "d1-noqk-lr0.01-s0-eee").endswith("77_0 RUNNING")
    assert row(text, "d1-qkrmsnorm-lr0.01-s0-fff").endswith("77_1 ended")
    # a submitted run with no folder yet is listed (waiting) with its task
    assert row(text, "d1-noqk-lr0.1-s0-ggg").split()[1] == "waiting"
    assert row(text, "d1-noqk-lr0.1-s0-ggg").endswith("77_2 not in queue")
    monkeypatch.setattr(slurm, "task_states", lambda jobs, ended=False: None)  # files only
    text = status.render(sweep_dir)
    assert "Slurm task states from files" in text
    assert row(text, "d1-qkrmsnorm-lr0.01-s0-fff").endswith("77_1 log written")
    assert row(text, "d1-noqk-lr0.1-s0-ggg").endswith("77_2 submitted")


def test_command_line(sweep_dir, capsys, tmp_path):
    assert main(["status", str(sweep_dir.parent)]) == 0  # a runs folder: each sweep in it
    out = capsys.readouterr().out
    assert out.startswith("sweep s ") and "d1-noqk-lr1-s0-ccc" in out
    assert main(["status", str(sweep_dir / "d1-noqk-lr1-s0-ccc")]) == 2
    assert "is a run folder; give its sweep folder" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert main(["status", str(sweep_dir), "--fast"]) == 2
    for bad in ("--watch=0", "--watch=-1", "--watch=soon", "--watch=inf"):
        assert main(["status", str(sweep_dir), bad]) == 2
    assert main(["status", str(tmp_path / "nowhere"), "--watch"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert [e.split(":")[0] for e in errors] == ["error"] * 7
    assert errors[3] == "error: --watch=-1: give a number of seconds > 0"
    assert errors[4] == "error: --watch=soon: not a number of seconds"
    assert main(["status", "--help"]) == 0 and "[--watch[=SECONDS]]" in capsys.readouterr().out


def watched(monkeypatch, frames: int, between=lambda: None) -> list[float]:
    """Stop the watch at its `frames`-th sleep as Ctrl-C does; the sleeps asked for."""
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        between()
        if len(slept) == frames:
            raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", sleep)
    return slept


def test_watch_redraws_in_place_until_ctrl_c(sweep_dir, capsys, monkeypatch):
    running = sweep_dir / "d1-noqk-lr0.01-s0-eee"

    def finish_the_run() -> None:  # between the frames the interrupted run finishes
        files.write_json(running / "summary.json", {"run_id": running.name, "steps": 100,
                                                    "status": "completed", "final_val_loss": 2.2})

    slept = watched(monkeypatch, 2, finish_the_run)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["status", str(sweep_dir), "--watch=2.5"]) == 0
    out = capsys.readouterr().out
    frames = out.split(status.CLEAR)
    assert slept == [2.5, 2.5] and frames[0] == "" and len(frames) == 3
    assert all(f.startswith("sweep s ") and "(every 2.5 s; Ctrl-C stops)" in f
               for f in frames[1:])
    assert "interrupted checkpoint at step 40" in row(frames[1], running.name)
    assert "completed val 2.2000" in row(frames[2], running.name)


def test_watch_into_a_file_appends_frames_without_escape_codes(sweep_dir, capsys, monkeypatch):
    slept = watched(monkeypatch, 3)
    assert main(["status", str(sweep_dir.parent), "--watch"]) == 0  # a runs folder, 5 s
    out = capsys.readouterr().out
    assert slept == [status.WATCH_SECONDS] * 3 and "\033" not in out
    assert out.count("sweep s  (") == 3


def test_ctrl_c_ends_a_watch_with_exit_0(sweep_dir):
    watch = subprocess.Popen([sys.executable, "-m", "qkstudy", "status", str(sweep_dir),
                              "--watch=0.1"], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    try:
        for line in watch.stdout:  # the first frame drawn whole
            if "Ctrl-C stops" in line:
                break
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=60) == 0
    finally:
        watch.kill()
