"""Running a sweep: busy runs, a crashing run, an interrupt and the resume after it, several
processes sharing one runs/ tree, and stopping the workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from qkstudy import run_folder, sweep, trainer
from qkstudy.__main__ import main
from qkstudy.locks import RunBusy
from qkstudy.run_folder import RunFolder
from tests.tiny_sweeps import fake_trainer, status_of, tiny_words

ROOT = Path(__file__).resolve().parents[1]


# --- running: busy, failures, interrupts, resume -----------------------------------------------


def test_busy_runs_are_passed_over_and_retried_at_the_end(monkeypatch, tiny_data, tmp_path,
                                                         capsys, no_calibration):
    calls = []
    fake_trainer(monkeypatch, {"none": 1.0}, calls)
    stub = trainer.train
    attempts = {}

    def sometimes_busy(cfg, verbose=True, prefix="", repair=None, started=None):
        attempts[cfg.lr] = attempts.get(cfg.lr, 0) + 1
        if cfg.lr == 1e-3 and attempts[cfg.lr] == 1 or cfg.lr == 3e-3:
            raise RunBusy("held")
        return stub(cfg, verbose, prefix, started=started)

    monkeypatch.setattr(trainer, "train", sometimes_busy)
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,3e-3,1e-2", "refine=false")
    assert main(["sweep", *words]) == 0
    assert [c.lr for c, _ in calls] == [1e-2, 1e-3]  # 1e-3 came back free, 3e-3 never did
    out = capsys.readouterr().out
    assert "is held by a process outside this sweep; passing over" in out
    assert "1 run is held by another process" in out and "lr0.003" in out


def test_a_crashing_run_does_not_stop_the_sweep(monkeypatch, tiny_data, tmp_path, capsys,
                                               no_calibration):
    from mlx_gpt import engine

    real_build = engine.build_model

    def build(cfg, vocab_size):
        if cfg.lr == 1e-3:
            raise RuntimeError("boom")
        return real_build(cfg, vocab_size)

    monkeypatch.setattr(engine, "build_model", build)
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,1e-2", "max_steps=10",
                       "ckpt_every=10")
    assert main(["sweep", *words]) == 0
    crashed, fine = sweep.grid(sweep.parse_sweep_config(words))
    assert status_of(crashed) == "failed" and status_of(fine) == "completed"
    assert "RuntimeError: boom" in (RunFolder.of(crashed).path / "traceback.txt").read_text()
    out = capsys.readouterr().out
    assert "failed: RuntimeError: boom" in out
    assert "2 of 2 runs have a result (1 completed, 0 diverged, 1 failed)" in out


def test_interrupt_stops_cleanly_and_the_next_sweep_skips_and_resumes(monkeypatch, tiny_data,
                                                                     tmp_path, capsys,
                                                                     no_calibration):
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,3e-3,1e-2")
    first, second, third = sweep.grid(sweep.parse_sweep_config(words))
    real_stream = trainer.train_stream
    streams = []

    def ctrl_c_in_second_run(tokens, data_seed, start, *args):
        streams.append(start)
        for step, batch in enumerate(real_stream(tokens, data_seed, start, *args), start):
            if len(streams) == 2 and step == 12:
                raise KeyboardInterrupt  # as if Ctrl-C arrived while step 12 was being fetched
            yield batch

    monkeypatch.setattr(trainer, "train_stream", ctrl_c_in_second_run)
    assert main(["sweep", *words]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "python -m qkstudy sweep preset=demo" in err
    assert status_of(first) == "completed" and status_of(second) is None
    assert (RunFolder.of(second).path / "checkpoint.safetensors").exists()
    assert not RunFolder.of(third).path.exists()
    first_summary = (RunFolder.of(first).path / "summary.json").read_text()

    monkeypatch.setattr(trainer, "train_stream", real_stream)
    trained = []
    real_locked = trainer._train_locked
    monkeypatch.setattr(trainer, "_train_locked",
                        lambda cfg, *a: trained.append(cfg.lr) or real_locked(cfg, *a))
    assert main(["sweep", *words]) == 0
    assert trained == [second.lr, third.lr]
    out = capsys.readouterr().out
    assert "1 of 3 grid runs already finished; skipping them" in out
    assert (RunFolder.of(first).path / "summary.json").read_text() == first_summary
    manifest = json.loads((RunFolder.of(second).path / "manifest.json").read_text())
    assert manifest["resumed_from_step"] == 12
    steps = run_folder.read_parts(RunFolder.of(second).path / "metrics").column("step").to_pylist()
    assert steps == list(range(21))  # no duplicated or missing rows across the interruption
    assert all(status_of(c) == "completed" for c in (first, second, third))


# --- several processes on one runs/ tree ---------------------------------------------------------

WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import mlx_gpt
    from qkstudy import trainer
    from qkstudy.sweep import plan
    from qkstudy.sweep.cli import cli

    marks, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    real_locked = trainer._train_locked

    def marked(cfg, *args):
        with open(marks, "a") as f:
            f.write(f"{me} {cfg.run_id}\\n")
        # hold the run (and its lock) until the other process has begun one too, however late
        # it starts on a busy machine: then both train, and neither can take a held run
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not any(
                line.startswith(other + " ") for line in marks.read_text().splitlines()):
            time.sleep(0.01)
        return real_locked(cfg, *args)

    trainer._train_locked = marked
    plan.step_speed = lambda cfg, vocab, *a, **k: (1000.0, 3)  # plan.describe calls it
    sys.exit(cli(sys.argv[4:]))
""")


def test_two_sweep_processes_share_the_work_and_never_train_a_run_twice(tiny_data, tmp_path):
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,2e-3,3e-3,5e-3,1e-2,2e-2",
                       "max_steps=15", "ckpt_every=10")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    marks = tmp_path / "marks.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), str(marks), me, other, *words],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for me, other in (("a", "b"), ("b", "a"))]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    trained = [line.split() for line in marks.read_text().splitlines()]
    runs = sweep.grid(sweep.parse_sweep_config(words))
    assert sorted(run_id for _, run_id in trained) == sorted(c.run_id for c in runs)  # once each
    assert {who for who, _ in trained} == {"a", "b"}  # both did some of the work
    assert all(status_of(c) == "completed" for c in runs)


def test_jobs_2_runs_a_second_process_on_the_same_tree(monkeypatch, tiny_data, tmp_path,
                                                      no_calibration, capsys):
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,2e-3,3e-3,5e-3,1e-2",
                       "max_steps=15", "ckpt_every=10", "jobs=2")
    trained_here = []
    real_locked = trainer._train_locked
    log_path = run_folder.SweepFolder(tmp_path / "runs" / "t").worker_log(1)

    def marked(cfg, *args):
        trained_here.append(cfg.run_id)
        deadline = time.monotonic() + 200  # a busy machine may start the worker late
        while len(trained_here) == 1 and time.monotonic() < deadline and "[sweep" not in (
                log_path.read_text() if log_path.exists() else ""):
            time.sleep(0.05)  # hold the first run until the second process has started
        return real_locked(cfg, *args)

    monkeypatch.setattr(trainer, "_train_locked", marked)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert main(["sweep", *words]) == 0
    runs = sweep.grid(sweep.parse_sweep_config(words))
    assert all(status_of(c) == "completed" for c in runs)
    # the manifest keeps the pid of the process that trained the run last
    lock_pid = {c.run_id: RunFolder.of(c).read_manifest()["pid"] for c in runs}
    by_worker = {rid for rid, pid in lock_pid.items() if pid != os.getpid()}
    assert by_worker and trained_here  # both processes trained
    assert by_worker.isdisjoint(trained_here) and by_worker | set(trained_here) == set(lock_pid)
    log = log_path.read_text()
    assert sum(rid in log for rid in by_worker) == len(by_worker)
    out = capsys.readouterr().out
    assert "5 of 5 runs have a result (5 completed" in out
    # the console: one progress line per run, whichever process trains it; the runs the
    # worker trained are its own, not "held by another process"
    for c in runs:
        lines = [line for line in out.splitlines()
                 if line.startswith("[sweep ") and f"] lr {c.lr:.3g} arm" in line]
        assert len(lines) == 1, (c.lr, lines)
        assert ("trained by sweep process 2" in lines[0]) == (c.run_id in by_worker), lines
    assert "passing over" not in out + log and "outside this sweep" not in out + log


def test_an_interrupted_sweep_stops_the_workers_a_signal_to_it_alone_did_not_reach():
    """kill -INT <the sweep's pid> reaches the first process only: its workers get SIGINT
    after the grace period; one that stopped by itself (a terminal's Ctrl-C) gets nothing."""
    import signal
    import subprocess
    import sys

    from qkstudy.sweep.cli import stop_workers

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    # SIGINT's default disposition, even where this test runs with SIGINT ignored (a background
    # job of a non-interactive shell), which its children would otherwise inherit
    stubborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    start = time.monotonic()
    stop_workers([quick, stubborn], grace=1.0)
    assert stubborn.wait(timeout=20) != 0 and quick.returncode == 0
    assert time.monotonic() - start < 20
