"""A sweep copied home from another machine: each machine's log, processes and calibrated speeds
carry its host name, so a GPU's sweep folder copied over the laptop's lands beside it, and
`status` on the laptop counts the time left at the laptop's speed."""

from __future__ import annotations

import shutil

import pytest

from qkstudy import provenance, status, trainer
from qkstudy.__main__ import main
from qkstudy.run_folder import SweepFolder, run_folders
from qkstudy.sweep import plan
from tests.tiny_sweeps import tiny_words

STEPS, TOKENS_PER_STEP = 20, 4 * 32  # tiny_words' runs
LAPTOP, GPU = 1_000.0, 50_000.0  # each machine's calibrated tokens/s


def as_machine(monkeypatch, host: str, speed: float) -> None:
    monkeypatch.setattr(provenance, "host", lambda: host)
    monkeypatch.setattr(plan, "step_speed", lambda cfg, vocab, **k: (speed, 3))


def sweep(words: list[str], monkeypatch, train_first: int) -> int:
    """The sweep command, Ctrl-C'd (exit 130) when it starts run number `train_first` + 1."""
    real, calls = trainer.train, []

    def train(cfg, **kwargs):
        calls.append(cfg.run_id)
        if len(calls) > train_first:
            raise KeyboardInterrupt
        return real(cfg, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(trainer, "train", train)
        return main(["sweep", *words, "--no-notify"])


@pytest.fixture
def merged(monkeypatch, tiny_data, tmp_path):
    """The laptop's MLX sweep, Ctrl-C'd before its first run, with the GPU's torch sweep of the
    same plan (its first run finished, then Ctrl-C'd) copied over it as `cp -R` does."""
    as_machine(monkeypatch, "gpu-box", GPU)
    gpu = tmp_path / "gpu" / "runs"
    assert sweep(tiny_words(tiny_data, gpu, "lrs=1e-3,1e-2", "backend=torch", "device=cpu"),
                 monkeypatch, train_first=1) == 130
    as_machine(monkeypatch, "laptop", LAPTOP)
    laptop = tmp_path / "laptop" / "runs"
    assert sweep(tiny_words(tiny_data, laptop, "lrs=1e-3,1e-2", "backend=mlx"), monkeypatch,
                 train_first=0) == 130
    before = {p.name: p.read_bytes() for p in (laptop / "t").iterdir() if p.is_file()}
    shutil.copytree(gpu / "t", laptop / "t", dirs_exist_ok=True)
    return laptop / "t", before


def test_a_sweep_copied_home_keeps_both_machines_records(merged):
    sweep_dir, before = merged
    laptop, gpu = SweepFolder(sweep_dir), SweepFolder(sweep_dir, "gpu-box")
    assert laptop.machine == "laptop" and laptop.log_file.name in before
    for name, content in before.items():  # nothing of the laptop's was replaced
        if name != laptop.plan_file.name:  # the plan: the same plan, written by both
            assert (sweep_dir / name).read_bytes() == content, name
    assert laptop.read_plan()["grid_lrs"] == [1e-3, 1e-2]
    assert laptop.read_speeds() == {1: LAPTOP} and gpu.read_speeds() == {1: GPU}
    assert "  backend     mlx" in laptop.log_file.read_text()  # each machine's own plan lines
    assert "  backend     torch" in gpu.log_file.read_text()
    assert laptop.processes_file != gpu.processes_file
    assert laptop.worker_log(1) != gpu.worker_log(1)
    finished = [f for f in run_folders(sweep_dir) if f.summary_file.exists()]
    assert len(finished) == 1 and "-torch-" in finished[0].name
    assert (finished[0].read_manifest() or {})["host"] == "gpu-box"


def test_status_counts_the_time_left_at_this_machines_speed(merged):
    sweep_dir, _ = merged
    text = status.render(sweep_dir)
    # the GPU's torch run at lr 1e-3 is done; lr 1e-2 is left (one run of 20 steps)
    assert "2 runs: 1 completed, 0 diverged, 0 failed, 0 running, 0 interrupted, 1 waiting" in text
    seconds = STEPS * TOKENS_PER_STEP / LAPTOP
    assert (f"time left: ~{status.format_seconds(seconds)} for 1 of the 1 runs left in one "
            "process here, on laptop (training only; tok/s calibrated here at the sweep's start "
            "(depth 1))") in text
    # without a calibration of its own, a machine says whose runs set the pace
    SweepFolder(sweep_dir).speeds_file.unlink()
    assert "tok/s measured by runs finished on gpu-box (depth 1)" in status.render(sweep_dir)


def test_a_run_finished_here_sets_the_pace_before_the_calibration(merged, monkeypatch):
    sweep_dir, _ = merged
    gpu_run = next(f for f in run_folders(sweep_dir) if f.summary_file.exists())
    seconds = STEPS * TOKENS_PER_STEP / gpu_run.summary_record()["tokens_per_second"]
    expected = (f"time left: ~{status.format_seconds(seconds)} for 1 of the 1 runs left in one "
                "process here, on {} (training only; tok/s measured by its runs finished here "
                "(depth 1))")
    as_machine(monkeypatch, "gpu-box", GPU)  # status on the GPU machine: the run is its own
    assert expected.format("gpu-box") in status.render(sweep_dir)
    # a manifest written before the host was recorded: this machine's when chip and cores match
    # (both "machines" here are this one)
    as_machine(monkeypatch, "laptop", LAPTOP)
    manifest = gpu_run.read_manifest()
    del manifest["host"]
    gpu_run.write_manifest(manifest)
    assert provenance.trained_on(manifest) is None
    assert expected.format("laptop") in status.render(sweep_dir)
    elsewhere = {**manifest, "cpu_count": 512}
    assert provenance.trained_on(elsewhere) == f"a 512-core {manifest['chip']}"
