"""Every write can fail: the I/O-error and crash harness (reliability/faults.py) on a small set of
operations picked by what they are (the full sweep of N is `just faults`), and the other
failures a user's machine produced: a bad command line that prints more than its error, and
data prepared again under a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reliability import faults

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def data(work) -> Path:
    return faults.prepared_data(work)


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def first(world: faults.World, op: str, name: str, last: bool = False) -> int:
    """The number of the first (or last) operation `op` on a path holding `name`."""
    found = [n for n, o, path in world.ops if o == op and name in path]
    assert found, (op, name, world.ops)
    return found[-1] if last else found[0]


def check(world: faults.World, n: int, kind: str) -> None:
    tally = faults.Tally()
    problems = faults.trial(world, n, kind, tally)
    assert problems == [], f"op {world.ops[n - 1]} {kind}: {problems}"
    assert tally.tracebacks == 0


def test_train_survives_a_fault_at_the_lock_the_checkpoint_and_the_summary(work, data):
    world = faults.make_world(faults.CASES["train"], work, data)
    ops = {o for _, o, _ in world.ops}
    assert {"mkdir", "open", "write", "fsync", "replace", "unlink"} <= ops
    # the lock's pid: one error line, exit 2, no lock left (a full disk at a run's first write)
    check(world, first(world, "write", ".lock"), "ENOSPC")
    check(world, first(world, "replace", ".checkpoint.safetensors.tmp", last=True), "EIO")
    check(world, first(world, "open", ".summary.json.tmp"), "ENOSPC")
    # killed while the checkpoint is renamed into place; the same command resumes bit-exact
    check(world, first(world, "replace", ".checkpoint.safetensors.tmp"), "KILL")
    # Ctrl-C as the final weights are written: 130, the resume line, then the same run
    check(world, first(world, "open", ".final.safetensors.tmp"), "SIGINT")
    check(world, first(world, "unlink", "checkpoint.safetensors"), "SIGTERM")


def test_a_report_onto_a_full_disk_is_one_line_and_keeps_the_earlier_report(work, data):
    world = faults.make_world(faults.CASES["report"], work, data)
    check(world, first(world, "open", "tables/runs.parquet"), "ENOSPC")
    # the new report renamed into place over the earlier one: it stays if that fails
    check(world, first(world, "rename", "report.tmp-", last=True)
          if any(o == "rename" and "report.tmp-" in p for _, o, p in world.ops)
          else first(world, "replace", "report.tmp-", last=True), "EIO")


def test_status_writes_nothing_and_a_slurm_submission_is_whole_or_absent(work, data):
    assert faults.make_world(faults.CASES["status"], work, data).ops == []
    world = faults.make_world(faults.CASES["slurm"], work, data)
    check(world, first(world, "open", ".array.sbatch.tmp"), "ENOSPC")


# a machine without OpenBLAS (nor MKL), as mlx_gpt/blas.py looks for them: a sitecustomize
NO_OPENBLAS = """
import ctypes, ctypes.util
find, load = ctypes.util.find_library, ctypes.CDLL.__init__
ctypes.util.find_library = lambda name: None if "blas" in name or "mkl" in name else find(name)
def refuse(self, name, *args, **kwargs):
    if name and ("blas" in str(name) or "mkl" in str(name)):
        raise OSError(f"{name}: cannot open shared object file")
    load(self, name, *args, **kwargs)
ctypes.CDLL.__init__ = refuse
"""


def environment(tmp_path: Path, openblas: bool) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("" if openblas else NO_OPENBLAS)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize("openblas", [True, False], ids=["openblas", "no-openblas"])
@pytest.mark.parametrize("argv", [
    ["qkstudy", "train", "depth=x"],
    ["qkstudy", "sweep", "bogus=1"],
    ["crosscheck", "parity", "depth=3"],
    ["analysis", "report", "/nonexistent/runs"],
])
def test_a_bad_command_line_prints_one_error_line_and_nothing_else(argv, openblas, tmp_path):
    out = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, capture_output=True,
                         text=True, env=environment(tmp_path, openblas), timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr


def test_without_openblas_mlx_says_so_once_as_it_starts_to_compute(tmp_path):
    code = ("import sys, numpy as np, mlx_gpt; print('imported', file=sys.stderr); "
            "from mlx_gpt.engine import Engine; from qkstudy.config import TrainConfig; "
            "cfg = TrainConfig(depth=1, d_model=8, n_heads=2, block_size=4); "
            "batch = (np.zeros((1, 4), np.int64),) * 2; "
            "engines = [Engine(cfg, 64, [], batch) for _ in range(2)]; "
            "[e.read([e.step(*batch)]) for e in engines]")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env=environment(tmp_path, openblas=False), timeout=120)
    assert out.returncode == 0, out.stderr
    imported, *said = out.stderr.splitlines()
    assert imported == "imported" and len(said) == 1, out.stderr
    assert said[0].startswith("warning: no OpenBLAS found; MLX on Linux falls back")


@pytest.mark.needs_openblas("MLX's warning that it computes on the reference BLAS is a second "
                            "line on stderr")
def test_data_prepared_again_under_a_sweep_stops_it_and_its_runs_are_left(tmp_path, monkeypatch,
                                                                           capsys):
    from qkstudy import trainer
    from qkstudy.__main__ import main
    from qkstudy.data.prepare import PrepareConfig, prepare
    from qkstudy.run_folder import RunFolder, run_folders

    data = tmp_path / "data"
    prepare("synthetic", PrepareConfig(out=str(data), tokenizer="bytes", size_mb=0.1,
                                       val_fraction=0.05))
    words = [w for w in faults.SWEEP if not w.startswith(("data=", "runs_dir="))] + [
        f"data={data}", f"runs_dir={tmp_path / 'runs'}"]
    real = trainer._train_locked
    trained = []

    def then_prepare_again(cfg, *args):
        summary = real(cfg, *args)
        trained.append(cfg.run_id)
        if len(trained) == 1:  # other data at the same path, while the sweep runs
            prepare("synthetic", PrepareConfig(out=str(data), tokenizer="bytes", size_mb=0.1,
                                               val_fraction=0.05, seed=1))
        return summary

    monkeypatch.setattr(trainer, "_train_locked", then_prepare_again)
    assert main(["sweep", *words]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "was prepared again while this sweep ran" in err[0], err
    assert len(trained) == 1  # the second run was not trained on the new data
    first = RunFolder(tmp_path / "runs" / "s" / trained[0])
    kept = {p: p.read_bytes() for p in first.path.rglob("*") if p.is_file()}

    # the same sweep on the new data: the old run is counted and left as it is
    assert main(["sweep", *words]) == 0
    out = capsys.readouterr().out
    assert "1 run was trained on other data than the data folder holds now" in out, out
    assert {p: p.read_bytes() for p in first.path.rglob("*") if p.is_file()} == kept
    assert len(run_folders(tmp_path / "runs" / "s")) == 2
    # and train, resume or repair of it: one line saying what changed and what to do
    cfg_words = (first.read_config() or {})
    assert cfg_words["run_id"] == first.name
    monkeypatch.setattr(trainer, "_train_locked", real)
    from qkstudy.config import load_config

    cfg = load_config(str(first.config_file))
    import dataclasses

    cfg = dataclasses.replace(cfg, data=str(data), runs_dir=str(tmp_path / "runs"), sweep="s")
    with pytest.raises(Exception, match=r"trained on other data .*source .*-> .*; prepare the "
                                        r"data it was trained on again"):
        trainer.train(cfg, verbose=False)


@pytest.mark.parametrize("command", ["chaos", "faults"])
def test_every_reliability_command_has_help(command, capsys):
    from reliability.__main__ import main

    assert main([command, "help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m tests.reliability {command}")
    assert main([command, "faults=0" if command == "chaos" else "cases=nothing"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
