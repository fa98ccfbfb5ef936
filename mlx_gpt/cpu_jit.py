"""MLX's CPU backend prepared before `import mlx` (Linux only; docs/performance.md)."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import platform
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

BLAS_PATHS = ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
              "/usr/lib/aarch64-linux-gnu/libopenblas.so.0", "/usr/lib64/libopenblas.so.0",
              "/usr/lib/libopenblas.so.0")
ENV = "MLX_GPT_CPU_JIT"  # native | plain
DEFAULT = "plain"
FLAGS = "-march=native"
ORIGINAL_TMPDIR = "MLX_GPT_ORIGINAL_TMPDIR"  # TMPDIR before this module changed it
# MLX runs it (through the shell) as `g++ --version` and `g++ <flags> ... -o <dir>/tmp_<id>.so`
WRAPPER = """#!/bin/sh
# Written by mlx_gpt/cpu_jit.py: MLX's CPU JIT compiler, with {flags}.
exec {gxx} "$@" {flags}
"""

blas: str | None = None  # the BLAS loaded, recorded in each run's manifest
slow_blas: str | None = None  # why MLX may compute on its slow reference BLAS, said once it does
active: str | None = None  # the tuned cache folder in use, or None (MLX's own build)


def ensure_fast_blas() -> str | None:
    """Load an optimised BLAS globally before mlx is imported. Returns its path, or None."""
    global blas, slow_blas
    if blas or not sys.platform.startswith("linux") or os.environ.get("MLX_GPT_BLAS") == "none":
        return blas
    if "mlx.core" in sys.modules:
        slow_blas = "mlx was imported before mlx_gpt; it may be using the slow reference BLAS"
    for path in [os.environ.get("MLX_GPT_BLAS"), ctypes.util.find_library("openblas"),
                 *BLAS_PATHS]:
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            lib.cblas_sgemm  # noqa: B018 - must export the plain name MLX imports
        except (OSError, AttributeError):
            continue
        blas = path
        return blas
    slow_blas = ("no OpenBLAS found; MLX on Linux falls back to the reference BLAS (~50x slower "
                 "matmuls). Fix: apt-get install libopenblas0-pthread (or set "
                 "MLX_GPT_BLAS=/path/lib.so)")
    return None


def warn_slow_blas() -> None:
    """Say once, as MLX is about to compute, why it may run on its slow reference BLAS."""
    global slow_blas
    if slow_blas:
        print(f"warning: {slow_blas}", file=sys.stderr, flush=True)
        slow_blas = None


def cpu_identity() -> str:
    """The first processor's vendor_id, model name and flags in /proc/cpuinfo ("" without it)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return ""
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), " ".join(value.split()))
    return "\n".join(f"{k}: {fields[k]}" for k in sorted(fields)
                     if k in ("vendor_id", "model name", "flags"))


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx_gpt" / "cpu-jit"


def cache_key(identity: str, gxx: str) -> str:
    stat = os.stat(gxx)
    blob = "\n".join([identity, FLAGS, WRAPPER, os.path.realpath(gxx), str(stat.st_size),
                      str(stat.st_mtime_ns)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def supported() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _write_once(path: Path, text: str, mode: int) -> None:
    """Write `path` atomically unless it already holds `text` (other processes may read it)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def ensure_native_jit() -> str | None:
    """Route MLX's CPU JIT through the -march=native wrapper. Returns the cache folder, or None."""
    global active
    if active or "mlx.core" in sys.modules:
        return active  # once mlx is imported it is too late to change where MLX compiles
    # undo a parent's ensure_native_jit: a child running plain must not use the tuned cache
    root = str(cache_root())
    if os.environ.get("TMPDIR", "").startswith(root) and ORIGINAL_TMPDIR in os.environ:
        os.environ["TMPDIR"] = os.environ[ORIGINAL_TMPDIR]
        tempfile.tempdir = None
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(root)]
    os.environ["PATH"] = os.pathsep.join(path)
    mode = os.environ.get(ENV, DEFAULT)
    if mode not in ("native", "plain"):
        print(f"warning: {ENV}={mode!r} is neither native nor plain; using plain", file=sys.stderr)
    if mode != "native" or not supported():
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
    original = os.environ.get(ORIGINAL_TMPDIR, tempfile.gettempdir())
    tempfile.tempdir = original
    os.environ[ORIGINAL_TMPDIR] = original
    os.environ["TMPDIR"] = str(folder)  # MLX caches under $TMPDIR/mlx/<version>/cpu
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *path])
    active = str(folder)
    return active
