"""Where a result came from: the code's git commit, library versions, the machine, the data."""

from __future__ import annotations

import functools
import os
import platform
import re
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


@functools.cache
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


def host() -> str:
    """This machine's short host name, fit for a file name ("gpu-7" of gpu-7.example.org)."""
    name = platform.node().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "unnamed-host"


def trained_on(manifest: dict) -> str | None:
    """The machine a run's manifest was written on, None when it is this one: its host, or,
    in a manifest written before the host was recorded, its chip and core count (a run with no
    manifest counts as this machine's)."""
    if "host" in manifest:
        return None if manifest["host"] == host() else str(manifest["host"])
    if not manifest or (manifest.get("chip"), manifest.get("cpu_count")) == (chip(),
                                                                              os.cpu_count()):
        return None
    return f"a {manifest.get('cpu_count')}-core {manifest.get('chip')}"


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
            "host": host(), "platform": platform.platform(), "machine": platform.machine(),
            "chip": chip(), "cpu_count": os.cpu_count(), "data_dir": str(data_dir),
            "data_meta_sha256": sha256_file(meta) if meta.exists() else None, "started": now(),
            **extra}
