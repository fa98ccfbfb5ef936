"""`just bench` works end to end and its arithmetic is right (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from mlx_gpt.__main__ import main
from mlx_gpt.bench import SHAPES, _shape_config, flops_per_token
from mlx_gpt.model import GPT, count_params


def test_flops_per_token_follows_palm():
    _, args = _shape_config(SHAPES["reference"])
    n = count_params(GPT(args))["total"] - args.block_size * args.d_model
    attention = 12 * 6 * 4 * 64 * 256  # 12 L H Q T
    assert flops_per_token(args) == 6 * n + attention


def test_bench_writes_its_table(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["bench", "shapes=demo", "steps=1", "torch=false", "parallel=1",
                 f"out={out}"]) == 0
    report = json.loads((out / "bench.json").read_text())
    demo = report["demo"]
    assert report["sgemm_gflops"]["numpy"] > 0 and demo["mlx_tokens_per_s"] > 0
    assert 0 < demo["probe_overhead"] < 1 and 0 < demo["eval_overhead"] < 1
    assert demo["mlx_gflops"] == pytest.approx(demo["flops_per_token"] * demo["mlx_tokens_per_s"]
                                               / 1e9)
    table = (out / "bench.md").read_text()
    assert "| demo | 0.8M |" in table and "| - | - |" in table  # no PyTorch column this time
    assert table.strip() in capsys.readouterr().out


def test_bench_rejects_unknown_shape(capsys, tmp_path):
    assert main(["bench", "shapes=huge", f"out={tmp_path}"]) == 2
    assert "unknown shape 'huge'" in capsys.readouterr().err
