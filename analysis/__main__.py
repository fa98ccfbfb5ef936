"""`python -m analysis <command> [args]`: advise, report, ladder, calibrate (each module's
USAGE)."""

from __future__ import annotations

from qkstudy import interrupts
from qkstudy.cli import entry

COMMANDS = {
    "advise": ("analysis.advise", "whether a run at an LR and schedule needs QK-norm, from the "
                                  "published archives"),
    "report": ("analysis.report", "tables, charts, verdicts and report.html from a runs folder"),
    "ladder": ("analysis.ladder", "the ladder's transfer law, prediction and per-point tables"),
    "ladder-calibrate": ("analysis.ladder_calibration",
                         "the transfer law's coverage and false-claim rates on simulated ladders"),
    "calibrate": ("analysis.calibrate",
                  "the verdicts' false-positive rate and power on simulated studies"),
}


main = entry("python -m analysis", COMMANDS)


if __name__ == "__main__":
    interrupts.main_process(main)
