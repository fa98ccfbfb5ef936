"""`python -m tests.reliability <command>`: chaos, faults (each module's USAGE)."""

from __future__ import annotations

from qkstudy import interrupts
from qkstudy.cli import entry

COMMANDS = {
    "chaos": (f"{__package__}.chaos",
              "the storm test: a sweep under random faults must end identical"),
    "faults": (f"{__package__}.faults",
               "fail each file operation of each command in turn: one error line, nothing lost"),
}


main = entry("python -m tests.reliability", COMMANDS)


if __name__ == "__main__":
    interrupts.main_process(main)
