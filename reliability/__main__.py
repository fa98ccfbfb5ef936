"""`python -m reliability <command>`: chaos, faults (each module's USAGE)."""

from __future__ import annotations

import sys

from qkstudy import interrupts
from qkstudy.cli import dispatch

COMMANDS = {
    "chaos": ("reliability.chaos", "the storm test: a sweep under random faults must end identical"),
    "faults": ("reliability.faults",
               "fail each file operation of each command in turn: one error line, nothing lost"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m reliability", COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    interrupts.main_process(main)
