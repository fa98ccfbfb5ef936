"""setup.sh's closing summary tells the truth whether or not OpenBLAS is present, however long
the loader's listing is (a pipe into `grep -q` under pipefail died of SIGPIPE on long ones)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the OpenBLAS row is Linux's")


def summary(tmp_path: Path, listing: str) -> str:
    fake = tmp_path / "ldconfig"
    data = tmp_path / "listing.txt"
    data.write_text(listing)
    fake.write_text(f"#!/bin/sh\ncat {data}\n")
    fake.chmod(0o755)
    out = subprocess.run([str(ROOT / "setup.sh"), "summary"], capture_output=True, text=True,
                         env={**os.environ, "SETUP_LDCONFIG": str(fake)}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


# OpenBLAS's line first, then far more than a pipe's buffer: grep -q exits at the first line
# while the writer still has most of it to write
BULK = "".join(f"\tlibfiller{i}.so.1 (libc6,x86-64) => /usr/lib/libfiller{i}.so.1\n"
               for i in range(20_000))
PRESENT = "\tlibopenblas.so.0 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libopenblas.so.0\n"


def openblas_row(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("OpenBLAS"))


def test_openblas_present_is_reported_present_even_first_in_a_long_listing(tmp_path):
    assert openblas_row(summary(tmp_path, PRESENT + BULK)).split()[1] == "yes"


def test_openblas_absent_is_reported_with_its_cost_and_fix(tmp_path):
    row = openblas_row(summary(tmp_path, BULK))
    assert "NO:" in row and "apt-get install libopenblas0-pthread" in row


def test_summary_mode_writes_nothing_and_keeps_the_setup_log(tmp_path):
    log = ROOT / ".setup.log"
    before = log.read_bytes() if log.exists() else None
    summary(tmp_path, PRESENT)
    assert (log.read_bytes() if log.exists() else None) == before
