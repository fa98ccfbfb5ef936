"""Flush-to-zero (qkstudy/denormals.py): set before a framework loads, inherited by its
threads, recorded in the manifest, and left alone with QKSTUDY_DENORMALS=keep."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from qkstudy import denormals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = (platform.system(), platform.machine()) in denormals.LAYOUTS

# a fresh process: load the backend as a run does, then multiply a float32 subnormal by 1
PROBE = """
import sys
from qkstudy import backends, denormals
backends.load(sys.argv[1])
if sys.argv[1] == "mlx":
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    x = mx.array([1e-39], dtype=mx.float32) * 1.0
    mx.eval(x)
    value = x.tolist()[0]
else:
    import torch
    value = float(torch.tensor([1e-39], dtype=torch.float32) * 1.0)
print(denormals.flushing(), value)
"""


def probe(backend: str, keep: bool) -> tuple[str, float]:
    env = dict(os.environ)
    env.pop(denormals.ENV, None)
    if keep:
        env[denormals.ENV] = "keep"
    out = subprocess.run([sys.executable, "-c", PROBE, backend], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    flag, value = out.stdout.split()
    return flag, float(value)


@pytest.mark.skipif(not SUPPORTED, reason="flush-to-zero is set on Linux x86-64 and aarch64")
@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_a_loaded_engine_computes_with_subnormals_flushed_unless_kept(backend):
    pytest.importorskip(backend)
    assert probe(backend, keep=False) == ("True", 0.0)
    flag, value = probe(backend, keep=True)
    assert flag == "False" and value == pytest.approx(1e-39, rel=1e-6)


class FakeLibm:
    """fegetenv/fesetenv over one environment held in bytes, as glibc lays it out."""

    def __init__(self, size: int, fail: bool = False):
        self.env, self.fail = bytearray(size), fail

    def fegetenv(self, buf) -> int:
        if self.fail:
            return 1
        ctypes.memmove(buf, bytes(self.env), len(self.env))
        return 0

    def fesetenv(self, buf) -> int:
        self.env[:] = bytes(buf)
        return 0


@pytest.mark.parametrize("machine", sorted(denormals.LAYOUTS))
def test_flush_sets_only_its_bits_in_each_layout(machine, monkeypatch):
    monkeypatch.delenv(denormals.ENV, raising=False)
    size, offset, bits = denormals.LAYOUTS[machine]
    libm = FakeLibm(size)
    libm.env[offset:offset + 4] = (0x1F80).to_bytes(4, "little")  # other bits set: kept
    assert not denormals.flushing(libm, denormals.LAYOUTS[machine])
    assert denormals.flush(libm, denormals.LAYOUTS[machine])
    assert int.from_bytes(libm.env[offset:offset + 4], "little") == 0x1F80 | bits
    assert libm.env[:offset] == bytes(offset)  # nothing else in the environment moved


def test_keep_and_a_failing_libm_leave_the_environment(monkeypatch):
    layout = denormals.LAYOUTS[("Linux", "x86_64")]
    monkeypatch.setenv(denormals.ENV, "keep")
    libm = FakeLibm(layout[0])
    assert denormals.flush(libm, layout) is False and libm.env == bytes(layout[0])
    monkeypatch.delenv(denormals.ENV)
    assert denormals.flush(FakeLibm(layout[0], fail=True), layout) is False
