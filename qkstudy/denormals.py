"""Flush-to-zero for the CPU's subnormal floats (each a ~100-cycle assist on x86-64; high-LR
runs make many: docs/performance.md), set on the main thread through libm's fegetenv/fesetenv
before a framework starts its threads, which inherit it. Linux x86-64 and aarch64 only."""

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
    layout = layout or LAYOUTS.get((platform.system(), platform.machine()))
    libm = libm or (_libm() if layout else None)
    return (libm, layout) if libm and layout else None


def _control(libm, layout) -> tuple[ctypes.Array, int] | None:
    size, offset, _ = layout
    env = (ctypes.c_ubyte * size)()
    if libm.fegetenv(env) != 0:
        return None
    return env, int.from_bytes(bytes(env[offset:offset + 4]), "little")


def flushing(libm=None, layout=None) -> bool:
    found = _resolve(libm, layout)
    got = _control(*found) if found else None
    return got is not None and got[1] & found[1][2] == found[1][2]


def flush(libm=None, layout=None) -> bool:
    """Set FTZ/DAZ on this thread unless QKSTUDY_DENORMALS=keep; whether it is set after."""
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
