"""`./setup.sh torch` on a machine whose Python already has PyTorch (a GPU node's image): it uses
that torch, installs nothing that is there, and needs no network (the package index is made
unreachable). The machine's Python is a venv here, with a stand-in `torch` and stand-in
distributions of the core's packages this test machine lacks, so the run takes seconds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_TORCH = '''
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def is_available():
        return False
'''


def machine_python(tmp_path: Path) -> Path:
    """A Python with torch importable and every core requirement present, as a venv."""
    base = sys._base_executable if hasattr(sys, "_base_executable") else sys.executable
    system = tmp_path / "system"
    made = subprocess.run([base, "-m", "venv", "--without-pip", "--system-site-packages",
                           str(system)], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"python -m venv is not available here: {made.stderr.strip()[-200:]}")
    python = system / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    for name in ("numpy", "pyarrow", "scipy", "tiktoken", "huggingface_hub", "safetensors",
                 "torch"):
        dist = site / f"{name}-99.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 99.0\n")
    return python


def offline_env(python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL"))}
    return {**env, "PYTHON": str(python), "PIP_INDEX_URL": "http://127.0.0.1:9/",
            "PIP_NO_INDEX": "1", "PIP_RETRIES": "0", "PIP_TIMEOUT": "1",
            "HTTP_PROXY": "http://127.0.0.1:9/", "HTTPS_PROXY": "http://127.0.0.1:9/"}


def setup_torch(tmp_path: Path, python: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`./setup.sh torch` in a copy of the checkout's set-up files, offline, with `python` as
    the machine's Python."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("setup.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, checkout / name)
    return checkout, subprocess.run(["bash", str(checkout / "setup.sh"), "torch"],
                                    capture_output=True, text=True, cwd=checkout,
                                    env=offline_env(python), timeout=120)


def test_setup_torch_uses_the_machines_torch_offline_and_installs_nothing(tmp_path):
    python = machine_python(tmp_path)
    checkout, done = setup_torch(tmp_path, python)
    log = (checkout / ".setup.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + log
    out = done.stdout
    assert "found torch 2.11.0+cu130 (CUDA 13.0) in " in out
    assert "nothing to install" in out
    assert "pip install" not in log and "Collecting" not in log
    assert "torch 2.11.0+cu130, CUDA 13.0, GPU: none visible" in out
    venv = checkout / ".venv" / "bin" / "python"
    seen = subprocess.run([str(venv), "-c", "import sys, torch; print(torch.__file__); "
                           "print(str(sys.path[1:]))"], capture_output=True, text=True,
                          env=offline_env(python), cwd=tmp_path, timeout=60)
    assert seen.returncode == 0, seen.stderr
    torch_file, path = seen.stdout.splitlines()
    assert torch_file.startswith(str(tmp_path / "system"))  # the machine's, not a copy
    assert repr(str(checkout)) in path  # the project, linked in without a build


def test_setup_torch_installs_only_what_is_missing(tmp_path):
    """With a requirement absent, setup.sh asks pip for that one alone (which fails here, with
    the index unreachable, and says so)."""
    python = machine_python(tmp_path)
    shutil.rmtree(next((tmp_path / "system").glob("lib/python*/site-packages/tiktoken-*")))
    if subprocess.run([str(python), "-c", "import importlib.metadata as m; m.version('tiktoken')"],
                      capture_output=True).returncode == 0:
        pytest.skip("tiktoken is installed in this machine's base Python")
    _, done = setup_torch(tmp_path, python)
    assert done.returncode == 1
    # a dot every 5 s while pip works (a busy machine prints some)
    assert re.search(r"installing what is missing \(tiktoken>=0\.7\) \.* FAILED", done.stdout)
