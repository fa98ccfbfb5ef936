"""The command-line frame shared by `python -m qkstudy` and `python -m crosscheck`."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import textwrap
from collections.abc import Callable

from . import files, interrupts
from .errors import UsageError

HELP = ("-h", "--help", "help")


def keys_usage(usage: str, what: str, config: type) -> str:
    """A command's help: the usage line, what it does, then every key with its default."""
    words = [f"{f.name}={f.default}" for f in dataclasses.fields(config)]
    keys = textwrap.fill("  ".join(words), width=96, initial_indent="  ",
                         subsequent_indent="  ", break_on_hyphens=False)
    return f"usage: {usage}\n\n{what}\n\nkeys (defaults shown):\n{keys}"


def entry(prog: str, commands: dict[str, tuple[str, str]],
          missing: dict[str, str] | None = None) -> Callable[..., int]:
    return functools.partial(dispatch, prog, commands, missing=missing)


def dispatch(prog: str, commands: dict[str, tuple[str, str]], argv: list[str] | None = None,
             missing: dict[str, str] | None = None) -> int:
    """Run `<prog> <command> [args]`; `missing` maps an optional package to a hint."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in HELP:
        width = max(map(len, commands)) + 1
        print(f"usage: {prog} <command> [args]\n\ncommands:")
        for name, (_, help_) in commands.items():
            print(f"  {name:<{width}} {help_}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in commands:
        print(f"error: unknown command {command!r}; expected one of {', '.join(commands)}",
              file=sys.stderr)
        return 2
    try:
        with interrupts.raising():
            try:
                # interrupted while initialising, MLX's C extension aborts the process
                with interrupts.Deferred():
                    module = importlib.import_module(commands[command][0])
            except ModuleNotFoundError as e:
                if e.name not in (missing or {}):
                    raise
                raise UsageError(missing[e.name]) from None
            if any(a in HELP for a in rest) and hasattr(module, "USAGE"):
                print(module.USAGE)
                return 0
            return int(module.cli(rest) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if not files.io_failure(e):
            raise
        print(f"error: {files.cannot_write(e, e.filename or 'a file')}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, ImportError) as e:
        # Ctrl-C while a C extension initialises surfaces as an ImportError caused by it
        signal_error = interrupts.caused_by_interrupt(e)
        if signal_error is None:
            raise
        print("interrupted", file=sys.stderr)
        return interrupts.exit_code(signal_error)
