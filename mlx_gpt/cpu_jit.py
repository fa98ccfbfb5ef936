"""Build MLX's fused CPU kernels for this CPU (Linux x86-64), in a cache of their own.

MLX's Linux CPU backend compiles each fused elementwise kernel at run time with `g++ -O3 ...`
(found on PATH) for baseline x86-64 and caches it under `$TMPDIR/mlx/<version>/cpu/` by kernel
name only. With MLX_GPT_CPU_JIT=native, before mlx is imported, this module puts first on PATH a
`g++` wrapper that appends `-march=native`, and points TMPDIR at a folder keyed by this CPU's
identity, the compiler and the flags, so a library built otherwise is never loaded; Python's
own temporary folder stays where it was. The default, plain, is MLX's own build (the tuned one
measured 1.02-1.04x on a 2-core AMD EPYC: docs/performance.md). Elsewhere nothing changes.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "MLX_GPT_CPU_JIT"  # native | plain
DEFAULT = "plain"
FLAGS = "-march=native"
ORIGINAL_TMPDIR = "MLX_GPT_ORIGINAL_TMPDIR"  # TMPDIR before this module changed it

# The wrapper MLX runs (through the shell) as `g++ --version` and `g++ <flags> -I <include>
# <dir>/tmp_<id>.cpp -o <dir>/tmp_<id>.so`; MLX renames the library to its kernel name itself.
WRAPPER = """#!/bin/sh
# Written by mlx_gpt/cpu_jit.py: MLX's CPU JIT compiler, with {flags}.
exec {gxx} "$@" {flags}
"""

active: str | None = None  # the cache folder in use, or None (MLX's own build)


def cpu_identity() -> str:
    """The CPU's model name and feature flags, as /proc/cpuinfo gives them for the first core."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "model name", "flags") and key not in fields:
                    fields[key] = " ".join(value.split())
                if not line.strip() and fields:
                    break
    except OSError:
        return ""
    return "\n".join(f"{k}: {fields[k]}" for k in sorted(fields))


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx_gpt" / "cpu-jit"


def cache_key(identity: str, gxx: str) -> str:
    stat = os.stat(gxx)
    blob = "\n".join([identity, FLAGS, WRAPPER, os.path.realpath(gxx), str(stat.st_size),
                      str(stat.st_mtime_ns)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def supported() -> bool:
    """Linux on x86-64, where MLX's CPU backend compiles its kernels with g++."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def wanted() -> bool:
    mode = os.environ.get(ENV, DEFAULT)
    if mode not in ("native", "plain"):
        print(f"warning: {ENV}={mode!r} is neither native nor plain; using plain", file=sys.stderr)
        return False
    return mode == "native" and supported()


def _write_once(path: Path, text: str, mode: int) -> None:
    """Write `path` unless it already holds `text`; atomically, as other processes may read it."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _without_inherited() -> list[str]:
    """Undo what a parent process's ensure_native_jit put in the environment (a child running
    plain must not compile into, or load from, the tuned cache). Returns PATH without it."""
    root = str(cache_root())
    if os.environ.get("TMPDIR", "").startswith(root) and ORIGINAL_TMPDIR in os.environ:
        os.environ["TMPDIR"] = os.environ[ORIGINAL_TMPDIR]
        tempfile.tempdir = None
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(root)]
    os.environ["PATH"] = os.pathsep.join(path)
    return path


def ensure_native_jit() -> str | None:
    """Route MLX's CPU JIT through the -march=native wrapper. Returns the cache folder, or None."""
    global active
    if active or "mlx.core" in sys.modules:
        return active  # once mlx is imported it is too late to change where MLX compiles
    path = _without_inherited()
    if not wanted():
        return None
    gxx = shutil.which("g++", path=os.pathsep.join(path))
    identity = cpu_identity()
    if not gxx or not identity:
        return None
    folder = cache_root() / cache_key(identity, gxx)
    bin_dir = folder / "bin"
    try:
        bin_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_once(bin_dir / "g++", WRAPPER.format(gxx=shlex.quote(gxx), flags=FLAGS), 0o755)
        _write_once(folder / "cpu.txt", identity + f"\ncompiler: {gxx} {FLAGS}\n", 0o644)
    except OSError as exc:
        print(f"warning: cannot set up the tuned CPU JIT cache in {folder} ({exc}); MLX builds "
              f"its kernels for baseline x86-64", file=sys.stderr)
        return None
    # Python's temporary files stay where they were, in this process and in its children.
    original = os.environ.get(ORIGINAL_TMPDIR, tempfile.gettempdir())
    tempfile.tempdir = original
    os.environ[ORIGINAL_TMPDIR] = original
    os.environ["TMPDIR"] = str(folder)  # MLX caches under $TMPDIR/mlx/<version>/cpu
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *path])
    active = str(folder)
    return active
