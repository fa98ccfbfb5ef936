"""`just bench` works end to end, its shapes are the presets and its arithmetic is right (no
timing is asserted: speeds belong to the benchmark, and this machine is shared)."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from pathlib import Path

import pytest

from qkstudy.bench import cli as bench
from qkstudy.__main__ import main
from qkstudy.bench.step import Spec, StepFailed, measure_together
from qkstudy.errors import UsageError
from qkstudy.bench.shapes import preset_shape, shape_config, study_hours, study_plan
from qkstudy.parameters import flops_per_token
from qkstudy.sweep.config import PRESETS
from qkstudy.parameters import count_params

ROOT = Path(__file__).resolve().parents[1]
TINY = {"depth": 1, "d_model": 32, "n_heads": 2, "block_size": 16, "batch_size": 2, "vocab": 64}


def test_the_shapes_are_the_presets():
    for name in ("demo", "mini", "study"):
        preset, shape = PRESETS[name], preset_shape(name)
        t = preset.train
        assert shape == {"depth": max(preset.depth), "d_model": t.d_model, "n_heads": t.n_heads,
                         "block_size": t.block_size, "batch_size": t.batch_size,
                         "vocab": 257 if t.data.endswith("-bytes") else 50257}
    assert preset_shape("mini")["depth"] == max(PRESETS["mini"].depth) == 8
    assert preset_shape("study")["vocab"] == 50257
    with pytest.raises(UsageError, match="the shapes are the presets"):
        preset_shape("reference")


def test_flops_per_token_follows_palm():
    _, args = shape_config(preset_shape("study"))
    n = count_params(args)["total"] - args.block_size * args.d_model
    attention = 12 * 6 * 3 * 64 * 256  # 12 L H Q T
    assert flops_per_token(args) == 6 * n + attention


def test_bench_writes_its_tables(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    preset = bench.preset_shape
    monkeypatch.setattr(bench, "preset_shape",
                        lambda name: dict(TINY) if name == "demo" else preset(name))
    out = tmp_path / "reports"
    assert main(["bench", "shapes=demo", "rounds=2", "warmup=1",
                 "seconds=0.05", "min_steps=2", f"out={out}"]) == 0
    report = json.loads((out / "bench.json").read_text())
    demo = report["shapes"]["demo"]
    mlx, torch = demo["samples"]["mlx-1"], demo["samples"]["torch-1"]
    assert len(mlx) == len(torch) == 2 and all(v > 0 for v in mlx + torch)
    # every value from the measured samples: medians, ranges, ratios, FLOP/s
    assert demo["tokens_per_s"]["torch-1"] == {"median": statistics.median(torch),
                                               "min": min(torch), "max": max(torch), "n": 2}
    ratios = [t / m for m, t in zip(mlx, torch)]
    assert demo["ratios"]["torch-1/mlx-1"]["median"] == pytest.approx(
        statistics.median(ratios))
    assert demo["gflops"]["mlx-1"] == pytest.approx(
        statistics.median(mlx) * demo["flops_per_token"] / 1e9)
    assert demo["share_of_sgemm_peak"]["torch-1"] == pytest.approx(
        demo["gflops"]["torch-1"] / report["sgemm_gflops"])
    for backend in ("mlx", "torch"):  # round 1 measured the overheads at the preset's intervals
        o = demo["overheads"][backend]
        assert o["probe_every"] == PRESETS["demo"].train.probe_every
        assert 0 < o["probe_overhead"] and 0 < o["eval_overhead"]
        assert report["matmul_gflops"][backend] > 0
    details = demo["details"]["torch-1"][0]
    assert details["framework"] == "torch" and details["steps"] >= 2
    table = (out / "bench.md").read_text()
    assert "| shape | params | MFLOPs/token | MLX tok/s | PyTorch tok/s | PyTorch / MLX |" in table
    shape_row, row = [line for line in table.splitlines() if line.startswith("| demo |")]
    assert shape_row == "| demo | 1 | 32 | 2 | 16 | 2 | 64 |"
    assert len(row.split("|")) == 12  # 10 columns
    assert f"{statistics.median(ratios):.2f}x (" in row
    assert table.strip() in capsys.readouterr().out


def fake_measurements(monkeypatch) -> list:
    """measure_case replaced by numbers that depend on (backend, round): 100 tok/s for MLX,
    PyTorch 1.5x, each round 10 tok/s more."""
    calls = []

    def fake(name, backend, config, first):
        calls.append((name, backend, first))
        rounds = sum(1 for c in calls if c[:2] == (name, backend))
        factor = {"mlx": 1.0, "torch": 1.5}[backend]
        result = {"tokens_per_s": 100 * factor + 10 * rounds, "engine": {},
                  "backend": {"mlx": "0", "device": "cpu", "blas": "x", "torch": "0",
                              "threads": 2}}
        if first:
            result |= {"overheads": {"probe_overhead": 0.01, "eval_overhead": 0.02},
                       "matmul_gflops": 50.0}
        return result

    monkeypatch.setattr(bench, "measure_case", fake)
    return calls


def test_rounds_interleave_the_engines_and_ratios_pair_them(monkeypatch, tmp_path):
    calls = fake_measurements(monkeypatch)
    report = bench.run(bench.BenchConfig(shapes="mini", rounds=3, out=str(tmp_path)))
    one_round = [("mini", "mlx"), ("mini", "torch")]
    assert [c[:2] for c in calls] == one_round * 3  # the engines alternate within every round
    firsts = [c[1] for c in calls if c[2]]
    assert firsts == ["mlx", "torch"]  # overheads once per backend, in round 1
    mini = report["shapes"]["mini"]
    assert mini["tokens_per_s"]["torch-1"] == {"median": 170, "min": 160, "max": 180, "n": 3}
    torch_vs_mlx = mini["ratios"]["torch-1/mlx-1"]
    assert torch_vs_mlx["median"] == pytest.approx(170 / 120)
    assert torch_vs_mlx["min"] == pytest.approx(180 / 130)
    text = bench.markdown(report)
    assert "| mini | 0.42M | 2.9 | 120 (110-130) | 170 (160-180) | 1.42x (1.38-1.45) |" in text


def test_study_hours_read_the_study_preset():
    the_plan = study_plan()
    study = PRESETS["study"]
    assert the_plan["runs_per_depth"] == len(study.arms) * len(study.grid_lrs()) * len(study.seeds)
    assert the_plan["runs_per_depth"] == 42 and the_plan["budget_tokens"] == study.train.budget_tokens
    hours = study_hours(300.0, the_plan)
    assert hours["hours_per_run"] == pytest.approx(the_plan["cost_tokens"] / 300 / 3600)
    assert hours["hours_whole_study"] == pytest.approx(hours["hours_per_run"] * 42 * 3)


@pytest.mark.parametrize("words, message", [
    (["shapes=huge"], "unknown shape 'huge'"),
    (["shapes="], "shapes has an empty name"),
    (["shapes=demo,demo"], "shapes names one twice"),
    (["shapes=demo,"], "shapes has an empty name"),
    (["backends=jax"], "unknown backend 'jax' in backends"),
    (["rounds=0"], "rounds must be >= 1"),
    (["warmup=0"], "warmup must be >= 1"),
    (["seconds=0"], "seconds must be a number > 0"),
    (["seconds=nan"], "seconds must be a number > 0"),
    (["min_steps=0"], "min_steps must be >= 1"),
    (["steps=5"], "unknown key 'steps'"),
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


def tiny_spec(**config) -> Spec:
    cfg, _ = shape_config(TINY, **config)
    return Spec(config=dataclasses.asdict(cfg), vocab=TINY["vocab"], warmup=1, seconds=0.05,
                min_steps=2)


def test_processes_time_the_same_window():
    """A start barrier, then one start and one stop time: each process times from the shared
    start (a little after `go`, so a process scheduled late still starts with the others) until
    the stop (to the end of its log interval), so the windows overlap."""
    spec = dataclasses.replace(tiny_spec(), seconds=0.5)
    results = measure_together(spec, 2)
    assert len(results) == 2
    for r in results:
        assert r["framework"] == "mlx" and r["steps"] >= 2 and r["tokens_per_s"] > 0
        assert r["peak_memory_bytes"] > 0
    (start_a, end_a), (start_b, end_b) = (r["window"] for r in results)
    assert min(end_a, end_b) - max(start_a, start_b) > 0.25  # one window, not two


def test_a_failed_measurement_says_why():
    pytest.importorskip("torch")
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("mps is available here")
    with pytest.raises(StepFailed, match="device mps is not available"):
        measure_together(tiny_spec(backend="torch", device="mps"))


def test_the_benchmark_core_imports_no_framework():
    imports = re.compile(r"^\s*(from|import)\s+(mlx|torch|mlx_gpt|torch_ref)\b", re.M)
    for path in sorted((ROOT / "qkstudy" / "bench").glob("*.py")):
        assert not imports.search(path.read_text()), path.name


def test_a_measuring_process_whose_go_line_never_comes_times_by_step_count(capsys):
    import io
    import time

    from qkstudy.bench.step import READY, ready

    # stdin closed before the go line (the parent gone): no stop time, no exception
    assert ready(io.StringIO("")) is None
    assert ready(io.StringIO("go 1.0\n")) is None  # a short line: the same
    start = time.time() - 1  # already past: no sleep
    assert ready(io.StringIO(f"go {start!r} {start + 3.5!r}\n")) == start + 3.5
    assert capsys.readouterr().out == f"{READY}\n" * 3
