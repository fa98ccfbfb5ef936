"""User-facing errors of the analysis: one line, exit code 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input (no runs, a bad option). `python -m analysis` prints `error: ...` and exits 2."""
