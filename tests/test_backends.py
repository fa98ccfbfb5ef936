"""The engine seam (qkstudy/backends.py): every backend is found there and nowhere else, each
provides the declared contract, and a preflight refuses a run before its folder exists."""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

from qkstudy import backends
from qkstudy.errors import UsageError
from qkstudy.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
ENGINE_MODULE = re.compile(r"(mlx_gpt|torch_ref)\.\w+")


def test_the_core_names_an_engine_module_only_in_the_seam():
    named = []
    for path in sorted((ROOT / "qkstudy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    ENGINE_MODULE.fullmatch(node.value):
                named.append(f"{path.relative_to(ROOT)}: {node.value}")
    assert named == ["qkstudy/backends.py: mlx_gpt.backend", "qkstudy/backends.py: torch_ref.backend"]


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_each_backend_provides_the_contract(name):
    pytest.importorskip({"mlx": "mlx.core", "torch": "torch"}[name])
    backend = backends.load(name)
    methods = [m for m, v in vars(backends.Backend).items()
               if inspect.isfunction(v) and not m.startswith("_")]
    assert set(backends.CONTRACT) == {"Engine", *methods}  # the check covers the whole protocol
    for member in backends.CONTRACT:
        provided = getattr(backend, member)
        if member == "Engine":
            assert inspect.isclass(provided)
            # the methods the trainer calls on an Engine, all present
            wanted = {m for m, v in vars(backends.Engine).items()
                      if inspect.isfunction(v) and not m.startswith("_")}
            assert wanted <= set(dir(provided)), wanted - set(dir(provided))
            continue
        # the parameters the core passes, in the declared order (extra ones need defaults)
        declared = getattr(backends.Backend, member)
        want = list(inspect.signature(declared).parameters)[1:]  # without self
        have = inspect.signature(provided).parameters
        assert list(have)[:len(want)] == want, (member, list(have))
        assert all(p.default is not p.empty for p in list(have.values())[len(want):]), member


def test_a_backend_missing_part_of_the_contract_is_refused(monkeypatch):
    partial = types.ModuleType("partial_backend")
    partial.Engine = object
    monkeypatch.setitem(sys.modules, "partial_backend", partial)
    monkeypatch.setitem(backends.BACKENDS, "partial", ("partial_backend", "install it"))
    with pytest.raises(TypeError, match="partial_backend does not provide preflight, device"):
        backends.load("partial")


def test_mlx_without_a_compiler_is_refused_before_the_run_folder(tiny_cfg, monkeypatch):
    pytest.importorskip("mlx.core")
    from mlx_gpt import backend as mlx_backend
    from qkstudy.trainer import train

    cfg = tiny_cfg()
    if mlx_backend.device(cfg) != "cpu" or not sys.platform.startswith("linux"):
        pytest.skip("MLX compiles its kernels with g++ on Linux's CPU backend only")
    monkeypatch.setattr(mlx_backend.shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(UsageError, match="g\\+\\+, which is not on PATH"):
        train(cfg, verbose=False)
    assert not RunFolder.of(cfg).path.exists()


# --- backend=auto: what a run gets when it names no engine --------------------------------------

def auto_on(monkeypatch, system: str, machine: str, installed: set[str]) -> tuple[str, str]:
    from qkstudy import config
    monkeypatch.delenv(config.AUTO_BACKEND_ENV, raising=False)
    monkeypatch.setattr(config.sys, "platform", system)
    monkeypatch.setattr(config.platform, "machine", lambda: machine)
    monkeypatch.setattr(config.importlib.util, "find_spec",
                        lambda name: object() if name in installed else None)
    return config.auto_backend()


@pytest.mark.parametrize("system, machine, installed, expected", [
    ("darwin", "arm64", {"mlx", "torch"}, "mlx"),  # Apple Silicon: MLX on its GPU
    ("linux", "x86_64", {"mlx", "torch"}, "torch"),  # CUDA or the CPU, where torch is faster
    ("linux", "aarch64", {"mlx", "torch"}, "torch"),
    ("darwin", "x86_64", {"mlx", "torch"}, "torch"),  # an Intel Mac has no Metal MLX
    ("linux", "x86_64", {"mlx"}, "mlx"),  # the only engine installed
    ("darwin", "arm64", {"torch"}, "torch"),
])
def test_auto_picks_mlx_on_apple_silicon_and_torch_elsewhere(monkeypatch, system, machine,
                                                             installed, expected):
    backend, why = auto_on(monkeypatch, system, machine, installed)
    assert backend == expected and why


def test_auto_resolves_before_the_run_id_so_named_runs_keep_theirs(monkeypatch):
    from qkstudy.config import TrainConfig
    auto_on(monkeypatch, "linux", "x86_64", {"mlx", "torch"})
    chosen = TrainConfig()
    assert chosen.backend == "torch"
    assert chosen.run_id == TrainConfig(backend="torch").run_id
    mlx = TrainConfig(backend="mlx")
    assert "backend" not in mlx.identity() and "-torch" not in mlx.run_id  # as before auto


def test_a_torch_option_makes_auto_pick_torch_even_on_apple_silicon(monkeypatch):
    from qkstudy.config import TrainConfig
    auto_on(monkeypatch, "darwin", "arm64", {"mlx", "torch"})
    assert TrainConfig().backend == "mlx"
    assert TrainConfig(device="cuda").backend == "torch"


def test_the_override_is_checked(monkeypatch):
    from qkstudy.config import auto_backend
    monkeypatch.setenv("QKSTUDY_BACKEND", "jax")
    with pytest.raises(UsageError, match="QKSTUDY_BACKEND='jax' is not one of mlx, torch"):
        auto_backend()


def test_the_plan_says_which_engine_auto_chose_and_why(tmp_path):
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "QKSTUDY_BACKEND"}
    out = subprocess.run([sys.executable, "-m", "qkstudy", "sweep", "preset=demo", "--dry-run",
                          f"runs_dir={tmp_path}", "data=" + str(tmp_path / "synthetic-bytes")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("backend"))
    expected = "mlx" if sys.platform == "darwin" and os.uname().machine == "arm64" else "torch"
    assert line.split()[1] == expected and "backend=auto:" in line, out.stdout + out.stderr
    named = subprocess.run([sys.executable, "-m", "qkstudy", "sweep", "preset=demo", "--dry-run",
                            "backend=mlx", f"runs_dir={tmp_path}",
                            "data=" + str(tmp_path / "synthetic-bytes")],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    line = next(x for x in named.stdout.splitlines() if x.strip().startswith("backend"))
    assert line.split()[1] == "mlx" and "auto" not in line
