"""backend=torch end to end on the CPU: a sweep in processes that cannot import MLX, killed by
SIGKILL mid-run and resumed bit-exact, read by the same analysis as MLX runs; and the two
backends' run folders of one config side by side (twins)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from qkstudy import files, run_folder, sweep, trainer
from qkstudy.sweep.plan import command_line
from qkstudy.run_folder import RunFolder

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
LOSS_COLUMNS = ["step", "tokens", "lr", "train_loss", "grad_norm", "val_loss"]

NO_MLX = textwrap.dedent("""
    # imported by every Python process started with this folder on PYTHONPATH: MLX is absent
    import importlib.abc, sys

    class NoMLX(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mlx":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoMLX())
""")


def without_mlx(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes (and their children) cannot import MLX."""
    site = tmp_path / "no-mlx"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_MLX)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}


def words_for(data: str, runs: Path, *extra: str) -> list[str]:
    words = dict(w.split("=", 1) for w in (
        "preset=demo", f"data={data}", f"runs_dir={runs}", "name=t", "depth=1", "d_model=32",
        "n_heads=2", "block_size=32", "batch_size=4", "max_steps=80", "warmup_steps=5",
        "eval_every=20", "eval_batches=2", "probe_every=20", "log_every=5", "ckpt_every=10",
        "divergence_window=5", "seeds=0", "lrs=1e-3,1e-2", "arms=none,rmsnorm", "max_seeds=1",
        "jobs=1", "backend=torch", "device=cpu", *extra))
    return [f"{k}={v}" for k, v in words.items()]


def test_mlx_is_really_blocked(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import mlx.core"], env=without_mlx(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "No module named 'mlx" in out.stderr


def test_torch_sweep_without_mlx_resumes_after_kill_9_and_reports(tiny_data, tmp_path):
    env = without_mlx(tmp_path)
    runs = tmp_path / "runs"
    words = words_for(tiny_data, runs)
    command = [sys.executable, "-m", "qkstudy", "sweep", *words]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 120
    while not list(runs.glob("t/*/checkpoint.safetensors")):
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no run checkpointed within 120 s"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)  # no handler, no last checkpoint: the hardest stop
    first.wait(timeout=30)
    killed = list(runs.glob("t/*/checkpoint.safetensors"))[0].parent

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "4 of 4 runs have a result (4 completed" in again.stdout, again.stdout[-2000:]
    resumed = files.read_json(killed / "manifest.json")["resumed_from_step"]
    assert resumed > 0 and resumed % 10 == 0  # from its last checkpoint, not from step 0

    grid = sweep.grid(sweep.parse_sweep_config(words))
    for cfg in grid:
        folder = RunFolder.of(cfg).path
        assert "-torch-" in folder.name
        summary = files.read_json(folder / "summary.json")
        assert summary["framework"] == "torch" and summary["status"] == "completed"
        assert files.read_json(folder / "manifest.json")["device"] == "cpu"

    # the killed run against the same run never interrupted: the same rows and weights, bit for bit
    # (trained the same way: in a process of its own, whose torch is not preceded by MLX's BLAS)
    cfg = next(c for c in grid if RunFolder.of(c).path == killed)
    reference = dataclasses.replace(cfg, runs_dir=str(tmp_path / "reference"))
    train_words = command_line(reference).split()[3:]
    out = subprocess.run([sys.executable, "-m", "qkstudy", *train_words], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ref_dir = RunFolder.of(reference).path
    assert (run_folder.read_parts(killed / "metrics").select(LOSS_COLUMNS).to_pydict()
            == run_folder.read_parts(ref_dir / "metrics").select(LOSS_COLUMNS).to_pydict())
    got, _ = files.read_tensors(killed / "final.safetensors")
    want, _ = files.read_tensors(ref_dir / "final.safetensors")
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)

    # the analysis reads them as any runs (in a process without MLX too)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from analysis import load_study
        study = load_study({str(runs / 't')!r})
        print(sorted(set(study.runs.table["framework"])), study.runs.table.height)
    """)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["['torch']", "4"]


def test_an_mlx_run_and_its_torch_twin_read_as_one_point(tiny_cfg):
    from analysis.load import load_runs

    mlx_cfg = tiny_cfg(max_steps=20)
    torch_cfg = dataclasses.replace(mlx_cfg, backend="torch", device="cpu")
    assert mlx_cfg.run_id != torch_cfg.run_id  # two runs ...
    for cfg in (mlx_cfg, torch_cfg):
        trainer.train(cfg, verbose=False)
    runs = load_runs(RunFolder.of(mlx_cfg).path.parent)
    table = runs.table.sort("framework")
    assert table["framework"].to_list() == ["mlx", "torch"]
    assert table["identity"].n_unique() == 1  # ... of one point of the study (twins)
    assert table["arm"].to_list() == ["none", "none"]
    a, b = table["final_val_loss"].to_list()
    assert abs(a - b) <= 1e-3 * abs(a)  # fp32 on the CPU: the same curve within 1e-3
    # the same run-log schema: each log's Parquet columns and types, the probe rows, the summary
    folders = [RunFolder.of(c) for c in (mlx_cfg, torch_cfg)]
    for logs in ("metrics_dir", "probes_dir"):
        mlx_log, torch_log = (pl.read_parquet(getattr(f, logs) / "*.parquet") for f in folders)
        assert mlx_log.height and mlx_log.schema == torch_log.schema
    rows = [pl.read_parquet(f.probes_dir / "*.parquet").select("step", "name", "layer")
            .sort(pl.all()) for f in folders]
    assert rows[0].equals(rows[1])
    summaries = [f.summary_record() for f in folders]
    assert summaries[0].keys() <= summaries[1].keys()
