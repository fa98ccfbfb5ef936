"""Boundary refinement: bisection against a stub threshold, every curve refined round by round,
runs held elsewhere or failed, the commands it emits, the base grid it declares, and its
finished runs tidied."""

from __future__ import annotations

import json
import re
import shlex
import sys

from qkstudy import files, run_folder, sweep, trainer
from qkstudy.__main__ import main
from qkstudy.config import parse_train_config
from qkstudy.locks import RunBusy
from qkstudy.run_folder import RunFolder
from qkstudy.sweep.config import run_config
from qkstudy.sweep.plan import command_line
from qkstudy.sweep.refine import boundary, next_midpoint
from tests.tiny_sweeps import fake_trainer, status_of, tiny_words


# --- boundary refinement ----------------------------------------------------------------------

GRID = [1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1]


def bisect_boundary(grid_lrs, is_stable, steps: int, factor: float) -> dict:
    """The whole refinement against a stability oracle: every LR asked, in order."""
    results = {lr: is_stable(lr) for lr in grid_lrs}
    while (lr := next_midpoint(results, grid_lrs, steps, factor)) is not None:
        results[lr] = is_stable(lr)
    return results


def test_bisection_narrows_the_bracket_around_a_stub_threshold():
    asked = []

    def stable(lr):
        asked.append(lr)
        return lr < 0.0123

    results = bisect_boundary(GRID, stable, steps=3, factor=1.1)
    # geometric means of the bracket, rounded to 3 digits: [1e-2, 3.16e-2] -> 1.78e-2 (diverged)
    # -> [1e-2, 1.78e-2] -> 1.33e-2 (diverged) -> [1e-2, 1.33e-2] -> 1.15e-2 (stable); 3 steps
    assert asked == GRID + [1.78e-2, 1.33e-2, 1.15e-2]
    assert boundary(results) == (1.15e-2, 1.33e-2)


def test_bisection_stops_within_factor_and_without_a_bracket():
    assert list(bisect_boundary(GRID, lambda lr: lr < 0.0123, 5, 2.0))[5:] == [1.78e-2]
    # ratio after k steps is 3.16 ** (1 / 2**k): within 1.2 after 3 steps, so the 4th is not run
    steps = list(bisect_boundary(GRID, lambda lr: lr < 0.005, 10, 1.2))[5:]
    assert len(steps) == 3
    assert bisect_boundary(GRID, lambda lr: True, 3, 1.1).keys() == set(GRID)
    assert bisect_boundary(GRID, lambda lr: False, 3, 1.1).keys() == set(GRID)
    assert bisect_boundary(GRID, lambda lr: lr < 0.0123, 0, 1.1).keys() == set(GRID)


def test_bisection_uses_the_first_divergence_and_survives_failures():
    # a stable run above a diverged one (noise) does not move the bracket past the first failure
    noisy = {1e-3: True, 3.16e-3: True, 1e-2: False, 3.16e-2: True, 1e-1: False}
    assert next_midpoint(noisy, GRID, 3, 1.1) == 5.62e-3
    # a failed run (None) gives no verdict; the same point is not asked for again
    results = bisect_boundary(GRID, lambda lr: None if lr not in GRID else lr < 0.02, 3, 1.1)
    assert list(results)[5:] == [1.78e-2] and results[1.78e-2] is None
    # the midpoint stays strictly inside a narrow bracket even where rounding would hit an end
    mid = next_midpoint({1e-2: True, 1.01e-2: False}, [1e-2, 1.01e-2], 1, 1.001)
    assert 1e-2 < mid < 1.01e-2


def test_a_run_held_elsewhere_counts_once_while_the_sweep_waits_for_it(
        monkeypatch, tiny_data, tmp_path, capsys, no_calibration):
    """Another process trains a refinement run: this one polls until it is done, then goes on
    to the next round, and its progress total counts that run once, not once a poll."""
    import contextlib

    fake_trainer(monkeypatch, {"none": 0.0123, "rmsnorm": 0.05}, calls := [])
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,3.16e-3,1e-2,3.16e-2,1e-1",
                       "arms=none,rmsnorm", "seeds=0", "refine=true", "refine_steps=2",
                       "refine_factor=1.01")
    sc = sweep.parse_sweep_config(words)
    held = run_config(sc, sc.depth[0], 1.78e-2, "none", 0)  # the none curve's first midpoint
    RunFolder.of(held).path.mkdir(parents=True)
    other = contextlib.ExitStack()  # the other process's lock: what the sweep polls
    assert other.enter_context(RunFolder(RunFolder.of(held).path).lock())
    polls = []

    def poll(seconds: float) -> None:  # the other process finishes it on the third poll
        polls.append(seconds)
        if len(polls) == 3:
            other.close()
            files.write_json(RunFolder.of(held).path / "summary.json",
                             {"run_id": held.run_id, "status": "diverged", "steps": 1})

    stub = trainer.train

    def train(cfg, **kw):  # the lock, as the real trainer takes it
        if cfg.run_id == held.run_id and len(polls) < 3:
            raise RunBusy("held")
        return stub(cfg, **kw)

    monkeypatch.setattr(trainer, "train", train)
    monkeypatch.setattr("qkstudy.sweep.run.time.sleep", poll)
    assert main(["sweep", *words]) == 0
    assert len(polls) >= 3 and held.run_id not in {c.run_id for c, _ in calls}
    totals = {int(t) for t in re.findall(r"\[sweep \d+/(\d+)", capsys.readouterr().out)}
    assert max(totals) == 10 + 2 * 2  # the grid, and two midpoints per curve


def test_a_grid_run_held_elsewhere_is_waited_for_and_the_crossing_step_trained_here(
        monkeypatch, tiny_data, tmp_path, no_calibration):
    """The crossing step needs every grid run: while another process of the sweep still trains
    one, this process waits for it and then trains the step's runs, rather than leaving them
    all to that process."""
    import contextlib

    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,1e-2,3.16e-2", "seeds=0",
                       "arms=none,rmsnorm", "refine=true", "refine_steps=0", "threshold_steps=1")
    sc = sweep.parse_sweep_config(words)
    held = run_config(sc, sc.depth[0], 3.16e-2, "none", 0)
    RunFolder.of(held).path.mkdir(parents=True)
    other = contextlib.ExitStack()  # the other process's lock on the grid's last run
    assert other.enter_context(RunFolder(RunFolder.of(held).path).lock())
    trained = []

    def summary(cfg) -> dict:  # off is 0.5 nats worse from 0.0316: the crossing bracket ends there
        loss = 2.0 + (0.5 if cfg.qk_norm == "none" and cfg.lr > 0.02 else 0.0)
        return {"run_id": cfg.run_id, "status": "completed", "final_val_loss": loss,
                "init_loss": 5.5, "unigram_entropy": 3.1, "tokens_seen": 100, "steps": 1}

    def train(cfg, **kw):
        if cfg.run_id == held.run_id:
            raise RunBusy("held")
        trained.append((cfg.lr, cfg.qk_norm))
        RunFolder.of(cfg).path.mkdir(parents=True, exist_ok=True)
        files.write_json(RunFolder.of(cfg).path / "summary.json", summary(cfg))
        return summary(cfg)

    polls = []

    def poll(seconds: float) -> None:  # the other process finishes the grid run meanwhile
        polls.append(seconds)
        if len(polls) == 2:
            other.close()
            files.write_json(RunFolder.of(held).path / "summary.json", summary(held))

    monkeypatch.setattr(trainer, "train", train)
    monkeypatch.setattr(RunFolder, "intact_summary", RunFolder.finished)
    monkeypatch.setattr("qkstudy.sweep.run.time.sleep", poll)
    assert main(["sweep", *words]) == 0
    assert len(polls) >= 2
    assert trained[-2:] == [(1.78e-2, "none"), (1.78e-2, "rmsnorm")]


def test_sweep_refines_every_curve_round_by_round(monkeypatch, tiny_data, tmp_path, capsys,
                                                  no_calibration):
    calls = []
    fake_trainer(monkeypatch, {"none": 0.0123, "rmsnorm": 0.05}, calls)
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,3.16e-3,1e-2,3.16e-2,1e-1",
                       "arms=none,rmsnorm", "seeds=0,1", "refine=true", "refine_steps=2",
                       "refine_factor=1.01")
    assert main(["sweep", *words]) == 0
    done = [(c.lr, c.qk_norm, c.seed) for c, _ in calls]
    assert len(done) == 20 + 4 * 2
    assert [lr for lr, *_ in done[:20]] == [lr for lr in GRID for _ in range(2)] * 2
    # round 1 gives each of the 4 curves its first midpoint, round 2 the second
    assert done[20:24] == [(1.78e-2, "none", 0), (5.62e-2, "rmsnorm", 0),
                           (1.78e-2, "none", 1), (5.62e-2, "rmsnorm", 1)]
    assert done[24:] == [(1.33e-2, "none", 0), (4.21e-2, "rmsnorm", 0),
                         (1.33e-2, "none", 1), (4.21e-2, "rmsnorm", 1)]
    assert calls[0][1] == "[1/20] " and calls[-1][1] == "[28/28] "
    out = capsys.readouterr().out
    assert "[sweep 1/20: 0 completed, 0 diverged, 0 failed, 0 passed over (held elsewhere) | ETA" in out
    assert "arm none    seed 0:  0.01 < 0.0133" in out
    assert "arm rmsnorm seed 1:  0.0421 < 0.0562" in out
    calls.clear()  # again: everything is finished, nothing is trained
    assert main(["sweep", *words]) == 0
    assert calls == []


def test_a_failed_refinement_run_is_retried_by_the_next_sweep(monkeypatch, tiny_data, tmp_path,
                                                              capsys, no_calibration):
    """A boundary-bisection run that raised (a part cut short under it, say) is trained again
    by the next invocation, and the bisection goes on from its result, as for a grid run."""
    calls = []
    fake_trainer(monkeypatch, {"none": 0.02}, calls)
    real = trainer.train
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,1e-2,1e-1", "refine=true",
                       "refine_steps=2", "refine_factor=1.01")

    def fails_at_the_first_midpoint(cfg, *args, **kwargs):
        if cfg.lr == 3.16e-2:
            calls.append((cfg, ""))
            folder = RunFolder.of(cfg)
            folder.path.mkdir(parents=True, exist_ok=True)
            files.write_json(folder.summary_file,
                             {"run_id": cfg.run_id, "status": "failed", "error": "boom"})
            raise RuntimeError("boom")
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(trainer, "train", fails_at_the_first_midpoint)
    assert main(["sweep", *words]) == 0
    assert [c.lr for c, _ in calls] == [1e-3, 1e-2, 1e-1, 3.16e-2]  # tried once, then left
    assert "1 failed" in capsys.readouterr().out
    calls.clear()
    monkeypatch.setattr(trainer, "train", real)
    assert main(["sweep", *words]) == 0
    assert [c.lr for c, _ in calls] == [3.16e-2, 1.78e-2]  # retried, then the next midpoint
    assert status_of(calls[0][0]) == "diverged"


def test_emit_commands_are_standalone_and_follow_the_results(monkeypatch, tiny_data, tmp_path,
                                                            capsys):
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,1e-2,1e-1", "refine=true",
                       "refine_steps=1")
    sc = sweep.parse_sweep_config(words)
    assert main(["sweep", *words, "--emit-commands"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 3 and "3 of 3 grid runs left, 0 refinement" in captured.err
    for line, cfg in zip(lines, sweep.grid(sc)):
        words_ = shlex.split(line)
        assert words_[:4] == [sys.executable, "-m", "qkstudy", "train"]  # this environment's
        again = parse_train_config(words_[4:])
        assert again == cfg and again.run_id == cfg.run_id
    # only what the run does: the study's token budget, not the max_steps it overrides
    study = shlex.split(command_line(sweep.grid(sweep.parse_sweep_config([]))[0]))
    assert "budget_tokens=100000000" in study and not any(w.startswith("max_steps=") for w in study)
    # once the grid's results are in (merged from elsewhere), the refinement point appears
    fake_trainer(monkeypatch, {"none": 0.05}, [])
    for cfg in sweep.grid(sc):
        trainer.train(cfg)
    assert main(["sweep", *words, "--emit-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "lr=0.0316 " in lines[0]


def test_sweep_declares_its_base_grid_for_the_analysis(tiny_data, tmp_path):
    runs = tmp_path / "runs"
    assert main(["sweep", *tiny_words(tiny_data, runs, "lrs=1e-3,1e-2", "max_steps=5",
                                      "ckpt_every=5", "eval_every=5", "probe_every=5")]) == 0
    assert main(["sweep", *tiny_words(tiny_data, runs, "lrs=3e-3", "max_steps=5",
                                      "ckpt_every=5", "eval_every=5", "probe_every=5")]) == 0
    declared = json.loads((runs / "t" / "sweep.json").read_text())
    assert declared["grid_lrs"] == [1e-3, 3e-3, 1e-2]
    assert declared["arms"] == ["none"]


def test_a_finished_refinement_run_is_tidied_like_a_grid_run(tiny_data, tmp_path,
                                                             no_calibration):
    """A process killed in a refinement run's last writes (its summary written) leaves its
    fatal-signal log and checkpoint; the next sweep removes them, as it does for a grid run
    (the storm's d2-noqk-lr0.316-s0: a .fatal-<pid> no later sweep removed)."""
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,10", "refine=true",
                       "refine_steps=1")
    assert main(["sweep", *words]) == 0
    grid = {c.run_id for c in sweep.grid(sweep.parse_sweep_config(words))}
    (refined,) = [f for f in run_folder.run_folders(tmp_path / "runs" / "t") if f.name not in grid]
    listing = sorted(p.name for p in refined.path.iterdir())
    dead = 2**22 + 17  # above the default pid_max: no such process
    (refined.path / f".fatal-{dead}").touch()
    refined.checkpoint_file.write_bytes(refined.final_file.read_bytes())
    assert main(["sweep", *words]) == 0
    assert sorted(p.name for p in refined.path.iterdir()) == listing
