"""`just gpu-check` runs to the end on the CPU (device=cpu quick=true) and writes its three files;
its time box skips what does not fit and says so; it exits 0 only when every check passed (a
failing stage injected here makes it exit 1); bad keys are one line."""

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
    return subprocess.run([sys.executable, "-m", "crosscheck", "gpu-check", *words],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_gpu_check_runs_on_the_cpu_and_writes_its_files(tmp_path):
    done = gpu_check("device=cpu", "quick=true", f"out={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu-check-runs.tar.gz", "gpu-check.json", "gpu-check.txt"]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert {"machine", "config", "parity", "throughput", "sweep", "skipped", "elapsed_s",
            "archive", "summary", "passed"} <= report.keys()
    assert report["skipped"] == [] and report["passed"] is True
    assert [r["check"] for r in report["summary"]] == [
        "parity cpu fp32", "parity cpu bf16", "parity cpu fp32 repeat",
        "throughput tiny fp32 eager x1", "throughput tiny fp32 eager x2", "sweep jobs=2"]
    assert all(r["ok"] is True for r in report["summary"])

    parity = report["parity"]
    assert set(parity["runs"]) == {"cpu fp32", "cpu bf16", "cpu fp32 repeat"}
    assert parity["runs"]["cpu fp32 repeat"]["final_weights_sha256"] == \
        parity["runs"]["cpu fp32"]["final_weights_sha256"]
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
    assert rows[1]["overlap"] > 0.5  # the two processes timed one window
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
    for heading in ("1. Parity", "2. Throughput", "3. Sweep", "Skipped for time: nothing",
                    "| check | result | figure |", "PASS: every check passed"):
        assert heading in text
    assert text.strip() in done.stdout
    with tarfile.open(tmp_path / "gpu-check-runs.tar.gz") as tar:
        names = tar.getnames()
    assert "sweep.log" in names
    assert sum(n.startswith("runs/demo/") and n.endswith("/summary.json") for n in names) == 4
    assert any(n.startswith("parity-runs/parity/") for n in names)
    assert not [n for n in names if n.endswith(".safetensors")]


def test_what_the_budget_does_not_reach_is_skipped_said_and_not_a_pass(tmp_path):
    done = gpu_check("device=cpu", "quick=true", "budget=1", f"out={tmp_path}")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert any("parity" in s and "skipped for time" in s for s in report["skipped"])
    assert report["sweep"]["status"] == "skipped for time"
    assert {r["status"] for r in report["throughput"]["rows"]} == {"skipped for time"}
    assert {r["ok"] for r in report["summary"]} == {None} and report["passed"] is False
    text = (tmp_path / "gpu-check.txt").read_text()
    assert "Skipped for time: parity" in text
    assert "FAIL: 6 of 6 checks did not pass" in text


PARITY_OK = {"reference": "cpu fp32", "steps": 2,
             "planned": ["cpu fp32", "cpu bf16", "cpu fp32 repeat"],
             "runs": {"cpu fp32": {"returncode": 0, "status": "completed",
                                   "losses": {"1": 5.0, "2": 4.0}, "final_weights_sha256": "a"},
                      "cpu bf16": {"returncode": 0, "status": "completed",
                                   "losses": {"1": 5.01, "2": 4.02}, "final_weights_sha256": "b"},
                      "cpu fp32 repeat": {"returncode": 0, "status": "completed",
                                          "losses": {"1": 5.0, "2": 4.0},
                                          "final_weights_sha256": "a"}},
             "deviation": {"cpu bf16": {"per_step": {"1": 0.002, "2": 0.005}, "max": 0.005,
                                        "max_at_step": 2, "steps_compared": 2,
                                        "limit": 0.25}}}
SWEEP_OK = {"command": "python -m qkstudy sweep jobs=2", "status": "completed", "jobs": 2,
            "planned_runs": 4, "returncode": 0,
            "runs": [{"run_id": f"r{i}", "qk_norm": "none", "lr": 0.1, "seed": 0,
                      "status": "completed", "final_val_loss": 3.0, "final_train_loss": 3.0,
                      "steps": 20, "tokens_per_second": 1000.0} for i in range(4)]}


def test_a_failing_stage_makes_the_check_fail(tmp_path, monkeypatch, capsys):
    """One measurement fails (its process exits 1): the summary says which and the exit status
    is 1, the other stages passing (stand-ins here, to keep this test fast)."""
    from qkstudy.bench.step import StepFailed
    from crosscheck import gpu_check, gpu_stages

    def fail(*args, **kwargs):
        raise StepFailed("exit status 1: RuntimeError: injected")

    monkeypatch.setattr(gpu_stages, "measure_together", fail)
    monkeypatch.setattr(gpu_check, "parity", lambda *a: json.loads(json.dumps(PARITY_OK)))
    monkeypatch.setattr(gpu_check, "sweep", lambda *a: json.loads(json.dumps(SWEEP_OK)))
    assert gpu_check.cli(["device=cpu", "quick=true", f"out={tmp_path}"]) == 1
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [(r["check"], r["ok"]) for r in report["summary"]] == [
        ("parity cpu fp32", True), ("parity cpu bf16", True), ("parity cpu fp32 repeat", True),
        ("throughput tiny fp32 eager x1", False), ("throughput tiny fp32 eager x2", False),
        ("sweep jobs=2", True)]
    assert ("| throughput tiny fp32 eager x1 | FAILED | failed: exit status 1: RuntimeError: "
            "injected |") in capsys.readouterr().out


@pytest.mark.parametrize("change, failed", [
    (lambda r: r["parity"]["deviation"]["cpu bf16"].update(max=0.3), "parity cpu bf16"),
    (lambda r: r["parity"]["runs"]["cpu bf16"].update(returncode=1, status="failed",
                                                      error="RuntimeError: boom"),
     "parity cpu bf16"),
    (lambda r: r["parity"]["deviation"]["cpu bf16"].update(steps_compared=1), "parity cpu bf16"),
    (lambda r: r["parity"]["runs"].pop("cpu bf16"), "parity cpu bf16"),
    (lambda r: r["parity"]["runs"]["cpu fp32 repeat"].update(final_weights_sha256="c"),
     "parity cpu fp32 repeat"),
    (lambda r: r["sweep"]["runs"][0].update(status="failed"), "sweep jobs=2"),
    (lambda r: r["sweep"].update(status="failed (exit status 1; sweep.log)"), "sweep jobs=2"),
    (lambda r: r.update(sweep={"error": "OSError: disk full"}), "sweep"),
])
def test_every_kind_of_failure_is_a_failed_row(change, failed):
    from crosscheck.gpu_check import summary

    report = json.loads(json.dumps({"parity": PARITY_OK, "sweep": SWEEP_OK,
                                    "throughput": {"rows": []}}))
    assert all(r["ok"] for r in summary(report))
    change(report)
    assert [r["check"] for r in summary(report) if r["ok"] is not True] == [failed]


@pytest.mark.parametrize("words, message", [
    (["device=tpu"], "device must be one of cuda, cpu, mps"),
    (["budget=0"], "budget must be a number of seconds > 0"),
    (["parallel=0"], "parallel must be >= 1"),
    (["colour=red"], "unknown key 'colour'"),
])
def test_bad_keys_are_one_line(words, message, tmp_path, capsys):
    from crosscheck.__main__ import main

    assert main(["gpu-check", *words, f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_an_absent_gpu_is_one_line(tmp_path, capsys):
    import torch

    from crosscheck.__main__ import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["gpu-check", "device=cuda", f"out={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: device cuda is not available to this torch build ({torch.__version__}); use "
        "device=auto or device=cpu"]
    assert not (tmp_path / "out").exists()
