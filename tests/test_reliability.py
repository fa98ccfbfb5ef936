"""Reliability: interrupts at random times, damaged and hostile files, bad input, leftovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlx_gpt import runlog
from mlx_gpt.sweep.plan import command_line
from mlx_gpt.train import run_dir_of

ROOT = Path(__file__).resolve().parents[1]

# --- Ctrl-C / SIGTERM at random times: resume must be bit-exact ---------------------------------

# A fork server: it imports the trainer once (and never runs MLX itself), then forks one child
# per run, so each trial costs a fork, not an interpreter start. Children run the real CLI.
FORK_SERVER = textwrap.dedent("""
    import json, os, random, signal, sys, time
    from pathlib import Path
    import mlx_gpt
    from mlx_gpt import interrupts, runlog
    from mlx_gpt.__main__ import main

    # Python's own after-fork hooks run in the child before the CLI installs its handlers, and
    # swallow a KeyboardInterrupt raised there; the CLI's handler (which also notes the signal
    # for the run's Deferred block) is installed here already so the forked child has it.
    for s in interrupts.SIGNALS:
        signal.signal(s, interrupts._raise)

    words, root, trials, seed = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), \\
        int(sys.argv[4])

    def run(runs_dir, delay=None, signum=signal.SIGINT):
        t0 = time.monotonic()
        signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)  # until the child's try
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                os.setpgid(0, 0)  # its own process group, as a job in a terminal
                log = os.open(f"{runs_dir}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.dup2(log, 1)
                os.dup2(log, 2)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.SIGNALS)
                code = main(["train", *words, f"runs_dir={runs_dir}"])
            except KeyboardInterrupt as e:  # a signal that came after the CLI had returned
                code = interrupts.exit_code(e)
            finally:
                Path(f"{runs_dir}.returned").write_text(repr(time.monotonic()))
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.SIGNALS)
        try:
            os.setpgid(pid, pid)
        except OSError:  # the child did it first
            pass
        sent = None
        if delay is not None:
            time.sleep(delay)
            sent = time.monotonic()
            # as Ctrl-C in a terminal (or Slurm's SIGTERM): the whole process group, so the
            # compiler MLX may be running for a new kernel gets it too
            os.killpg(pid, signum)  # a child that already exited is a zombie: harmless
        _, status = os.waitpid(pid, 0)
        returned = float(Path(f"{runs_dir}.returned").read_text())
        # whether the signal was sent before the CLI had returned (monotonic is system-wide)
        return os.waitstatus_to_exitcode(status), time.monotonic() - t0, (
            sent is not None and sent < returned)

    rc, first, _ = run(root / "reference")  # the first run may also fill MLX's kernel cache
    rc2, duration, _ = run(root / "reference-again")
    print(json.dumps({"reference_rc": [rc, rc2], "seconds": [first, duration]}), flush=True)
    rng = random.Random(seed)
    for trial in range(trials):
        # a third of the trials land early (loading, the first compile), the rest anywhere
        delay = rng.uniform(0, duration * (0.25 if trial % 3 == 0 else 1.05))
        signum = signal.SIGTERM if trial % 4 == 3 else signal.SIGINT
        runs_dir = root / f"trial-{trial}"
        rc, _, in_time = run(runs_dir, delay, signum)
        ckpt = list(runs_dir.glob("*/*/checkpoint.safetensors"))
        steps = None
        if ckpt:
            arrays, meta = runlog.read_tensors(ckpt[0])
            steps = [int(meta["step"]), int(arrays["opt.step"])]
        resume_rc, _, _ = run(runs_dir)
        print(json.dumps({"trial": trial, "delay": delay, "signal": signum, "rc": rc,
                          "sent_before_return": in_time,
                          "checkpoint_steps": steps, "resume_rc": resume_rc}), flush=True)
""")


def _metric_rows(folder: Path) -> list[dict]:
    table = runlog.read_parts(folder / "metrics").drop(["elapsed_s"])
    return table.to_pylist()


def _probe_rows(folder: Path) -> list[dict]:
    return runlog.read_parts(folder / "probes").to_pylist()


def test_sigint_and_sigterm_at_random_times_resume_bit_exact(tiny_cfg, tmp_path):
    cfg = tiny_cfg(max_steps=60, ckpt_every=20, log_every=5, eval_every=10, probe_every=10,
                   runs_dir=str(tmp_path / "unused"))
    words = command_line(cfg).split()[4:]  # every key=value, so the run_id is this config's
    words = [w for w in words if not w.startswith("runs_dir=")]
    script = tmp_path / "fork_server.py"
    script.write_text(FORK_SERVER)
    trials = 24
    out = subprocess.run([sys.executable, str(script), json.dumps(words), str(tmp_path), str(trials),
                          "12"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[0]["reference_rc"] == [0, 0]
    reference = run_dir_of(cfg).relative_to(tmp_path / "unused")
    ref = tmp_path / "reference" / reference
    ref_rows, ref_probes = _metric_rows(ref), _probe_rows(ref)
    ref_weights, _ = runlog.read_tensors(ref / "final.safetensors")
    ref_summary = json.loads((ref / "summary.json").read_text())
    assert [r["step"] for r in ref_rows] == list(range(61))
    again = tmp_path / "reference-again" / reference
    assert _metric_rows(again) == ref_rows and _probe_rows(again) == ref_probes  # a fair bar

    interrupted_mid_run = early = lost = 0
    for result in lines[1:]:
        folder = tmp_path / f"trial-{result['trial']}" / reference
        log = (tmp_path / f"trial-{result['trial']}.log").read_text()[-2000:]
        # a signal sent before the CLI returned stops it; one after it has no effect
        assert result["rc"] in (0, 128 + result["signal"]), (result, log)
        if not result["sent_before_return"]:
            assert result["rc"] == 0, (result, log)
        lost += result["sent_before_return"] and result["rc"] == 0
        assert result["resume_rc"] == 0, (result, log)
        if result["checkpoint_steps"]:
            meta_step, opt_step = result["checkpoint_steps"]
            assert meta_step == opt_step, result  # the checkpoint's step is the updates applied
            interrupted_mid_run += 0 < opt_step < cfg.steps
            early += opt_step <= cfg.log_every
        assert _metric_rows(folder) == ref_rows, result
        assert _probe_rows(folder) == ref_probes, result
        weights, _ = runlog.read_tensors(folder / "final.safetensors")
        assert weights.keys() == ref_weights.keys()
        for name, value in ref_weights.items():
            assert np.array_equal(weights[name], value), (result, name)
        summary = json.loads((folder / "summary.json").read_text())
        for key in ("status", "init_loss", "final_val_loss", "min_val_loss", "steps",
                    "final_weights_sha256"):
            assert summary[key] == ref_summary[key], (result, key)
    assert len(lines) == trials + 1
    # the timings must really have hit the run: many mid-run, some in the first interval
    assert interrupted_mid_run >= trials // 5, lines
    assert early >= 1, lines
    # Rarely (about 1 in 70 trials, only under pytest) a signal sent in the first 0.1 s is not
    # acted on and the run completes; its results are still exact (asserted above).
    assert lost <= 2, lines
    print(f"{trials} trials: {interrupted_mid_run} interrupted mid-run ({early} in the first "
          f"{cfg.log_every} steps), {lost} signals not acted on, reference run {lines[0]['seconds'][1]:.2f} s")
    for line in lines:
        print(line)


def test_deferred_signal_waits_for_the_safe_point():
    from mlx_gpt.interrupts import Deferred, Interrupted

    with pytest.raises(Interrupted) as caught, Deferred() as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        reached = True  # the signal did not stop the block here
        guard.check()
    assert reached and caught.value.signum == signal.SIGTERM
    with pytest.raises(Interrupted), Deferred():  # raised when the block ends, if never checked
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
