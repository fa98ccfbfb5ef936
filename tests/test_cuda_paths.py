"""The CUDA branches of backend=torch on a machine without a GPU (tests/cuda_double.py): the
device and memory share of each of K processes on N GPUs, the GPU memory refusal, a whole
training step on the fake GPU with no host synchronisation, Slurm's GPU request, torch.compile's
graph limit and determinism."""

from __future__ import annotations

import dataclasses
import logging
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from qkstudy import backends, trainer  # noqa: E402
from qkstudy.config import TrainConfig  # noqa: E402
from qkstudy.errors import UsageError  # noqa: E402
from qkstudy.run_folder import RunFolder  # noqa: E402
from tests.cuda_double import GB, FakeCuda  # noqa: E402


@pytest.fixture
def jobs(monkeypatch):
    """jobs(K, i): this process is sweep process i of K (the environment a sweep gives it)."""

    def set_(k: int, slot: int = 0) -> None:
        monkeypatch.setenv(backends.RUNS_PER_DEVICE, str(k))
        monkeypatch.setenv(backends.DEVICE_SLOT, str(slot))

    monkeypatch.delenv(backends.RUNS_PER_DEVICE, raising=False)
    monkeypatch.delenv(backends.DEVICE_SLOT, raising=False)
    return set_


def test_the_double_keeps_torchs_rule_for_a_device_without_an_index(monkeypatch):
    fake = FakeCuda(monkeypatch)
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_per_process_memory_fraction(0.5, 1)
    torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda", 0))
    assert fake.fractions == {0: 0.5}


@pytest.mark.parametrize("k, n, expected", [
    (1, 1, [(0, None)]),
    (2, 1, [(0, 0.5), (0, 0.5)]),
    (4, 2, [(0, 0.5), (1, 0.5), (0, 0.5), (1, 0.5)]),
    (3, 2, [(0, 0.5), (1, None), (0, 0.5)]),
    (2, 4, [(0, None), (1, None)]),
])
def test_k_processes_on_n_gpus_take_gpu_i_mod_n_and_their_share(monkeypatch, jobs, k, n,
                                                                  expected):
    from torch_ref.device import place

    placed = []
    for slot in range(k):
        fake = FakeCuda(monkeypatch, devices=n)
        jobs(k, slot)
        device = place("cuda")
        assert device == torch.device("cuda", fake.current)  # made current, with its index
        placed.append((device.index, fake.fractions.get(device.index)))
        assert set(fake.fractions) <= {device.index}
    assert placed == expected


def test_a_sweep_gives_each_of_its_processes_its_slot():
    from qkstudy.sweep.config import SweepConfig
    from qkstudy.sweep.run import gpu_share

    sweep = dataclasses.replace(SweepConfig(), jobs=3)
    envs = [gpu_share(sweep, i) for i in range(1, 3)]
    assert [(e[backends.RUNS_PER_DEVICE], e[backends.DEVICE_SLOT]) for e in envs] == [
        ("3", "1"), ("3", "2")]


def test_a_cuda_run_too_big_for_its_share_of_the_gpu_is_refused_in_one_line(
        monkeypatch, jobs, tiny_cfg):
    from torch_ref.device import memory_limit

    cfg = tiny_cfg(backend="torch", device="cuda", batch_size=64, block_size=256)
    FakeCuda(monkeypatch, total=int(1.5 * GB), free=int(1.4 * GB))
    size, words = memory_limit(cfg)
    assert size == int(1.4 * GB)  # what is free, below the whole GPU
    assert words == "cuda:0 (NVIDIA H200) has 1.4 GB free of 1.5 GB: 1.4 GB for this run"
    trainer.load_data(cfg)  # fits alone (~0.8 GB)

    jobs(2, 0)  # two runs on the GPU: half of it each
    assert memory_limit(cfg)[0] == int(0.75 * GB)
    with pytest.raises(UsageError) as refused:
        trainer.train(cfg, verbose=False)
    message = str(refused.value)
    assert message == ("block_size 256 needs about 798 MB per training step (369 MB of it for "
                       "the attention scores); cuda:0 (NVIDIA H200) has 1.4 GB free of 1.5 GB, "
                       "1/2 of it for each of the 2 runs sharing it: 750 MB for this run: lower "
                       "block_size or batch_size")
    assert not RunFolder.of(cfg).path.exists()  # refused before anything is written


def test_a_cuda_sweep_too_big_for_its_share_of_the_gpu_is_refused_before_it_plans(
        monkeypatch, jobs, tiny_data, tmp_path, capsys):
    """jobs=3 on 2 GPUs: GPU 0 takes two of the runs, so each gets half of it; the refusal is
    the plan's, one line, before anything is written."""
    from qkstudy.__main__ import main
    from qkstudy.sweep.config import parse_sweep_config
    from qkstudy.sweep.plan import plan_memory

    FakeCuda(monkeypatch, devices=2, total=int(1.5 * GB))
    words = [f"data={tiny_data}", f"runs_dir={tmp_path / 'runs'}", "name=g", "depth=2",
             "d_model=32", "n_heads=2", "block_size=256", "batch_size=64", "backend=torch",
             "device=cuda", "lrs=0.01", "seeds=0", "--dry-run"]
    alone = parse_sweep_config([w for w in words if "=" in w] + ["jobs=2"])
    assert plan_memory(alone, 257)[2] == pytest.approx(798e6, rel=0.01)  # one run a GPU: fits
    assert main(["sweep", *words, "jobs=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: sweep g, depth 2: block_size 256 needs")
    assert err[0].endswith("cuda:0 (NVIDIA H200) has 1.5 GB free of 1.5 GB, 1/2 of it for each "
                           "of the 2 runs sharing it: 750 MB for this run: lower block_size or "
                           "batch_size")
    assert not (tmp_path / "runs").exists()


def test_memory_an_earlier_run_of_the_process_holds_counts_as_its_own(monkeypatch, jobs,
                                                                      tiny_cfg):
    from torch_ref.device import memory_limit

    fake = FakeCuda(monkeypatch, devices=2, total=80 * GB, free=10 * GB)
    fake.reserved[1] = 30 * GB
    jobs(2, 1)
    assert memory_limit(tiny_cfg(backend="torch", device="cuda"))[0] == 40 * GB
    assert memory_limit(tiny_cfg(backend="torch", device="cpu")) is None


class HostReads:
    """Counts the calls that make the host wait for the device (a tensor's value read on the
    host) made by the project's own code, not torch's internals."""

    METHODS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name,
                                                                   getattr(torch.Tensor, name)))

    def _counted(self, name, real):
        def method(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if "/torch/" not in caller and "site-packages" not in caller:
                self.calls.append(f"{name} from {caller}")
            return real(tensor, *args, **kwargs)
        return method


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_step_never_waits_for_the_device_and_the_fake_gpu_computes_the_cpus_numbers(
        monkeypatch, jobs, tiny_cfg, device):
    from torch_ref.engine import Engine

    cfg = tiny_cfg(backend="torch", device="cpu", z_loss=1e-4, grad_clip=0.5)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 257, (4, 32)), rng.integers(0, 257, (4, 32))) for _ in range(6)]
    probe = batches[0]
    reference = Engine(cfg, 257, [probe], probe)
    expected = reference.read([reference.step(x, y) for x, y in batches])

    fake = FakeCuda(monkeypatch, tensors=True) if device == "cuda" else None
    jobs(2, 0)
    engine = Engine(dataclasses.replace(cfg, device=device), 257, [probe], probe)
    if fake:
        assert engine.device == "cuda:0 (NVIDIA H200)" and fake.fractions == {0: 0.5}
        assert fake.deterministic == [True]
        fake.copies.clear()
    reads = HostReads(monkeypatch)
    pending = [engine.step(x, y) for x, y in batches]
    assert reads.calls == []  # no step read anything back
    if fake:  # x and y each step, from pinned memory, the host not waiting
        assert len(fake.copies) == 2 * len(batches)
        assert all(c.pinned and c.non_blocking for c in fake.copies)
    got = engine.read(pending)  # the log step: one copy back for all of them, then a list
    assert [call.split()[0] for call in reads.calls] == ["cpu", "tolist"]
    assert got == expected  # bit for bit: loss, grad norm, lr, z-loss term
    assert [round(lr, 9) for _, _, lr, _ in got] == [round(float(np.float32(
        reference.schedule.rate(s))), 9) for s in range(6)]


def test_with_the_sync_check_every_step_after_the_first_runs_in_torchs_error_mode(
        monkeypatch, tiny_cfg):
    from torch_ref.engine import SYNC_CHECK, Engine

    fake = FakeCuda(monkeypatch, tensors=True)
    probe = (np.zeros((4, 32), np.int64),) * 2
    monkeypatch.setenv(SYNC_CHECK, "1")
    engine = Engine(tiny_cfg(backend="torch", device="cuda"), 257, [], probe)
    engine.read([engine.step(*probe) for _ in range(3)])
    assert fake.sync_modes == ["error", "default"] * 2
    monkeypatch.delenv(SYNC_CHECK)
    unchecked = Engine(tiny_cfg(backend="torch", device="cuda"), 257, [], probe)
    unchecked.step(*probe), unchecked.step(*probe)
    assert fake.sync_modes == ["error", "default"] * 2


def test_slurm_requests_a_gpu_for_cuda_runs_and_warns_when_the_device_disagrees(capsys):
    from qkstudy.sweep.slurm import SlurmOptions

    default = SlurmOptions()
    cuda, warning = default.for_device("cuda")
    assert "--gres=gpu:1" in cuda.sbatch_lines() and warning is None
    for device in ("cpu", "mps"):
        options, warning = default.for_device(device)
        assert not any(o.startswith("--gres") for o in options.sbatch_lines())
        assert warning is None
    auto, warning = default.for_device("auto")
    assert not any(o.startswith("--gres") for o in auto.sbatch_lines())
    assert "device=auto requests no GPU" in warning
    two, warning = SlurmOptions(gpus=2).for_device("auto")
    assert "--gres=gpu:2" in two.sbatch_lines() and warning is None
    _, warning = SlurmOptions(gpus=0).for_device("cuda")
    assert "device=cuda with slurm_gpus=0" in warning
    _, warning = SlurmOptions(gpus=1).for_device("cpu")
    assert "requested, not used" in warning
    mlx, warning = default.for_device("auto", backend="mlx")  # MLX has no device key
    assert warning is None and not any(o.startswith("--gres") for o in mlx.sbatch_lines())


@pytest.mark.parametrize("device, gres, warned", [
    ("cuda", "#SBATCH --gres=gpu:1", False), ("auto", None, True), ("cpu", None, False)])
def test_a_slurm_array_of_torch_runs_asks_for_the_gpu_its_device_needs(
        tiny_data, tmp_path, capsys, device, gres, warned):
    from qkstudy.__main__ import main

    words = [f"data={tiny_data}", f"runs_dir={tmp_path / 'runs'}", "name=s", "depth=1",
             "d_model=32", "n_heads=2", "block_size=32", "batch_size=4", "max_steps=10",
             "lrs=0.01", "seeds=0", "backend=torch", f"device={device}", "--slurm"]
    assert main(["sweep", *words]) == 0
    script = (tmp_path / "runs" / "s" / "slurm" / "001" / "array.sbatch").read_text()
    assert [line for line in script.splitlines() if "--gres" in line] == ([gres] if gres else [])
    assert ("warning: device=auto requests no GPU" in capsys.readouterr().err) == warned


def test_compile_keeps_a_process_compiled_across_its_shapes_and_says_when_it_falls_back(
        monkeypatch, capsys):
    """The raised limit is set, and past it the process says so in one line: checked with
    dynamo's tracing alone (backend="eager"), no kernels compiled."""
    from qkstudy.config import model_args
    from torch_ref import engine
    from torch_ref.model import GPT

    config = torch._dynamo.config
    engine.configure()
    assert config.recompile_limit >= engine.GRAPHS == 64
    assert config.accumulated_recompile_limit >= 4 * engine.GRAPHS

    torch._dynamo.reset()
    monkeypatch.setattr(config, "recompile_limit", 2)
    step = torch.compile(engine.objective, backend="eager")
    x = torch.zeros((1, 8), dtype=torch.long)
    for depth in (1, 1, 2, 3, 4):  # depth 1 twice: one graph; then 2 and 3 more
        model = GPT(model_args(TrainConfig(depth=depth, d_model=16, n_heads=2, block_size=8),
                               65))
        step(model, x, x, False)[0].backward()
    err = capsys.readouterr().err
    assert err.count("torch.compile: a process of this sweep met more than 2 shapes") == 1
    torch._dynamo.reset()


def test_the_fallback_notice_lets_other_log_records_through(capsys):
    from torch_ref.engine import FallbackNotice

    other = logging.LogRecord("torch._dynamo", logging.WARNING, "", 0, "something else", (),
                              None)
    assert FallbackNotice().filter(other) is True
    assert capsys.readouterr().err == ""


def test_determinism_is_on_by_default_and_sets_cublas_before_cuda(monkeypatch, tiny_cfg):
    import os

    from torch_ref.engine import Engine

    from torch_ref.engine import preflight

    cfg = tiny_cfg(backend="torch", device="cuda")
    assert cfg.deterministic is True
    fake = FakeCuda(monkeypatch, tensors=True)
    preflight(cfg)  # before the trainer's memory check, the first CUDA call
    assert fake.deterministic == [True]
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    probe = (np.zeros((4, 32), np.int64),) * 2
    Engine(cfg, 257, [], probe)
    assert fake.deterministic == [True, True]
    Engine(dataclasses.replace(cfg, deterministic=False), 257, [], probe)
    assert fake.deterministic == [True, True, False]
    with pytest.raises(UsageError, match="options of backend=torch"):
        TrainConfig(deterministic=False).validate()
