"""A PNG file's width and height, read from its header (the chart and report tests)."""

from __future__ import annotations

import struct
from pathlib import Path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])
