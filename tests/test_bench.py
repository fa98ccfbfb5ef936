"""`just bench` works end to end and its arithmetic is right (no timing is asserted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from mlx_gpt import bench, cpu_jit
from mlx_gpt.bench import SHAPES, flops_per_token, shape_config
from qkstudy.__main__ import main
from qkstudy.weights import count_params

ROOT = Path(__file__).resolve().parents[1]


def test_flops_per_token_follows_palm():
    _, args = shape_config(SHAPES["reference"])
    n = count_params(args)["total"] - args.block_size * args.d_model
    attention = 12 * 6 * 4 * 64 * 256  # 12 L H Q T
    assert flops_per_token(args) == 6 * n + attention


def test_bench_writes_its_table(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["bench", "shapes=demo", "steps=1", "torch=false", "parallel=1", "builds=false",
                 f"out={out}"]) == 0
    report = json.loads((out / "bench.json").read_text())
    demo = report["demo"]
    assert report["sgemm_gflops"]["numpy"] > 0 and demo["mlx_tokens_per_s"] > 0
    assert 0 < demo["probe_overhead"] < 1 and 0 < demo["eval_overhead"] < 1
    assert demo["mlx_gflops"] == pytest.approx(demo["flops_per_token"] * demo["mlx_tokens_per_s"]
                                               / 1e9)
    assert "cpu" not in report  # one build, one process: nothing to compare
    table = (out / "bench.md").read_text()
    assert "| demo | 0.8M |" in table and "| - | - |" in table  # no PyTorch column this time
    assert table.strip() in capsys.readouterr().out


@pytest.mark.parametrize("words, message", [
    (["shapes=huge"], "unknown shape 'huge' in shapes"),
    (["cpu_shapes=demo,tiny"], "unknown shape 'tiny' in cpu_shapes"),
    (["shapes="], "shapes has an empty shape name"),
    (["cpu_shapes=demo,"], "cpu_shapes has an empty shape name"),
    (["shapes=none", "cpu_shapes=none"], "nothing to measure"),
    (["parallel=0"], "parallel must be >= 1"),
    (["steps=0"], "steps must be >= 1"),
    (["rounds=0"], "rounds must be >= 1"),
    (["out=/proc/x"], "cannot write the report to /proc/x"),
])
def test_bench_rejects_bad_input_before_measuring(words, message, capsys, tmp_path):
    if not any(w.startswith("out=") for w in words):
        words = [*words, f"out={tmp_path}"]
    assert main(["bench", *words]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("error:") == 1 and message in captured.err
    assert "measuring" not in captured.out


def test_bench_report_path_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["bench", f"out={tmp_path / 'file'}"]) == 2
    assert "cannot write the report" in capsys.readouterr().err


def test_cpu_table_is_the_median_of_interleaved_rounds(monkeypatch):
    calls = []

    def fake(shape, steps, n, build):
        calls.append((n, build))
        base = {"plain": 100.0, "native": 120.0}[build] * (1.5 if n == 2 else 1.0)
        return base + len(calls)  # later rounds a little faster: the median is the middle one

    monkeypatch.setattr(bench, "processes_tokens_per_s", fake)
    monkeypatch.setattr(cpu_jit, "supported", lambda: True)
    config = bench.BenchConfig(cpu_shapes="mini", parallel=2, rounds=3)
    table = bench.cpu_table(["mini"], config)
    order = [(1, "plain"), (1, "native"), (2, "plain"), (2, "native")]
    assert calls == order * 3  # plain and tuned alternate within every round
    mini = table["shapes"]["mini"]
    assert mini["plain_1"] == 100 + 5 and mini["native_2"] == 180 + 8
    assert mini["fastest"] == "native_2"
    text = "\n".join(bench.cpu_markdown(table))
    assert "| mini | 105 | 126 | 1.20x | 157 | 188 | 1.50x | 1.49x | tuned, 2 process(es) |" in text


def test_processes_run_together_and_report_their_total():
    total = bench.processes_tokens_per_s(SHAPES["demo"], 1, 2, "plain")
    assert total > 0


def test_torch_step_runs_in_its_own_process(capsys):
    pytest.importorskip("torch")
    from torch_ref.__main__ import main as torch_main

    tiny = dict(depth=1, d_model=32, n_heads=2, block_size=16, batch_size=2, vocab=64)
    result = bench.torch_step_time(tiny, 1)
    assert result["step_s"] > 0 and result["threads"] >= 1
    assert torch_main(["bench-step", "depth=1"]) == 2
    assert capsys.readouterr().err.startswith("error: bench-step takes exactly")


def test_mlx_gpt_does_not_import_torch_ref():
    """Dependencies point one way: torch_ref imports mlx_gpt, never the reverse."""
    imports = re.compile(r"^\s*(from|import)\s+torch_ref\b|import_module\([\"']torch_ref", re.M)
    for path in (ROOT / "mlx_gpt").rglob("*.py"):
        assert not imports.search(path.read_text()), path.name


# --- the tuned CPU build (mlx_gpt/cpu_jit.py) -----------------------------------------------

TRAIN_A_FEW_STEPS = textwrap.dedent("""
    import json, os, tempfile
    import mlx_gpt
    from mlx_gpt import cpu_jit
    import mlx.core as mx
    from mlx_gpt.bench import SHAPES, random_batch, shape_config
    from mlx_gpt.model import GPT, init_weights
    from mlx_gpt.optim import make_optimizer
    from mlx_gpt.engine import make_train_step

    cfg, args = shape_config(dict(SHAPES["demo"], depth=2, block_size=32))
    model = GPT(args)
    init_weights(model, 0)
    step, state = make_train_step(model, make_optimizer(cfg, model.parameters()), cfg.grad_clip)
    losses = []
    for seed in range(8):
        x, y = (mx.array(a) for a in random_batch(cfg, args.vocab_size, seed))
        loss = step(x, y)[0]
        mx.eval(loss, state)
        losses.append(loss.item())
    print(json.dumps({"losses": losses, "active": cpu_jit.active,
                      "tempdir": tempfile.gettempdir(), "TMPDIR": os.environ.get("TMPDIR")}))
""")


def train_in_a_process(build: str, cache: Path) -> dict:
    env = {**os.environ, "MLX_GPT_CPU_JIT": build, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run([sys.executable, "-c", TRAIN_A_FEW_STEPS], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not cpu_jit.supported() or not cpu_jit.cpu_identity(),
                    reason="the tuned build exists on Linux x86-64 only")
def test_tuned_build_trains_like_the_plain_one_in_a_cache_of_its_own():
    # kept between test sessions, as MLX's own cache is: a cold build takes ~20 s
    cache = Path(tempfile.gettempdir()) / "mlx_gpt-test-cpu-jit"
    plain, tuned = train_in_a_process("plain", cache), train_in_a_process("native", cache)
    assert plain["active"] is None and tuned["active"]
    folder = Path(tuned["active"])
    assert folder.parent == cache / "mlx_gpt" / "cpu-jit" and tuned["TMPDIR"] == str(folder)
    assert tuned["tempdir"] == plain["tempdir"] != str(folder)  # Python's temp files stay put
    assert "-march=native" in (folder / "bin" / "g++").read_text()
    assert "model name" in (folder / "cpu.txt").read_text()
    assert list(folder.glob("mlx/*/cpu/lib*.so"))  # MLX compiled its kernels there
    assert plain["losses"][-1] < plain["losses"][0]
    for a, b in zip(tuned["losses"], plain["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), (tuned["losses"], plain["losses"])


def test_the_cache_key_separates_cpus_and_compilers(tmp_path):
    gxx = tmp_path / "g++"
    gxx.write_text("#!/bin/sh\n")
    one = cpu_jit.cache_key("model name: A\nflags: avx2", str(gxx))
    assert one == cpu_jit.cache_key("model name: A\nflags: avx2", str(gxx))
    assert one != cpu_jit.cache_key("model name: A\nflags: avx2 avx512f", str(gxx))
    assert one != cpu_jit.cache_key("model name: B\nflags: avx2", str(gxx))
    gxx.write_text("#!/bin/sh\n# another compiler\n")
    assert one != cpu_jit.cache_key("model name: A\nflags: avx2", str(gxx))
