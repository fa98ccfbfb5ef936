"""`python -m analysis report [RUNS_DIR] [--out DIR] [options]`: tables, charts, report.html.
`python -m analysis calibrate [--studies N] [--seeds 3,6]`: the verdicts' false-positive rate
and power on simulated studies."""

from __future__ import annotations

import argparse
import errno
import sys
import time
from pathlib import Path

from qkstudy.errors import UsageError

from .outfolder import check_writable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other bad input
        raise UsageError(message)


def _lrs(text: str) -> tuple[float, ...]:
    try:
        lrs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not lrs or any(lr <= 0 for lr in lrs):
        raise argparse.ArgumentTypeError(f"learning rates must be > 0, got {text!r}")
    return lrs


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m analysis", description=__doc__)
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    r = sub.add_parser("report", help="build the study report from a runs folder")
    r.add_argument("runs_dir", nargs="?", default="runs",
                   help="a runs tree, one sweep folder or one run folder (default: runs)")
    r.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: reports/<name of RUNS_DIR>, e.g. reports/demo "
                        "for runs/demo)")
    r.add_argument("--threshold", type=float, default=None, metavar="LOSS",
                   help="val loss level for steps-to-threshold (default: per depth, the "
                        "largest mid-training val loss of the arms' best runs)")
    r.add_argument("--curve-lrs", type=_lrs, default=(), metavar="LR,LR",
                   help="learning rates for the training-curve chart (default: per depth, "
                        "the off arm's optimal, max stable and first divergent LR)")
    r.add_argument("--probes", type=lambda t: tuple(n.strip() for n in t.split(",") if n.strip()),
                   default=(), metavar="NAME,NAME",
                   help="probe names for the 'other probes' chart (default: residual kurtosis "
                        "and a few others when present)")
    r.add_argument("--alpha", type=float, default=0.05, metavar="A",
                   help="error level of each hypothesis's family of tests (Benjamini-Hochberg; "
                        "default 0.05)")
    r.add_argument("--min-gap", type=float, default=0.02, metavar="NATS",
                   help="the smallest loss gap that counts as a difference and the "
                        "equivalence margin of 'no difference' (default 0.02 nats, 2%% perplexity)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["calibrate"]:  # the verdicts on simulated studies of known truth
        from .calibrate import main as calibrate

        return calibrate(argv[1:])
    if argv[:1] == ["chaos"]:  # the storm test: sweeps under faults, compared by their reports
        from qkstudy.cli import dispatch

        return dispatch("python -m analysis", {"chaos": ("analysis.chaos", "the storm test")},
                        argv)
    try:
        args = parser().parse_args(argv)
        if args.command is None:
            parser().print_help()
            return 0
        if not args.min_gap >= 0:
            raise UsageError(f"--min-gap must be >= 0 nats, not {args.min_gap:g}")
        if not 0 < args.alpha < 1:
            raise UsageError(f"--alpha must be between 0 and 1, not {args.alpha:g}")
        from . import metrics
        from .report import ReportOptions, build_report

        runs_dir = Path(args.runs_dir)
        out = Path(args.out) if args.out else Path("reports") / runs_dir.resolve().name
        options = ReportOptions(loss_threshold=args.threshold, curve_lrs=args.curve_lrs,
                                probe_names=args.probes,
                                study=metrics.Options(alpha=args.alpha,
                                                      min_gap=args.min_gap))
        t0 = time.perf_counter()
        check_writable(out)
        try:
            path, study = build_report(runs_dir, out, options)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise UsageError(f"disk full while writing the report to {out}; free some space "
                                 "and run the same command again") from None
            raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if study is None:
        print(f"report: {path} (no finished runs: every run failed; the page lists them)")
        return 0
    for warning in study.runs.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in study.notes:
        print(f"note: {note}", file=sys.stderr)
    several = study.verdicts["on_kind"].n_unique() > 1  # name the arm when there are several

    def verdict_text(r: dict) -> str:
        arm = f" ({r['on_kind']})" if several else ""
        return f"{r['hypothesis']}{arm} {r['verdict']}"

    verdicts = ", ".join(verdict_text(r) for r in study.verdicts.iter_rows(named=True))
    print(f"report: {path} ({study.runs.table.height} runs, {study.points.height} in the study; "
          f"{verdicts or 'no verdicts'}; {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
