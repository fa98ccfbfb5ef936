"""Reliability under signals: Ctrl-C and SIGTERM at random times resume bit-exact, a deferred
signal waits for the safe point, and Ctrl-C while an extension initialises is an interrupt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from qkstudy import files
from qkstudy.run_folder import RunFolder
from qkstudy.sweep.plan import command_line
# what a run is compared by, here, in the damage tests and in the storm test
from reliability.compare import metric_rows as _metric_rows, probe_rows as _probe_rows

ROOT = Path(__file__).resolve().parents[1]


# --- Ctrl-C / SIGTERM at random times: resume must be bit-exact ---------------------------------

# A fork server: it imports the trainer once (and never runs MLX itself), then forks one child
# per run, so each trial costs a fork, not an interpreter start. Children run the real CLI.
FORK_SERVER = textwrap.dedent("""
    import json, os, random, signal, sys, time
    from pathlib import Path
    import mlx_gpt
    from qkstudy import files, interrupts, run_folder
    from qkstudy.__main__ import main

    # Python's own after-fork hooks run in the child before the CLI installs its handlers, and
    # swallow a KeyboardInterrupt raised there; the CLI's handler (which also notes the signal
    # for the run's Deferred block) is installed here already so the forked child has it.
    for s in interrupts.SIGNALS:
        signal.signal(s, interrupts._raise)

    words, root, trials, seed = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), \\
        int(sys.argv[4])
    # more trials until these many landed mid-run and one early (a busy machine shifts where
    # the random delays land), up to max_trials
    steps_total, early_steps, need_mid, max_trials = (int(a) for a in sys.argv[5:9])

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
            except BaseException:  # anything else escaping the CLI is a failure: say what
                import traceback
                traceback.print_exc()
            finally:
                # the harness's own bookkeeping: a signal landing here must not cut it short
                while True:
                    try:
                        signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)
                        Path(f"{runs_dir}.returned").write_text(repr(time.monotonic()))
                        break
                    except KeyboardInterrupt as e:
                        code = code if code != 99 else interrupts.exit_code(e)
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
    mid = early = 0
    for trial in range(max_trials):
        if trial >= trials and mid >= need_mid and early >= 1:
            break
        # a third of the trials land early (loading, the first compile), the rest anywhere
        delay = rng.uniform(0, duration * (0.25 if trial % 3 == 0 else 1.05))
        signum = signal.SIGTERM if trial % 4 == 3 else signal.SIGINT
        runs_dir = root / f"trial-{trial}"
        rc, _, in_time = run(runs_dir, delay, signum)
        ckpt = list(runs_dir.glob("*/*/checkpoint.safetensors"))
        steps = None
        if ckpt:
            arrays, meta = files.read_tensors(ckpt[0])
            counts = {int(v) for k, v in arrays.items() if k.startswith("opt.")
                      and k.split(".")[-1] == "step"}  # the optimizer's step (one per group)
            steps = [int(meta["step"]), *counts]
            mid += 0 < max(counts) < steps_total
            early += max(counts) <= early_steps
        resume_rc, _, _ = run(runs_dir)
        manifest = json.loads(next(runs_dir.glob("*/*/manifest.json")).read_text())
        print(json.dumps({"trial": trial, "delay": delay, "signal": signum, "rc": rc,
                          "sent_before_return": in_time,
                          "resumed_from": manifest.get("resumed_from_step", 0),
                          "checkpoint_steps": steps, "resume_rc": resume_rc}), flush=True)
""")


class Reference(NamedTuple):
    """The uninterrupted run every trial must match: its rows, probes, weights and summary."""
    rows: list
    probes: list
    weights: dict
    summary: dict


def _fork_server_lines(cfg, tmp_path: Path, trials: int, need_mid: int,
                       max_trials: int) -> list[dict]:
    """Run the fork server on `cfg` under tmp_path: its JSON lines (the reference runs', then
    one a trial)."""
    words = command_line(cfg).split()[4:]  # every key=value, so the run_id is this config's
    words = [w for w in words if not w.startswith("runs_dir=")]
    script = tmp_path / "fork_server.py"
    script.write_text(FORK_SERVER)
    out = subprocess.run([sys.executable, str(script), json.dumps(words), str(tmp_path), str(trials),
                          "12", str(cfg.steps), str(cfg.log_every), str(need_mid), str(max_trials)],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def _reference(ref: Path, again: Path) -> Reference:
    """The reference run, checked against its second, identical run (a fair bar)."""
    ref_rows, ref_probes = _metric_rows(ref), _probe_rows(ref)
    ref_weights, _ = files.read_tensors(ref / "final.safetensors")
    ref_summary = json.loads((ref / "summary.json").read_text())
    assert [r["step"] for r in ref_rows] == list(range(41))
    assert _metric_rows(again) == ref_rows and _probe_rows(again) == ref_probes  # a fair bar
    return Reference(ref_rows, ref_probes, ref_weights, ref_summary)


def _check_same_run(folder: Path, ref: Reference, result: dict) -> None:
    """A trial's run, resumed, ends with the reference's rows, probes, weights and summary."""
    assert _metric_rows(folder) == ref.rows, result
    assert _probe_rows(folder) == ref.probes, result
    weights, _ = files.read_tensors(folder / "final.safetensors")
    assert weights.keys() == ref.weights.keys()
    for name, value in ref.weights.items():
        assert np.array_equal(weights[name], value), (result, name)
    summary = json.loads((folder / "summary.json").read_text())
    for key in ("status", "init_loss", "final_val_loss", "min_val_loss", "steps",
                "final_weights_sha256"):
        assert summary[key] == ref.summary[key], (result, key)


def _check_trial(result: dict, folder: Path, log: str, ref: Reference,
                 cfg) -> tuple[bool, bool, bool]:
    """One trial's exit codes, checkpoint and run: whether its signal hit mid-run, whether in
    the first log interval, and whether it was sent in time but not acted on."""
    # a signal sent before the CLI returned stops it; one after it has no effect
    assert result["rc"] in (0, 128 + result["signal"]), (result, log)
    if not result["sent_before_return"]:
        assert result["rc"] == 0, (result, log)
    lost = result["sent_before_return"] and result["rc"] == 0
    assert result["resume_rc"] == 0, (result, log)
    mid = early = False
    if result["checkpoint_steps"]:
        meta_step, opt_step = result["checkpoint_steps"]  # one optimizer count only
        assert meta_step == opt_step, result  # the checkpoint's step is the updates applied
        assert result["resumed_from"] == opt_step, result  # resumed there, not from 0
        mid, early = 0 < opt_step < cfg.steps, opt_step <= cfg.log_every
    _check_same_run(folder, ref, result)
    return mid, early, lost


def test_sigint_and_sigterm_at_random_times_resume_bit_exact(tiny_cfg, tmp_path):
    cfg = tiny_cfg(max_steps=40, ckpt_every=20, log_every=5, eval_every=10, probe_every=10,
                   runs_dir=str(tmp_path / "unused"))
    trials, need_mid, max_trials = 20, 4, 60
    lines = _fork_server_lines(cfg, tmp_path, trials, need_mid, max_trials)
    assert lines[0]["reference_rc"] == [0, 0]
    reference = RunFolder.of(cfg).path.relative_to(tmp_path / "unused")
    ref = _reference(tmp_path / "reference" / reference,
                     tmp_path / "reference-again" / reference)

    interrupted_mid_run = early = lost = 0
    for result in lines[1:]:
        folder = tmp_path / f"trial-{result['trial']}" / reference
        log = (tmp_path / f"trial-{result['trial']}.log").read_text()[-2000:]
        mid, in_first_interval, not_acted_on = _check_trial(result, folder, log, ref, cfg)
        interrupted_mid_run += mid
        early += in_first_interval
        lost += not_acted_on
    done = len(lines) - 1
    assert trials <= done <= max_trials
    # the signals must really have hit the run: mid-run and in the first interval (the harness
    # adds trials until they have, so load on the machine costs time, not a failure)
    assert interrupted_mid_run >= need_mid, lines
    assert early >= 1, lines
    # Rarely (about 1 in 70 trials, only under pytest) a signal sent in the first 0.1 s is not
    # acted on and the run completes; its results are still exact (asserted above).
    assert lost <= max(2, done // 10), lines
    print(f"{done} trials: {interrupted_mid_run} interrupted mid-run ({early} in the first "
          f"{cfg.log_every} steps), {lost} signals not acted on, reference run {lines[0]['seconds'][1]:.2f} s")
    for line in lines:
        print(line)


def test_deferred_signal_waits_for_the_safe_point():
    from qkstudy.interrupts import Deferred, Interrupted

    with pytest.raises(Interrupted) as caught, Deferred() as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        reached = True  # the signal did not stop the block here
        guard.check()
    assert reached and caught.value.signum == signal.SIGTERM
    before = signal.getsignal(signal.SIGINT)  # ignored when pytest itself runs in the background
    with pytest.raises(Interrupted), Deferred():  # raised when the block ends, if never checked
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_ctrl_c_while_an_extension_initialises_is_an_interrupt(monkeypatch, capsys):
    """Ctrl-C during `import mlx.core` surfaces as an ImportError caused by the interrupt: the
    command says "interrupted" and exits 130, no traceback."""
    import importlib

    from qkstudy import backends, interrupts
    from qkstudy.__main__ import main

    real_import = importlib.import_module

    def import_interrupted(name, *args):
        if name == backends.BACKENDS["mlx"][0]:  # the MLX backend's module, found by the seam
            try:
                raise interrupts.Interrupted()
            except KeyboardInterrupt as e:
                raise ImportError("Encountered an error while initializing the extension.") from e
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_interrupted)
    assert main(["train"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: (_ for _ in ()).throw(
        ImportError("a broken installation")))
    with pytest.raises(ImportError, match="broken installation"):
        main(["train"])
