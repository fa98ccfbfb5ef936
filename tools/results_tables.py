"""A study's section of docs/results.md, rendered from its report's tables.

    python -m tools.results_tables reports/mini          # Markdown on stdout
    python -m tools.results_tables --summary reports/mini reports/mini-tinystories   # one row each

Every number in a study's section of docs/results.md comes from the tables `just report` wrote
(`REPORT/tables/*.parquet`): the verdicts, the practitioner's rule, the evidence lines, the gap
per LR, the necessity thresholds, H2's and H3's tests, each arm's best loss and the per-arm
measures. The prose around them is written by hand and cites these tables.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import polars as pl

TABLES = ("verdicts", "gaps", "necessity", "h2_tests", "h3_tests", "h1_best_loss", "arms")


def _g(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def _q(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def _effect(r: dict | None, prefix: str = "") -> str:
    """An H2 row's effect with its 95% interval, or '-' where the study has no such row."""
    return "-" if r is None else f"{prefix}{_g(r['effect'])} [{_g(r['ci_lo'])}, {_g(r['ci_hi'])}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def load(report: Path) -> dict[str, pl.DataFrame]:
    """The report's tables, or one line saying which is missing and how to make it."""
    tables = {}
    for name in TABLES:
        path = report / "tables" / f"{name}.parquet"
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing: run `just report RUNS out={report}` first")
        tables[name] = pl.read_parquet(path)
    return tables


def verdicts(t: pl.DataFrame) -> str:
    return _table(["hypothesis", "verdict", "family", "correction", "seeds"],
                  [[r["hypothesis"], f"**{r['verdict']}**", str(r["family_size"]),
                    r["correction"], str(r["seeds"])] for r in t.iter_rows(named=True)])


def rules(necessity: pl.DataFrame) -> str:
    """Per depth the rule made of tested claims (docs/report.md, amendment 1) and, beside it,
    the fitted crossing as an estimate with its interval."""
    return "\n".join(
        f"- {r['tested_rule']}; the fitted crossing (an estimate, not a test): "
        f"{r['threshold'] or r['note']}" if r.get("tested_rule") else f"- {r['rule']}"
        for r in necessity.sort("depth").iter_rows(named=True))


def evidence(t: pl.DataFrame) -> str:
    return "\n".join(f"- **{r['hypothesis']}**: {r['evidence']}" for r in t.iter_rows(named=True))


def _cell(r: dict) -> str:
    gap = f"{r['mean_gap']:+.3f}"
    if not r["informative"]:
        return f"{gap} (neither learned)"
    if r["ci_lo"] is None:
        return f"{gap} (n<2)"
    mark = {"off worse": "*", "no difference": "="}.get(r["decision"], "")
    return f"{gap} [{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}]{mark} n={r['pairs']}"


def gaps(t: pl.DataFrame) -> str:
    lrs = sorted(t["lr"].unique().to_list())
    rows = []
    for depth in sorted(t["depth"].unique().to_list()):
        cells = {r["lr"]: _cell(r) for r in t.filter(pl.col("depth") == depth).iter_rows(named=True)}
        rows.append([str(depth)] + [cells.get(lr, "-") for lr in lrs])
    return _table(["depth"] + [_g(lr) for lr in lrs], rows)


def necessity(t: pl.DataFrame) -> str:
    return _table(["depth", "threshold [95% interval]", "censored", "bracket", "not needed below"],
                  [[str(r["depth"]), r["threshold"], r["censored"] or "-",
                    "-" if r["bracket_lo"] is None else f"{_g(r['bracket_lo'])}-{_g(r['bracket_hi'])}",
                    _g(r["not_needed_below"])] for r in t.sort("depth").iter_rows(named=True)])


def h2(t: pl.DataFrame) -> str:
    rows = []
    for r in t.iter_rows(named=True):
        rows.append([r["measure"], r["role"], "all" if r["depth"] is None else str(r["depth"]),
                     _effect(r), r["per_seed"],
                     _g(r["resolution"], 2), _q(r["p_for"]), _q(r["q_for"]), _q(r["q_against"]),
                     _q(r["q_equivalent"]), r["decision"]])
    return _table(["measure", "role", "depth", "effect [95% interval]", "per (depth, seed)",
                   "resolution", "p for", "q for", "q against", "q equivalent", "decision"], rows)


def h3(t: pl.DataFrame) -> str:
    return _table(["depths", "slope (decades per doubling) [95% interval]", "draws without a slope",
                   "q fall", "q rise", "q equal", "decision"],
                  [[r["depths"], f"{r['slope']:+.2f} [{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}]",
                    f"{r['undefined_share']:.0%}", _q(r["q_fall"]), _q(r["q_rise"]),
                    _q(r["q_equal"]), r["decision"]] for r in t.iter_rows(named=True)])


def best_loss(t: pl.DataFrame) -> str:
    return _table(["depth", "best loss off", "best loss on", "off - on [95% interval]", "q"],
                  [[str(r["depth"]), f"{r['best_loss_off']:.3f}", f"{r['best_loss_on']:.3f}",
                    f"{r['mean_gap']:+.3f} [{r['ci_lo']:+.3f}, {r['ci_hi']:+.3f}]",
                    _q(r["q_off_worse"])] for r in t.sort("depth").iter_rows(named=True)])


def arms(t: pl.DataFrame) -> str:
    return _table(["depth", "arm", "max stable LR (range)", "max usable LR",
                   "LR sensitivity (range)", "optimal LR", "best loss"],
                  [[str(r["depth"]), r["arm"],
                    f"{_g(r['max_stable_lr'])} ({_g(r['max_stable_lr_lo'])}-{_g(r['max_stable_lr_hi'])})",
                    _g(r["max_usable_lr"]),
                    f"{r['lr_sensitivity']:.3f} ({r['lr_sensitivity_lo']:.3f}-"
                    f"{r['lr_sensitivity_hi']:.3f})",
                    _g(r["optimal_lr"]), f"{r['best_loss']:.3f}"]
                   for r in t.sort("depth", "arm").iter_rows(named=True)])


def render(report: Path) -> str:
    t = load(report)
    parts = [verdicts(t["verdicts"]), rules(t["necessity"]), evidence(t["verdicts"]),
             gaps(t["gaps"]), necessity(t["necessity"]), h2(t["h2_tests"]), h3(t["h3_tests"]),
             best_loss(t["h1_best_loss"]), arms(t["arms"])]
    return "\n\n".join(parts) + "\n"


def summary(reports: list[Path]) -> str:
    """One row per study: its verdicts, H2's two primary effects, H3's slope and each depth's
    threshold with its interval."""
    studies = {report: load(report) for report in reports}
    depths = sorted({d for t in studies.values() for d in t["necessity"]["depth"].to_list()})
    rows = []
    for report, t in studies.items():
        verdict = {r["hypothesis"]: r["verdict"] for r in t["verdicts"].iter_rows(named=True)}
        h2 = {r["measure"]: r for r in t["h2_tests"].filter(pl.col("role") == "primary")
              .iter_rows(named=True)}
        slope = t["h3_tests"].row(0, named=True) if t["h3_tests"].height else None
        threshold = {r["depth"]: r["threshold"] for r in t["necessity"].iter_rows(named=True)}
        rows.append([f"`{report.name}`", str(t["verdicts"]["seeds"].max()),
                     verdict.get("H1", "-"), verdict.get("H2", "-").split(" (")[0],
                     _effect(h2.get("LR sensitivity")), _effect(h2.get("max stable LR"), "x"),
                     verdict.get("H3", "-") + ("" if slope is None else
                                              f" ({slope['slope']:+.2f} [{slope['ci_lo']:+.2f}, "
                                              f"{slope['ci_hi']:+.2f}])")]
                    + [threshold.get(d, "-") for d in depths])
    return _table(["report", "seeds", "H1", "H2", "LR sensitivity, off - on (nats)",
                   "max stable LR, on / off", "H3 (slope, decades per doubling)"]
                  + [f"threshold, depth {d}" for d in depths], rows) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summary"] and len(argv) > 1:
        sys.stdout.write(summary([Path(a) for a in argv[1:]]))
        return 0
    if len(argv) != 1:
        print("usage: python -m tools.results_tables REPORT_DIR | --summary REPORT_DIR...",
              file=sys.stderr)
        return 2
    sys.stdout.write(render(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
