"""Where a result came from: the code's git commit, library versions, the machine, the data."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .files import now, sha256_file


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def chip() -> str:
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                  capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(*modules: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in modules:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance() -> dict:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"),
            "git_dirty": bool(status) if status is not None else None,
            "versions": versions("mlx", "numpy", "tiktoken", "pyarrow", "torch")}


def manifest(data_dir: str, framework: str, device: str, extra: dict) -> dict:
    meta = Path(data_dir) / "meta.json"
    return {"framework": framework, "device": device, **provenance(),
            "platform": platform.platform(), "machine": platform.machine(), "chip": chip(),
            "cpu_count": os.cpu_count(), "data_dir": str(data_dir),
            "data_meta_sha256": sha256_file(meta) if meta.exists() else None, "started": now(),
            **extra}
