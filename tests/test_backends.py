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
