"""Flush-to-zero for the CPU's subnormal floats, set once a process, before a framework loads.

A high-LR run's saturated softmax and Adam's second moments produce many subnormal floats
(below 1.2e-38 in float32), and each one costs a ~100-cycle microcode assist on x86-64: a
sweep's MLX runs at LR 0.1 trained 0.71x as fast as at LR 0.001 on the CPU before this
(docs/performance.md, "In-sweep speed"). With FTZ and DAZ set, such values are read and
written as 0; nothing else changes.

The switch is the CPU's floating-point control register, per thread; threads started after it
is set inherit it (pthread_create copies the floating-point environment), so it is set on the
main thread before MLX or PyTorch starts its worker and BLAS threads (qkstudy/backends.py).
It is set through the C library's fegetenv/fesetenv, so the core stays framework-free and
neither engine needs the other's switch. Supported: Linux on x86-64 (MXCSR's FTZ and DAZ
bits) and on aarch64 (FPCR's FZ bit); elsewhere (macOS, where MLX trains on the GPU) it is
left alone and the manifest records false. QKSTUDY_DENORMALS=keep leaves the CPU's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV = "QKSTUDY_DENORMALS"  # keep: the CPU's default handling of subnormal floats

# (system, machine) -> (sizeof(fenv_t), byte offset of the control register, its flush bits):
# glibc's x86_64 fenv_t ends in the 32-bit MXCSR (FTZ bit 15, DAZ bit 6); aarch64's is
# {fpcr, fpsr} (FZ bit 24)
LAYOUTS = {("Linux", "x86_64"): (32, 28, 0x8040),
           ("Linux", "aarch64"): (8, 0, 1 << 24)}


def _libm():
    name = ctypes.util.find_library("m")
    return ctypes.CDLL(name) if name else None


def _resolve(libm, layout):
    """(libm, layout): the given ones, else this machine's; None where it is not supported."""
    layout = layout or LAYOUTS.get((platform.system(), platform.machine()))
    libm = libm or (_libm() if layout else None)
    return (libm, layout) if libm and layout else None


def _control(libm, layout) -> tuple[ctypes.Array, int] | None:
    """This thread's floating-point environment and its control register (None: unsupported)."""
    size, offset, _ = layout
    env = (ctypes.c_ubyte * size)()
    if libm.fegetenv(env) != 0:
        return None
    return env, int.from_bytes(bytes(env[offset:offset + 4]), "little")


def flushing(libm=None, layout=None) -> bool:
    """Whether this thread flushes subnormals now."""
    found = _resolve(libm, layout)
    got = _control(*found) if found else None
    return got is not None and got[1] & found[1][2] == found[1][2]


def flush(libm=None, layout=None) -> bool:
    """Set FTZ/DAZ on this thread unless QKSTUDY_DENORMALS=keep; whether it is set after.
    `libm` and `layout` default to this machine's (tests pass others)."""
    if os.environ.get(ENV, "flush") == "keep":
        return flushing(libm, layout)
    found = _resolve(libm, layout)
    got = _control(*found) if found else None
    if got is None:
        return False
    (libm, layout), (env, control) = found, got
    _, offset, bits = layout
    env[offset:offset + 4] = list((control | bits).to_bytes(4, "little"))
    return libm.fesetenv(env) == 0 and flushing(libm, layout)
