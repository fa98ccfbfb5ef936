"""The memory estimate: its arithmetic, and configs that cannot fit refused in one line before
anything is written (an allocation MLX cannot satisfy would kill the process by SIGSEGV)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from qkstudy import memory
from qkstudy.sweep import plan
from qkstudy.__main__ import main
from qkstudy.config import TrainConfig, model_args
from qkstudy.errors import UsageError
from qkstudy.parameters import count_params

ROOT = Path(__file__).resolve().parents[1]


def test_module_imports_no_framework():
    code = ("import sys, qkstudy.memory; "
            "assert not {'mlx.core', 'torch'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize("changes,vocab", [
    ({}, 257), ({"bias": True, "qk_norm": "rmsnorm"}, 50257),
    ({"depth": 3, "d_model": 96, "n_heads": 3, "block_size": 48, "qk_norm": "layernorm"}, 1000),
])
def test_parameter_shapes_are_both_models(changes, vocab):
    """The core's parameter names and shapes (counts, initial weights, memory) are exactly the
    parameters the MLX and the torch model build."""
    from mlx.utils import tree_flatten

    from mlx_gpt.model import GPT
    from qkstudy.parameters import parameter_shapes

    cfg = dataclasses.replace(TrainConfig(), **changes)
    args = model_args(cfg, vocab)
    shapes = parameter_shapes(args)
    assert {k: tuple(v.shape) for k, v in tree_flatten(GPT(args).parameters())} == shapes
    torch_model = pytest.importorskip("torch_ref.model")
    assert {k: tuple(v.shape) for k, v in torch_model.GPT(args).named_parameters()} == shapes
    assert count_params(model_args(cfg, vocab))["total"] == sum(math.prod(s) for s in shapes.values())


def test_attention_grows_with_the_square_of_block_size_and_the_rest_does_not():
    small = memory.estimate(TrainConfig(block_size=256), 257)
    large = memory.estimate(TrainConfig(block_size=512), 257)
    assert large.terms["attention"] == 4 * small.terms["attention"]
    assert large.terms["activations"] == 2 * small.terms["activations"]
    assert large.terms["logits"] == 2 * small.terms["logits"]
    # 4 heads x batch 16 x 512^2 x (3 kept per layer x 4 layers + 5 in one backward) x 4 bytes
    assert large.terms["attention"] == 16 * 4 * 512 ** 2 * (3 * 4 + 5) * 4
    assert memory.estimate(TrainConfig(block_size=8192), 257).dominant == "attention"


def test_refusal_names_the_dominant_term_what_it_needs_and_what_there_is():
    limit = (8 * 10**9, "this machine has 8.0 GB available")
    with pytest.raises(UsageError) as e:
        memory.check(TrainConfig(d_model=64, block_size=100_000, batch_size=64), 257, limit=limit)
    message = str(e.value)
    assert message.startswith("block_size 100000 needs about ") and "TB per training step" in message
    assert "of it for the attention scores" in message and message.endswith(
        "this machine has 8.0 GB available: lower block_size or batch_size")
    fits = TrainConfig()
    assert memory.check(fits, 257, limit=limit).total < 0.9 * limit[0]
    need = memory.estimate(fits, 257).total
    with pytest.raises(UsageError, match=r"2 runs at once \(jobs=2\)"):
        memory.check(fits, 257, runs_at_once=2, limit=(int(need * 2), "x"))
    memory.check(fits, 257, runs_at_once=2, limit=(int(need * 2.3), "x"))


def test_available_memory_is_the_machines():
    size, words = memory.available()
    assert size > 10**8 and "GB" in words


@pytest.fixture(scope="module")
def long_data(tmp_path_factory) -> str:
    """A corpus whose val split holds more than 100,000 tokens, so block_size 100000 passes
    the data's own check and meets the memory check."""
    from qkstudy.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("long") / "synthetic-bytes"
    prepare("synthetic", PrepareConfig(out=str(out), tokenizer="bytes", size_mb=2.5,
                                        val_fraction=0.05))
    return str(out)


@pytest.mark.parametrize("words,term", [
    (["train", "depth=2", "d_model=262144", "n_heads=1"], "parameters, gradients and AdamW state"),
    (["train", "d_model=64", "block_size=100000", "batch_size=64"], "attention scores"),
    (["sweep", "preset=demo", "block_size=100000"], "attention scores"),
])
def test_a_config_that_cannot_fit_is_one_line_exit_2_and_writes_nothing(words, term, long_data,
                                                                       tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main([*words, f"data={long_data}", f"runs_dir={runs}"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and term in err, err
    assert out == ""
    assert not runs.exists()


def test_the_sweep_plan_refuses_a_depth_that_cannot_fit_before_calibrating(tiny_data, tmp_path,
                                                                          monkeypatch, capsys):
    def calibrate(*args):
        raise AssertionError("calibrated a plan that cannot fit")

    monkeypatch.setattr(plan, "step_speed", calibrate)
    words = ["sweep", "preset=demo", f"data={tiny_data}", f"runs_dir={tmp_path / 'runs'}",
             "d_model=512", "n_heads=4", "block_size=32", "batch_size=4", "seeds=0"]
    one = memory.estimate(dataclasses.replace(TrainConfig(), d_model=512, n_heads=4,
                                              block_size=32, batch_size=4, depth=8), 257).total
    # depth 1 fits twice over, depth 8 once but not twice (jobs=2): the plan is refused
    monkeypatch.setattr(memory, "available", lambda: (int(one * 1.5), "this machine has X"))
    assert main([*words, "depth=1,8", "jobs=2", "--dry-run", "--calibrate"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: sweep demo, depth 8: ") and "jobs=2" in err
    assert not (tmp_path / "runs").exists()
    # one process: each depth's estimate is printed beside its parameters (and the plan's time
    # from a short timing, stubbed here)
    monkeypatch.setattr(plan, "step_speed", lambda *args, **kwargs: (1000.0, 1))
    assert main([*words, "depth=1,8", "jobs=1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"memory ~{memory.format_bytes(one)} a run" in out
