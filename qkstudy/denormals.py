"""Flush-to-zero for subnormal floats, set before a framework's threads (docs/performance.md)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV = "QKSTUDY_DENORMALS"  # keep: the CPU's default handling of subnormal floats

# (system, machine) -> (sizeof(fenv_t), byte offset of the control register, its flush bits):
# glibc's x86_64 fenv_t ends in the 32-bit MXCSR (FTZ bit 15, DAZ bit 6); aarch64's is
# {fpcr, fpsr} (FZ bit 24)
LAYOUTS = {("Linux", "x86_64"): (32, 28, 0x8040), ("Linux", "aarch64"): (8, 0, 1 << 24)}


def _state(libm, layout):
    """(libm, layout, this thread's fenv, its control register), or None where unsupported."""
    layout = layout or LAYOUTS.get((platform.system(), platform.machine()))
    name = ctypes.util.find_library("m") if layout and not libm else None
    libm = libm or (ctypes.CDLL(name) if name else None)
    if not (libm and layout):
        return None
    size, offset, _ = layout
    env = (ctypes.c_ubyte * size)()
    if libm.fegetenv(env) != 0:
        return None
    return libm, layout, env, int.from_bytes(bytes(env[offset:offset + 4]), "little")


def flushing(libm=None, layout=None) -> bool:
    found = _state(libm, layout)
    return found is not None and found[3] & found[1][2] == found[1][2]


def flush(libm=None, layout=None) -> bool:
    """Set FTZ/DAZ on this thread unless QKSTUDY_DENORMALS=keep; whether it is set after."""
    if os.environ.get(ENV, "flush") == "keep":
        return flushing(libm, layout)
    found = _state(libm, layout)
    if found is None:
        return False
    libm, layout, env, control = found
    _, offset, bits = layout
    env[offset:offset + 4] = list((control | bits).to_bytes(4, "little"))
    return libm.fesetenv(env) == 0 and flushing(libm, layout)
