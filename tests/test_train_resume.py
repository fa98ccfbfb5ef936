"""Resume: after a crash or an interrupt a run goes on exactly where it stopped, its checkpoint
holds the optimizer state bit for bit, and every interrupt and resume says where in one
line."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_gpt import engine as probes
from mlx_gpt.engine import update
from qkstudy import files, run_folder
from qkstudy.config import TrainConfig
from qkstudy.run_folder import RunFolder
from qkstudy.summaries import SUMMARY_FIELDS
from qkstudy.trainer import train
from tests.run_rows import rows


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_resume_after_crash_is_exact(tiny_cfg, tmp_path, monkeypatch, failure):
    reference = tiny_cfg()
    train(reference, verbose=False)

    crashed = dataclasses.replace(reference, runs_dir=str(tmp_path / "crashed"))
    real_collect = probes.collect

    def collect_then_fail(model, x, y, step):
        if step == 20:  # probes run at steps 0, 10, 20, ...: fail mid-run, after a checkpoint
            raise failure("simulated crash")
        return real_collect(model, x, y, step)

    monkeypatch.setattr(probes, "collect", collect_then_fail)
    with pytest.raises(failure):
        train(crashed, verbose=False)
    folder = RunFolder.of(crashed).path
    assert (folder / "checkpoint.safetensors").exists()
    failed = files.read_json(folder / "summary.json") or {}
    assert failed.get("status") == ("failed" if failure is RuntimeError else None)
    assert set(failed) <= {k for k, f in SUMMARY_FIELDS.items() if f.runs != "finished"}
    monkeypatch.setattr(probes, "collect", real_collect)

    summary = train(crashed, verbose=False)
    assert summary["status"] == "completed"
    assert rows(crashed) == rows(reference)  # same rows, no duplicates, bit-identical
    ref_probes = run_folder.read_parts(RunFolder.of(reference).path / "probes").select(
        ["step", "layer", "name", "value"])
    assert run_folder.read_parts(folder / "probes").select(
        ["step", "layer", "name", "value"]).equals(ref_probes)


def test_interrupt_during_a_sync_resumes_exactly(tiny_cfg, tmp_path, monkeypatch):
    """Ctrl-C after a log interval's rows are recorded but before the loop moves on: the
    checkpoint must hold exactly the updates applied, and the rows must not repeat."""
    from qkstudy import trainer

    reference = tiny_cfg()
    train(reference, verbose=False)
    interrupted = dataclasses.replace(reference, runs_dir=str(tmp_path / "interrupted"))
    real_update = trainer.Display.update

    def update_then_interrupt(self, step, *args):
        if step == 15:  # a sync that is not a checkpoint (ckpt_every=10, log_every=5)
            raise KeyboardInterrupt
        return real_update(self, step, *args)

    monkeypatch.setattr(trainer.Display, "update", update_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, verbose=False)
    monkeypatch.setattr(trainer.Display, "update", real_update)
    assert train(interrupted, verbose=False)["status"] == "completed"
    assert rows(interrupted) == rows(reference)


def test_resume_check_counts_probe_steps_not_probe_rows(tmp_path):
    """probes/ holds one row per (layer, name) at each probe step: a checkpoint at step 20 with
    probes every 10 matches steps {0, 10} however many rows each has."""
    from qkstudy import run_folder

    metric = {name: None for name in run_folder.METRICS_SCHEMA.names}
    run_folder.write_part(tmp_path / "metrics", [{**metric, "step": s} for s in range(20)],
                      run_folder.METRICS_SCHEMA)
    probes = [{"step": s, "layer": layer, "name": "max_attention_logit", "value": 1.0}
              for s in (0, 10) for layer in range(3)]
    run_folder.write_part(tmp_path / "probes", probes, run_folder.PROBES_SCHEMA)
    assert RunFolder(tmp_path).resume_problem(20, probe_every=10) is None
    assert "lacks step 20" in RunFolder(tmp_path).resume_problem(30, probe_every=10)


def test_interrupt_and_resume_each_say_where_in_one_line(tiny_cfg, monkeypatch, capsys):
    from qkstudy import trainer

    cfg = tiny_cfg(max_steps=30)
    real_update = trainer.Display.update

    def update_then_interrupt(self, step, *args):
        real_update(self, step, *args)
        if step == 20:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Display, "update", update_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, verbose=True)
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "interrupted" in line]
    assert said == [f"{cfg.run_id} interrupted; checkpointed at step 20 of 30: the same command "
                    "resumes it"]
    monkeypatch.setattr(trainer.Display, "update", real_update)
    assert train(cfg, verbose=True)["status"] == "completed"
    assert f"{cfg.run_id} resuming from step 20 of 30; compiling" in capsys.readouterr().out


def test_a_resumed_runs_progress_line_counts_its_rate_from_its_own_first_steps(capsys):
    """A run resumed at step 8,130 whose clock held 300 s from before its checkpoint, and whose
    first interval spent 30 s compiling: its line says 25,600 tok/s once it trains at that
    rate, not the 2,795 of 1,010 steps over 370 s (an ETA of over an hour for ten minutes)."""
    from qkstudy.progress import Display

    display = Display("r", 24414, 1024)
    display.update(8140, 0.5, 330.0, None)
    display.last_print = 0.0
    display.update(9140, 0.5, 330.0 + 1000 * 1024 / 25600, None)
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("step 8140/24414 loss 0.5000 ? tok/s ETA ?")
    assert second.endswith("step 9140/24414 loss 0.5000 25,600 tok/s ETA 10m11s")


def test_interrupt_in_the_interval_that_diverges_ends_as_an_uninterrupted_run(
        tiny_cfg, tmp_path, monkeypatch):
    """SIGINT between two steps of the log interval in which the run diverges (the storm's
    d2-noqk-lr0.316-s0): the run, resumed, ends with the rows, probes, summary and weights of
    an uninterrupted one."""
    from reliability.compare import compare_run

    from qkstudy import interrupts

    reference = tiny_cfg(lr=30.0, max_steps=200, warmup_steps=2, grad_clip=0.0,
                         weight_decay=0.0, log_every=20, ckpt_every=20)
    diverged = train(reference, verbose=False)["diverged_step"]
    assert diverged is not None and (diverged + 1) % 20, "no step between it and its sync"
    interrupted = dataclasses.replace(reference, runs_dir=str(tmp_path / "interrupted"))
    steps = iter(range(10**6))
    real_check = interrupts.Deferred.check

    def signal_after_the_divergence(self):
        if next(steps) == diverged + 1:
            self.signum = interrupts.signal.SIGINT
        real_check(self)

    monkeypatch.setattr(interrupts.Deferred, "check", signal_after_the_divergence)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, verbose=False)
    monkeypatch.setattr(interrupts.Deferred, "check", real_check)
    assert train(interrupted, verbose=False)["status"] == "diverged"
    assert compare_run(RunFolder.of(reference).path, RunFolder.of(interrupted).path) == []


def test_checkpoint_holds_the_library_optimizer_state_bit_for_bit(tmp_path):
    from mlx.utils import tree_unflatten

    from mlx_gpt.engine import Engine
    from qkstudy.trainer import resume_point

    cfg = TrainConfig(lr=0.01, warmup_steps=2, max_steps=10, weight_decay=0.1, depth=1,
                      d_model=8, n_heads=2, block_size=4, bias=True)
    probe = (np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64))
    engine = Engine(cfg, 64, [], probe)
    model, opt = engine.model, engine.opt
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = [(k, mx.array(rng.normal(size=v.shape).astype(np.float32)))
                 for k, v in tree_flatten(model.parameters())]
        update(opt, model, tree_unflatten(grads), cfg.grad_clip)
    folder = RunFolder(tmp_path)
    path = folder.checkpoint_file
    assert folder.save_checkpoint(engine.state_arrays(), {"init_loss": 4.0}) == 3

    fresh_engine = Engine(dataclasses.replace(cfg, seed=1), 64, [], probe)
    fresh, fresh_opt = fresh_engine.model, fresh_engine.opt
    step, arrays, extra = folder.read_checkpoint(fresh_engine.state_spec())
    assert (step, extra) == (3, {"init_loss": 4.0})
    fresh_engine.load_state(arrays)
    saved, loaded = dict(tree_flatten(opt.state)), dict(tree_flatten(fresh_opt.state))
    assert saved.keys() == loaded.keys()
    assert {"states.0.step", "states.1.step", "states.0.wte.weight.m"} <= saved.keys()
    for k, a in saved.items():
        assert a.dtype == loaded[k].dtype and np.array_equal(np.array(a), np.array(loaded[k])), k
    for (k, a), (_, b) in zip(tree_flatten(model.parameters()), tree_flatten(fresh.parameters())):
        assert np.array_equal(np.array(a), np.array(b)), k
    # the next update is the same on both
    grads = tree_unflatten([(k, mx.ones_like(v)) for k, v in tree_flatten(model.parameters())])
    assert update(opt, model, grads, 1.0)[1].item() == update(fresh_opt, fresh, grads, 1.0)[1].item()
    for (k, a), (_, b) in zip(tree_flatten(model.parameters()), tree_flatten(fresh.parameters())):
        assert np.array_equal(np.array(a), np.array(b)), k

    # optimizer groups that disagree on the step: damaged, and the run restarts from step 0
    arrays = dict(arrays)
    arrays["opt.states.1.step"] = np.array(2, np.uint64)
    files.save_tensors(path, arrays, {"step": "3"})
    with pytest.raises(files.DamagedFile, match="does not match"):
        folder.read_checkpoint(fresh_engine.state_spec())
    warnings = []
    assert resume_point(cfg, folder, fresh_engine, warnings.append) == (0, {})
    assert "restarting the run from step 0" in warnings[0] and not path.exists()
