"""User-facing errors: one line, exit code 2, nothing half-written."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user. The CLI prints `error: <message>` and exits 2."""
