"""`just gpu-check` runs to the end on the CPU (device=cpu quick=true) and writes its three files;
its time box skips what does not fit and says so; bad keys are one line."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(*words: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch_ref", "gpu-check", *words],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_gpu_check_runs_on_the_cpu_and_writes_its_files(tmp_path):
    done = gpu_check("device=cpu", "quick=true", f"out={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu-check-runs.tar.gz", "gpu-check.json", "gpu-check.txt"]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert {"machine", "config", "parity", "throughput", "sweep", "skipped", "elapsed_s",
            "archive"} <= report.keys()
    assert report["skipped"] == []

    parity = report["parity"]
    assert set(parity["runs"]) == {"cpu fp32", "cpu bf16"}
    assert all(r["status"] == "completed" for r in parity["runs"].values())
    reference = parity["runs"]["cpu fp32"]["losses"]
    assert len(reference) == parity["steps"] == 20
    bf16 = parity["deviation"]["cpu bf16"]
    assert bf16["steps_compared"] == 20 and 0 <= bf16["max"] < 0.05
    step = str(bf16["max_at_step"])
    assert bf16["max"] == pytest.approx(abs(parity["runs"]["cpu bf16"]["losses"][step]
                                            - reference[step]) / reference[step])

    rows = report["throughput"]["rows"]
    assert [(r["processes"], r["status"]) for r in rows] == [(1, "ok"), (2, "ok")]
    assert len(rows[1]["per_process"]) == 2
    assert rows[1]["tokens_per_s"] == pytest.approx(sum(rows[1]["per_process"]))
    assert rows[0]["tflops"] == pytest.approx(rows[0]["tokens_per_s"] * rows[0]["flops_per_token"]
                                              / 1e12)
    assert report["throughput"]["matmul_gflops"]["fp32"] > 0

    sweep = report["sweep"]
    assert sweep["status"] == "completed" and "backend=torch" in sweep["command"]
    assert len(sweep["runs"]) == 4  # 2 LRs x 2 arms x 1 seed
    assert {r["qk_norm"] for r in sweep["runs"]} == {"none", "rmsnorm"}
    assert all(r["status"] in ("completed", "diverged") for r in sweep["runs"])

    text = (tmp_path / "gpu-check.txt").read_text()
    for heading in ("1. Parity", "2. Throughput", "3. Sweep", "Skipped for time: nothing"):
        assert heading in text
    assert text.strip() in done.stdout
    with tarfile.open(tmp_path / "gpu-check-runs.tar.gz") as tar:
        names = tar.getnames()
    assert "sweep.log" in names
    assert sum(n.startswith("runs/demo/") and n.endswith("/summary.json") for n in names) == 4
    assert any(n.startswith("parity-runs/parity/") for n in names)
    assert not [n for n in names if n.endswith(".safetensors")]


def test_what_the_budget_does_not_reach_is_skipped_and_said(tmp_path):
    done = gpu_check("device=cpu", "quick=true", "budget=1", f"out={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert any("parity" in s and "skipped for time" in s for s in report["skipped"])
    assert report["sweep"]["status"] == "skipped for time"
    assert {r["status"] for r in report["throughput"]["rows"]} == {"skipped for time"}
    assert "Skipped for time: parity" in (tmp_path / "gpu-check.txt").read_text()


@pytest.mark.parametrize("words, message", [
    (["device=tpu"], "device must be one of cuda, cpu, mps"),
    (["budget=0"], "budget must be a number of seconds > 0"),
    (["parallel=0"], "parallel must be >= 1"),
    (["colour=red"], "unknown key 'colour'"),
])
def test_bad_keys_are_one_line(words, message, tmp_path, capsys):
    from torch_ref.__main__ import main

    assert main(["gpu-check", *words, f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_an_absent_gpu_is_one_line(tmp_path, capsys):
    import torch

    from torch_ref.__main__ import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["gpu-check", "device=cuda", f"out={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: device cuda is not available to this torch build ({torch.__version__}); use "
        "device=auto or device=cpu"]
    assert not (tmp_path / "out").exists()
