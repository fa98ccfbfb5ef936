"""Shared fixtures: a small prepared corpus and a tiny, fast training config."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

# One thread per process (torch's intra-op pool, OpenBLAS under MLX), here and in every process a
# test starts (they inherit it): the models here are tiny, where a second thread costs more than
# it gives, and two pools spinning against each other on a busy 2-core machine slowed a torch
# test run 3x (measured: 23 s against 7.5 s for 200 steps, load ~10). Set before torch or
# OpenBLAS is loaded, which read it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# backend=auto picks MLX in every test and every process a test starts, so the MLX CPU path stays
# what the suite trains; tests/test_backends.py tests what auto picks without it.
os.environ.setdefault("QKSTUDY_BACKEND", "mlx")

import pytest  # noqa: E402

import mlx_gpt  # noqa: E402  (loads the fast BLAS before anything imports mlx)
from qkstudy.config import TrainConfig  # noqa: E402

# MLX on Linux without OpenBLAS (before `just setup`'s system packages) computes on its
# reference BLAS and says so on stderr: a test marked needs_openblas("why") is skipped there
WITHOUT_OPENBLAS = (sys.platform.startswith("linux") and mlx_gpt.blas.loaded is None
                    and os.environ.get("MLX_GPT_BLAS") != "none")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_openblas(why): skipped on Linux without OpenBLAS")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("needs_openblas")
        if marker and WITHOUT_OPENBLAS:
            item.add_marker(pytest.mark.skip(reason="needs OpenBLAS (apt-get install "
                                             f"libopenblas0-pthread): {marker.args[0]}"))


SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    """A synthetic-story corpus tokenised with the bytes tokenizer (~300k tokens)."""
    from qkstudy.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("data") / "synthetic-bytes"
    prepare("synthetic", PrepareConfig(out=str(out), tokenizer="bytes", size_mb=0.3,
                                        val_fraction=0.05))
    return str(out)


@pytest.fixture
def tiny_cfg(tiny_data, tmp_path):
    """A factory of tiny configs (a few ms a step) writing under this test's tmp_path."""

    def make(**overrides) -> TrainConfig:
        base = TrainConfig(data=tiny_data, depth=2, d_model=32, n_heads=2, block_size=32,
                           batch_size=4, max_steps=30, warmup_steps=5, lr=3e-3,
                           eval_every=10, eval_batches=2, probe_every=10, log_every=5,
                           ckpt_every=10, runs_dir=str(tmp_path / "runs"), sweep="test")
        return dataclasses.replace(base, **overrides).validate()

    return make


@pytest.fixture
def no_calibration(monkeypatch):
    """Sweep plans without timing a step here: a fixed step speed (the sweep tests)."""
    from qkstudy.sweep import plan

    monkeypatch.setattr(plan, "step_speed", lambda cfg, vocab, **k: (1000.0, 3))
