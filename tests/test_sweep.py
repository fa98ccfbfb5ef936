"""Sweeps: plan and order, parsing and errors, bisection, skip/resume, isolation, shared work."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qkstudy import files, forecast, run_folder, sweep, trainer
from qkstudy.__main__ import main
from qkstudy.config import model_args, parse_train_config
from qkstudy.errors import UsageError
from qkstudy.locks import RunBusy
from qkstudy.run_folder import RunFolder
from qkstudy.sweep.config import groups, log_grid, run_config
from qkstudy.sweep.plan import command_line
from qkstudy.parameters import count_params
from qkstudy.sweep.refine import boundary, next_midpoint

ROOT = Path(__file__).resolve().parents[1]


def tiny_words(data: str, runs_dir: Path, *extra: str) -> list[str]:
    """A sweep of tiny runs (depth 1, d_model 32, 20 steps): about a second each here. `extra`
    words replace the defaults of the same key (a key may be given once)."""
    words = dict(w.split("=", 1) for w in (
        "preset=demo", f"data={data}", f"runs_dir={runs_dir}", "name=t", "depth=1", "d_model=32",
        "n_heads=2", "block_size=32", "batch_size=4", "max_steps=20", "warmup_steps=5",
        "eval_every=10", "eval_batches=2", "probe_every=10", "log_every=5", "ckpt_every=10",
        "arms=none", "seeds=0", "jobs=1", "divergence_window=5"))
    words.update(w.split("=", 1) for w in extra if "=" in w)
    return [f"{k}={v}" for k, v in words.items()] + [w for w in extra if "=" not in w]


def status_of(cfg) -> str | None:
    return (files.read_json(RunFolder.of(cfg).path / "summary.json") or {}).get("status")


@pytest.fixture
def no_calibration(monkeypatch):
    monkeypatch.setattr(sweep.plan, "step_speed", lambda cfg, vocab, **k: (1000.0, 3))


def fake_trainer(monkeypatch, threshold: dict[str, float], calls: list):
    """Replace train.train by a stub that writes a summary: stable iff lr < threshold[qk_norm]."""

    def fake(cfg, verbose=True, prefix="", repair=None, started=None):
        calls.append((cfg, prefix))
        if started:
            started()
        status = "completed" if cfg.lr < threshold[cfg.qk_norm] else "diverged"
        folder = RunFolder.of(cfg).path
        folder.mkdir(parents=True, exist_ok=True)
        summary = {"run_id": cfg.run_id, "status": status, "tokens_seen": 100, "steps": 1}
        files.write_json(folder / "summary.json", summary)
        return summary

    monkeypatch.setattr(trainer, "train", fake)
    # the stub writes no logs, which the integrity check of finished runs would find damaged
    # (and the sweep would repair): a summary alone is a finished run here
    monkeypatch.setattr(RunFolder, "intact_summary", RunFolder.finished)


# --- plan, grid, parsing --------------------------------------------------------------------


def test_study_preset_is_the_studys_plan():
    sc = sweep.parse_sweep_config([])
    assert sc.grid_lrs() == [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]  # half-decades as 1-3-10
    runs = sweep.grid(sc)
    assert len(runs) == 7 * 2 * 3  # LRs x arms x seeds
    assert runs[0].steps == 24_414 and runs[0].tokens_per_step == 4096
    params = count_params(model_args(runs[0], 50257))
    assert 10e6 < params["total"] < 15e6
    assert sc.refine and sc.jobs == 1


def test_mini_preset_can_decide_every_hypothesis():
    sc = sweep.parse_sweep_config(["preset=mini"])
    assert len(sc.depth) >= 3 and len(sc.seeds) >= 3 and sc.refine  # H3 needs depths, H1-H3 seeds
    assert len(sc.grid_lrs()) >= 6 and sc.grid_lrs()[-1] / sc.grid_lrs()[0] >= 1e3
    runs = sweep.grid(sc)
    assert len(runs) == len(sc.depth) * len(sc.grid_lrs()) * 2 * 5
    # the confirmatory tests need a seed count fixed in advance (docs/report.md): no adaptive seeds
    assert sc.max_seeds == len(sc.seeds) == 5
    assert runs[0].data == "data/synthetic-bytes"  # the embedded corpus: no download


def test_demo_preset_is_the_fixed_first_result_design():
    sc = sweep.parse_sweep_config(["preset=demo"])
    assert sc.grid_lrs() == [1e-3, 1e-2, 0.1, 1.0] and sc.depth == (2,)
    assert sc.seeds == (0, 1, 2, 3) and sc.max_seeds == 0  # fixed in advance: no adaptive seeds
    assert len(sweep.grid(sc)) == 32 and sc.name == "demo" and not sc.refine and sc.jobs == 2
    assert sc.train == sweep.PRESETS["mini"].train  # the mini's model and run
    assert sweep.parse_sweep_config(["preset=demo", "lr_max=0.1", "points_per_decade=2"]
                                    ).grid_lrs() == [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def test_plan_size_and_order():
    sc = sweep.parse_sweep_config(["preset=demo", "depth=2,4", "seeds=0,1", "lrs=1e-2,1e-3",
                                   "name=night", "runs_dir=/tmp/r"])
    runs = sweep.grid(sc)
    assert len(runs) == 2 * 2 * 2 * 2
    keys = [(c.seed, c.depth, c.lr, c.qk_norm) for c in runs]
    # seed 0 everywhere first; then depth; LRs ascending; the two arms of one LR adjacent
    assert keys[:4] == [(0, 2, 1e-3, "none"), (0, 2, 1e-3, "rmsnorm"),
                        (0, 2, 1e-2, "none"), (0, 2, 1e-2, "rmsnorm")]
    assert [k[0] for k in keys] == [0] * 8 + [1] * 8
    assert [k[1] for k in keys[:8]] == [2] * 4 + [4] * 4
    assert len({c.run_id for c in runs}) == 16
    # one seed replicates init and batch order; every LR and arm of a seed share the batches
    assert all(c.data_seed == c.seed for c in runs)
    assert all(c.sweep == "night" and c.runs_dir == "/tmp/r" for c in runs)
    assert groups(sc)[:2] == [(2, "none", 0), (2, "rmsnorm", 0)]


def test_log_grid():
    assert log_grid(1e-3, 1e-1, 2) == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    assert log_grid(1e-3, 5e-2, 1) == [1e-3, 1e-2]
    assert log_grid(1e-3, 1e-2, 4) == [1e-3, 1.78e-3, 3.16e-3, 5.62e-3, 1e-2]


def test_overrides_reach_every_run():
    sc = sweep.parse_sweep_config(["preset=demo", "d_model=64", "n_heads=2", "refine=off",
                                   "lr_min=1e-3", "lr_max=1e-2", "points_per_decade=1",
                                   "arms=rmsnorm", "seeds=3", "refine_factor=1.1"])
    assert (sc.preset, sc.refine, sc.refine_factor, sc.seeds) == ("demo", False, 1.1, (3,))
    runs = sweep.grid(sc)
    assert [c.lr for c in runs] == [1e-3, 1e-2]
    assert all(c.d_model == 64 and c.n_heads == 2 and c.qk_norm == "rmsnorm" and c.seed == 3
               and c.data == "data/synthetic-bytes" for c in runs)


@pytest.mark.parametrize("words, message", [
    (["colour=red"], "unknown key 'colour'"),
    (["preset=huge"], "unknown preset 'huge'"),
    (["lr_min=1e-2", "lr_max=1e-3"], "lr_min=0.01 must be below lr_max=0.001"),
    (["lr_min=1e-2", "lr_max=1e-2"], "must be below"),
    (["lrs=,"], "lrs needs at least one value"),
    (["lrs=1e-3", "lr_max=1"], "give lrs or lr_max, not both"),
    (["lrs=1e-3,fast"], "lrs: 'fast' is not a number"),
    (["depth=2.5"], "depth: '2.5' is not an integer"),
    (["qk_norms=none,layernorm"], "unknown key 'qk_norms'"),
    (["arms=none,cap50"], "unknown arm 'cap50'; arms are: none, rmsnorm, layernorm, l2norm, softcap<C>"),
    (["arms=softcap0"], "softcap needs a number > 0 after it"),
    (["arms=zloss-1e-4"], "zloss needs a number > 0 after it"),
    (["arms=softcap50,softcap50.0"], "arms: softcap50 given more than once"),
    (["attn_softcap=50"], "attn_softcap is set by the sweep grid; use arms (softcap<C>)"),
    (["z_loss=1e-4"], "use arms (zloss<W>)"),
    (["lr=1e-3"], "lr is set by the sweep grid; use lrs"),
    (["seed=1"], "use seeds"),
    (["refine_factor=1"], "refine_factor must be > 1"),
    (["d_model=30", "n_heads=4"], "not divisible"),
    (["depth=0"], "depth must be >= 1"),
    (["jobs=0"], "jobs must be >= 1"),
    (["warmup"], "expected key=value"),
    (["--fast"], "unknown flag --fast"),
])
def test_bad_input_is_one_line_exit_2_and_runs_nothing(words, message, capsys, tmp_path):
    runs_dir = tmp_path / "runs"
    assert main(["sweep", *words, f"runs_dir={runs_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not runs_dir.exists()


def test_missing_data_is_a_usage_error_before_anything_is_written(tmp_path, capsys):
    assert main(["sweep", "preset=demo", f"data={tmp_path}/nope-bytes",
                 f"runs_dir={tmp_path / 'runs'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_the_plan_only(tiny_data, tmp_path, capsys):
    words = tiny_words(tiny_data, tmp_path / "runs", "lrs=1e-3,1e-2", "arms=none,rmsnorm")
    assert main(["sweep", *words, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 grid runs = 2 LRs x 2 arms x 1 seed x 1 depth" in out
    assert "20 steps x 128 tokens = 2,560 tokens" in out
    assert "parameters" in out and "timed step" not in out
    assert "backend     mlx on cpu" in out
    assert re.search(r"time        ~\d+m\d\ds for the 4 unfinished grid runs in 1 process.*"
                     r"tok/s from a short timing here \(depth 1, \d+ steps?\)", out), out
    assert "warning" not in out  # minutes, not days
    assert not (tmp_path / "runs").exists()
    assert main(["sweep", *words, "--dry-run", "--calibrate"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tok/s \(\d+ timed steps\)", out) and "tok/s timed here for every depth" in out


def test_dry_run_of_the_study_says_how_long_and_warns(tmp_path, monkeypatch, capsys):
    """preset=study from the bench's stored figure for this machine (no timing): hours, nights
    and the one-line warning with the faster ways to run it."""
    from qkstudy import provenance

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    bench = {"machine": {"cpu": provenance.chip(), "cpus": os.cpu_count()},
             "shapes": {"study": {"flops_per_token": 77.4e6,
                                  "tokens_per_s": {"mlx-1": {"median": 457.0}}}}}
    files.write_json(tmp_path / "reports" / "bench.json", bench)
    assert main(["sweep", "preset=study", "depth=6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tok/s from the bench's stored figure (reports/bench.json, study shape" in out
    hours = re.search(r"time        ~([\d,]+) h \(([\d,]+) nights of 10 h\) for the 42 unfinished", out)
    assert hours, out
    assert 2_000 < int(hours[1].replace(",", "")) < 3_500  # 42 runs of 1e8 tokens at ~457 tok/s
    warning = next(line for line in out.splitlines() if line.startswith("  warning"))
    assert "more than a day on this machine" in warning and "backend=torch" in warning
    assert "--slurm" in warning and "preset=mini" in warning
    # a bench report from another machine is not used, and the plan says why
    files.write_json(tmp_path / "reports" / "bench.json",
                      bench | {"machine": {"cpu": "another CPU", "cpus": 64}})
    monkeypatch.setattr("qkstudy.sweep.plan.step_speed", lambda cfg, vocab, **k: (1000.0, 1))
    assert main(["sweep", "preset=study", "depth=6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "reports/bench.json was measured on another machine (64-core another CPU)" in out
    assert "tok/s from a short timing here (depth 6, 1 step)" in out


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


def test_parse_errors_raise_usage_error_directly():
    with pytest.raises(UsageError, match="unknown key"):
        sweep.parse_sweep_config(["nope=1"])
    assert math.isclose(sweep.parse_sweep_config(["refine_factor=1.5"]).refine_factor, 1.5)


def test_sweep_declares_its_base_grid_for_the_analysis(tiny_data, tmp_path):
    runs = tmp_path / "runs"
    assert main(["sweep", *tiny_words(tiny_data, runs, "lrs=1e-3,1e-2", "max_steps=5",
                                      "ckpt_every=5", "eval_every=5", "probe_every=5")]) == 0
    assert main(["sweep", *tiny_words(tiny_data, runs, "lrs=3e-3", "max_steps=5",
                                      "ckpt_every=5", "eval_every=5", "probe_every=5")]) == 0
    declared = json.loads((runs / "t" / "sweep.json").read_text())
    assert declared["grid_lrs"] == [1e-3, 3e-3, 1e-2]
    assert declared["arms"] == ["none"]


def test_arms_each_make_one_change_against_none_and_share_init_and_batches():
    """arms=none,rmsnorm,softcap50,zloss1e-4: per seed, every arm is the off arm's config with
    one key changed (so the same init weights and batches), and run ids are distinct."""
    from qkstudy.arms import arm_name, canonical

    sc = sweep.parse_sweep_config(["preset=demo", "arms=none,rmsnorm,softcap50.0,zloss0.0001",
                                   "seeds=0,1", "lrs=1e-3"])
    assert sc.arms == ("none", "rmsnorm", "softcap50", "zloss1e-4")
    runs = sweep.grid(sc)
    assert [arm_name(c) for c in runs] == list(sc.arms) * 2
    assert [c.seed for c in runs] == [0] * 4 + [1] * 4
    for seed in (0, 1):
        off, *others = [c for c in runs if c.seed == seed]
        for cfg in others:
            changed = {k for k, v in cfg.identity().items() if off.identity().get(k) != v}
            changed |= set(off.identity()) - set(cfg.identity())
            assert len(changed) == 1, changed
            assert (cfg.seed, cfg.data_seed) == (off.seed, off.data_seed)
    assert len({c.run_id for c in runs}) == 8
    assert [c.attn_softcap for c in runs[:4]] == [0, 0, 50.0, 0]
    assert [c.z_loss for c in runs[:4]] == [0, 0, 0, 1e-4]
    assert sweep.PRESETS["study"].arms == sweep.PRESETS["demo"].arms == ("none", "rmsnorm")
    assert canonical("zloss3e-05") == "zloss3e-5" and canonical("softcap7.5") == "softcap7.5"
    # a base config with a control on does not leak into the off arm
    on = dataclasses.replace(sc, train=dataclasses.replace(sc.train, attn_softcap=9.0))
    assert run_config(on, 4, 1e-3, "none", 0).attn_softcap == 0


def test_eta_starts_from_calibration_and_moves_smoothly():
    eta = forecast.queue_eta  # the queue: 100 calibrated seconds; the next run: 10
    assert eta(100, 10, planned=0, seconds=0, processes=1) == pytest.approx(100.0)
    # one run took twice its calibrated time: pulled towards 2x, no jump
    assert eta(100, 10, planned=10, seconds=20.0, processes=1) == pytest.approx(150.0)
    assert eta(100, 10, planned=100, seconds=200.0, processes=1) == pytest.approx(100 * 210 / 110)
    # 2 processes, each calibrated at its share of the machine, share the queue
    assert eta(100, 10, 0, 0, processes=2) == pytest.approx(50.0)
    assert math.isinf(eta(100, 0.0, 0, 0, 1))  # not calibrated: "?"
    assert eta(0.0, 0.0, 0, 0, 1) == 0.0


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
