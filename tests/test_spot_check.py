"""The spot check: a finished run trained again by the other engine (MLX -> torch on the CPU and
on the CUDA double, torch -> MLX), its twin beside it, the comparison written and judged; a
damaged, foreign or unfinished run folder refused in one line before anything is written."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlx")

from crosscheck import spot_check as spot  # noqa: E402
from crosscheck.__main__ import main  # noqa: E402
from qkstudy import run_folder  # noqa: E402
from qkstudy.run_folder import RunFolder  # noqa: E402
from qkstudy.trainer import train  # noqa: E402
from tests.cuda_double import FakeCuda  # noqa: E402


def finished(cfg):
    train(cfg, verbose=False)
    return RunFolder.of(cfg).path


def test_an_mlx_run_gets_its_torch_twin_beside_it_and_passes(tiny_cfg, capsys):
    cfg = tiny_cfg(max_steps=20, qk_norm="rmsnorm")
    run = finished(cfg)
    assert main(["spot-check", str(run), "device=cpu"]) == 0
    twin = RunFolder.of(dataclasses.replace(cfg, backend="torch", device="cpu"))
    assert twin.path.parent == run.parent and twin.name.startswith("d2-qkrmsnorm-torch-")
    out = capsys.readouterr().out
    assert "torch twin against the mlx run over 21 steps" in out and "spot check: PASS" in out
    comparison = json.loads(twin.comparison_file.read_text())
    assert comparison["frameworks"] == {"run": "mlx", "twin": "torch"}
    assert comparison["same_data"] is True and comparison["steps_compared"] == 21
    assert comparison["status"] == {"run": "completed", "twin": "completed"}
    assert comparison["judgement"] == {"pass": True, "tolerances": spot.TOLERANCES,
                                       "failures": []}
    for column in ("train_loss", "val_loss", "grad_norm", "final_val_loss"):
        assert 0 <= comparison[column]["max_relative_deviation"] <= spot.TOLERANCES[column]
    assert comparison["train_loss"]["n"] == 20  # every update's loss, step 0 to 19
    # the twin is an ordinary run: the same rows as the MLX run, its summary that of a torch run
    rows = [RunFolder(p).read_metrics().column("step").to_pylist() for p in (run, twin.path)]
    assert rows[0] == rows[1] == list(range(21))
    assert twin.summary_record()["framework"] == "torch"
    assert (twin.read_manifest() or {})["device"] == "cpu"
    # finished: a second spot check trains nothing and refreshes the comparison
    stamp = twin.summary_file.stat().st_mtime_ns
    assert main(["spot-check", str(run), "device=cpu"]) == 0
    assert "already completed; skipping" in capsys.readouterr().out
    assert twin.summary_file.stat().st_mtime_ns == stamp


def test_a_torch_run_gets_its_mlx_twin(tiny_cfg):
    cfg = tiny_cfg(max_steps=20, backend="torch", device="cpu")
    run = finished(cfg)
    out, comparison = spot.spot_check(run, verbose=False)
    mlx_cfg = dataclasses.replace(cfg, backend="mlx", device="auto")
    assert out == RunFolder.of(mlx_cfg).path and out.parent == run.parent
    assert RunFolder(out).summary_record()["framework"] == "mlx"
    assert comparison["frameworks"] == {"run": "torch", "twin": "mlx"}
    assert comparison["judgement"]["pass"], comparison["judgement"]
    assert comparison["train_loss"]["max_relative_deviation"] <= 1e-3


def test_the_torch_twin_trains_on_the_cuda_double(tiny_cfg, monkeypatch):
    run = finished(tiny_cfg(max_steps=20))
    fake = FakeCuda(monkeypatch, tensors=True)
    out, comparison = spot.spot_check(run, "cuda", verbose=False)
    twin = RunFolder(out)
    assert "-torch-" in out.name and (twin.read_config() or {})["device"] == "cuda"
    assert (twin.read_manifest() or {})["device"] == "cuda:0 (NVIDIA H200)"
    assert fake.copies and fake.deterministic[-1] is True  # batches went to the "GPU"
    assert comparison["judgement"]["pass"], comparison["judgement"]


def test_a_broken_tolerance_fails_the_check_with_exit_1(tiny_cfg, monkeypatch, capsys):
    run = finished(tiny_cfg(max_steps=20))
    monkeypatch.setitem(spot.TOLERANCES, "train_loss", 0.0)  # float32 engines never agree exactly
    assert main(["spot-check", str(run), "device=cpu"]) == 1
    out = capsys.readouterr().out
    assert "spot check: FAIL: train_loss deviates" in out
    twin = RunFolder.of(dataclasses.replace(tiny_cfg(max_steps=20), backend="torch",
                                            device="cpu"))
    judgement = json.loads(twin.comparison_file.read_text())["judgement"]
    assert not judgement["pass"] and judgement["failures"][0].startswith("train_loss deviates")


def test_a_diverged_run_diverges_in_the_other_engine_too(tiny_cfg):
    cfg = tiny_cfg(lr=1.0, grad_clip=0.0, warmup_steps=2, divergence_window=5)
    run = finished(cfg)
    assert RunFolder(run).summary_record()["status"] == "diverged"
    _, comparison = spot.spot_check(run, "cpu", verbose=False)
    assert comparison["status"] == {"run": "diverged", "twin": "diverged"}
    steps = comparison["diverged_step"]
    assert steps["run"] == steps["twin"]
    assert "final_val_loss" not in comparison  # neither run has one


def test_the_judgement_names_each_broken_rule():
    comparison = {"steps_compared": 3, "same_data": False,
                  "grad_norm": {"max_relative_deviation": 0.5, "at_step": 2},
                  "status": {"run": "completed", "twin": "diverged"}}
    assert spot.judge(comparison)["failures"] == [
        "the two runs were trained on different data (tokens' sha256)",
        "grad_norm deviates 5.00e-01 > 0.01 at step 2",
        "outcome differs: run completed, twin diverged"]
    assert spot.judge({"status": {}})["failures"] == ["no common steps to compare"]
    assert spot.relative(float("nan"), float("nan")) == 0.0  # both blew up alike
    assert spot.relative(float("inf"), 2.0) == float("inf")


def refused(argv, capsys) -> str:
    assert main(["spot-check", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_what_cannot_be_spot_checked_is_refused_in_one_line(tiny_cfg, tmp_path, capsys):
    assert "usage" in refused([], capsys)
    assert "not a run folder (no config.json)" in refused([str(tmp_path)], capsys)
    cfg = tiny_cfg(max_steps=10)
    run = finished(cfg)
    before = sorted(p.name for p in run.parent.iterdir())
    assert "device must be one of" in refused([str(run), "device=tpu"], capsys)
    assert "unknown option(s) colour" in refused([str(run), "colour=red"], capsys)
    assert "does not exist" in refused([str(run), "data=/nonexistent"], capsys)
    if not torch.cuda.is_available():
        assert "not available" in refused([str(run), "device=cuda"], capsys)
    other = tmp_path / "other-bytes"  # the corpus with one token changed
    shutil.copytree(cfg.data, other)
    tokens = bytearray((other / "train.bin").read_bytes())
    tokens[0:2] = (66 if tokens[0:2] == b"A\0" else 65).to_bytes(2, "little")  # "A" or "B"
    (other / "train.bin").write_bytes(bytes(tokens))
    assert "was trained on other data than" in refused([str(run), f"data={other}"], capsys)
    # unfinished: a run folder with its config and no summary
    unfinished = RunFolder.of(dataclasses.replace(cfg, seed=1))
    unfinished.path.mkdir()
    unfinished.write_config({**json.loads(RunFolder(run).config_file.read_text()),
                             "seed": 1, "run_id": unfinished.name})
    assert "is not finished: spot-check a completed or diverged run" in refused(
        [str(unfinished.path)], capsys)
    assert sorted(p.name for p in run.parent.iterdir()) == sorted(before + [unfinished.name])


def test_a_damaged_or_foreign_run_folder_is_refused(tiny_cfg, capsys):
    run = finished(tiny_cfg(max_steps=10))
    folder = RunFolder(run)
    config = json.loads(folder.config_file.read_text())
    foreign = run.parent / "foreign"
    foreign.mkdir()
    (foreign / run_folder.CONFIG).write_text(json.dumps({**config, "colour": "red"}))
    assert "has unknown keys colour" in refused([str(foreign)], capsys)
    (foreign / run_folder.CONFIG).write_text(json.dumps({**config, "lr": 0.5}))
    assert "rebuilds run_id" in refused([str(foreign)], capsys)
    (foreign / run_folder.CONFIG).write_text("{not json")
    assert refused([str(foreign)], capsys).startswith(f"error: {foreign / run_folder.CONFIG}")
    summary = folder.summary_file.read_text()
    folder.summary_file.write_text(summary[: len(summary) // 2])  # cut short
    assert "summary.json" in refused([str(run)], capsys)
    folder.summary_file.write_text(summary)
    for part in folder.metrics_dir.glob("part-*.parquet"):
        part.unlink()
        break
    assert "but damaged" in refused([str(run)], capsys)
    assert not any("-torch-" in p.name for p in run.parent.iterdir())


def test_only_a_float32_torch_run_is_spot_checked_and_its_mlx_twin_takes_no_device(tiny_cfg, capsys):
    bf16 = finished(tiny_cfg(max_steps=10, backend="torch", device="cpu", precision="bf16"))
    assert "computed in bf16" in refused([str(bf16)], capsys)
    fp32 = finished(tiny_cfg(max_steps=10, backend="torch", device="cpu"))
    assert "is a torch run, whose twin is an MLX run" in refused([str(fp32), "device=cpu"],
                                                                 capsys)


def test_the_tolerances_are_stated_in_the_docs_as_in_the_code():
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "torch_ref.md").read_text()
                    .split())
    found = re.findall(r"the train and val loss curves and the final val loss are within (\S+), "
                       r"the grad norm within (\S+),", text)
    assert len(found) == 1
    loss, grad = map(float, found[0])
    assert spot.TOLERANCES == {"train_loss": loss, "val_loss": loss, "final_val_loss": loss,
                               "grad_norm": grad}
