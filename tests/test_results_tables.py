"""docs/results.md's tables are rendered from a report's tables: each gap cell says what the
report decided (marks, "neither learned", a lone pair), and a report without its tables is one
error line."""

from __future__ import annotations

import polars as pl
import pytest

from tools import results_tables as rt


def _gap(lr, gap, lo, hi, decision, informative=True, pairs=5):
    return {"depth": 4, "lr": lr, "pairs": pairs, "mean_gap": gap, "ci_lo": lo, "ci_hi": hi,
            "decision": decision, "informative": informative}


def test_each_gap_cell_says_what_the_report_decided():
    gaps = pl.DataFrame([
        _gap(0.001, 0.012, -0.01, 0.03, "no difference"),
        _gap(0.01, 0.15, -0.02, 0.32, "undetermined"),
        _gap(0.1, 0.51, 0.44, 0.59, "off worse"),
        _gap(1.73, 0.0005, None, None, "undetermined", pairs=1),
        _gap(3.0, 0.001, -0.001, 0.003, "undetermined", informative=False),
    ])
    header, rule, row = rt.gaps(gaps).splitlines()
    assert header == "| depth | 0.001 | 0.01 | 0.1 | 1.73 | 3 |"
    assert row.split(" | ")[1:] == [
        "+0.012 [-0.01, +0.03]= n=5", "+0.150 [-0.02, +0.32] n=5", "+0.510 [+0.44, +0.59]* n=5",
        "+0.001 (n<2)", "+0.001 (neither learned) |"]


def test_an_lr_run_at_one_depth_only_is_a_dash_at_the_others():
    gaps = pl.DataFrame([_gap(0.001, 0.01, 0.0, 0.02, "no difference"),
                         {**_gap(0.0132, 0.05, -0.1, 0.2, "undetermined"), "depth": 2},
                         {**_gap(0.001, 0.02, 0.0, 0.04, "no difference"), "depth": 2}])
    lines = rt.gaps(gaps).splitlines()
    assert lines[0] == "| depth | 0.001 | 0.0132 |"
    assert lines[3].endswith("| - |") and lines[3].startswith("| 4 |")


def test_a_report_without_its_tables_is_one_error_line(tmp_path):
    (tmp_path / "tables").mkdir()
    with pytest.raises(SystemExit, match=r"^error: .*verdicts\.parquet is missing: run `just report"):
        rt.load(tmp_path)


def _report(root, name, h3_decision, slope):
    tables = root / name / "tables"
    tables.mkdir(parents=True)
    pl.DataFrame({"hypothesis": ["H1", "H2", "H3"], "seeds": [5, 5, 5],
                  "verdict": ["supported", "mixed (max stable LR: not supported)", h3_decision]}
                 ).write_parquet(tables / "verdicts.parquet")
    pl.DataFrame({"measure": ["LR sensitivity", "max stable LR", "LR sensitivity"],
                  "role": ["primary", "primary", "per depth (descriptive)"],
                  "effect": [0.115, 0.923, 9.0], "ci_lo": [0.032, 0.771, 9.0],
                  "ci_hi": [0.175, 1.01, 9.0]}).write_parquet(tables / "h2_tests.parquet")
    pl.DataFrame({"slope": [slope], "ci_lo": [slope - 0.1], "ci_hi": [slope + 0.1]}
                 ).write_parquet(tables / "h3_tests.parquet")
    pl.DataFrame({"depth": [2, 4], "threshold": ["0.0144 [0.0123, 0.019]", "> 3 (censored)"]}
                 ).write_parquet(tables / "necessity.parquet")
    for other in ("gaps", "h1_best_loss", "arms"):
        pl.DataFrame({"depth": [2]}).write_parquet(tables / f"{other}.parquet")
    return root / name


def test_the_summary_has_one_row_per_study_from_its_primary_tests(tmp_path):
    a = _report(tmp_path, "mini", "not supported", -0.09)
    b = _report(tmp_path, "mini-seeds5-9", "inconclusive", -0.01)
    header, _, row_a, row_b = rt.summary([a, b]).splitlines()
    assert header.endswith("| threshold, depth 2 | threshold, depth 4 |")
    assert row_a == ("| `mini` | 5 | supported | mixed | 0.115 [0.032, 0.175] | x0.923 [0.771, 1.01] "
                     "| not supported (-0.09 [-0.19, +0.01]) | 0.0144 [0.0123, 0.019] "
                     "| > 3 (censored) |")
    assert "| inconclusive (-0.01 [-0.11, +0.09]) |" in row_b
