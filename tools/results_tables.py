"""The published answer, rebuilt from the archives in results/: the README's answer table,
docs/results.md's generated blocks and the answer's figure (docs/results/answer.png).

    python -m tools.results_tables           # rewrite the generated blocks and the figure
    python -m tools.results_tables --check   # exit 1 where a block differs from the archives

A generated block sits between `<!-- NAME: ... -->` and `<!-- end NAME -->`; the prose around
it is written by hand and cites it. tests/test_published.py holds every block to the archives.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import polars as pl

from analysis.ladder import analyse_ladder, seed_effects, summary_text
from analysis.load import load_runs
from analysis.study import Study, analyse
from qkstudy.archive import extract

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("mini", "mini-seeds5-9", "mini-tinystories", "mini-l2norm")
HEADER = ["depth", "d_model", "steps", "warmup", "skip below (tested)", "needed from (tested)",
          "onset [95% CI]", "max usable LR on/off [95% CI]", "LR-sensitivity gap, nats [95% CI]"]


def _lr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ci(r: dict, key: str, fmt: str, prefix: str = "") -> str:
    if r.get(key) is None or r.get(f"{key}_lo") is None:
        return "-"
    return (f"{prefix}{r[key]:{fmt}} [{prefix}{r[f'{key}_lo']:{fmt}}, "
            f"{prefix}{r[f'{key}_hi']:{fmt}}]")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def row_cells(r: dict) -> list[str]:
    return [str(r["depth"]), str(r["d_model"]), f"{r['steps']:,}", str(r["warmup"]),
            _lr(r["no_difference_up_to"]), _lr(r["off_worse_from"]), r["onset"],
            _ci(r, "usable_ratio", ".2f", "x"), _ci(r, "sensitivity_gap", "+.2f")]


def study_rows(study: Study) -> list[dict]:
    """Per depth of a study, its compared arm against off: the row the answer table shows."""
    train = study.points.row(0, named=True)
    rows = []
    for t in study.thresholds.sort("depth").iter_rows(named=True):
        rows.append({"depth": t["depth"], "d_model": train["d_model"],
                     "steps": train["max_steps"], "warmup": train["warmup_steps"],
                     "no_difference_up_to": t["no_difference_up_to"],
                     "off_worse_from": t["off_worse_from"], "onset": t["onset"] or t["note"],
                     "onset_lr": t["onset_lr"], "onset_lo": t["ci_lo"], "onset_hi": t["ci_hi"],
                     **seed_effects(study, t["depth"])})
    return rows


def verdict_line(study: Study) -> str:
    return "; ".join(f"{r['hypothesis']} **{r['verdict']}**"
                     for r in study.verdicts.iter_rows(named=True))


def analyse_all(root: Path = ROOT) -> tuple[dict[str, Study], dict]:
    studies = {}
    with tempfile.TemporaryDirectory(prefix="qkstudy-results-") as tmp:
        for name in STUDIES:
            folder, _, _ = extract(root / "results" / f"{name}.tar.xz", Path(tmp) / name)
            studies[name] = analyse(load_runs(folder))
    return studies, analyse_ladder([root / "results" / "ladder"])


def blocks(studies: dict[str, Study], ladder: dict) -> dict[str, str]:
    """Every generated block by name."""
    mini = study_rows(studies["mini"])
    points = [r for r in ladder["points"].iter_rows(named=True)]  # type: ignore[union-attr]
    out = {"answer": _table(HEADER, [row_cells(r) for r in mini + points]),
           "ladder": summary_text(ladder).strip()}
    for name, study in studies.items():
        out[name] = (verdict_line(study) + "\n\n"
                     + _table(HEADER, [row_cells(r) for r in study_rows(study)]))
    return out


def figure(studies: dict[str, Study], ladder: dict):
    """The onset with its interval against warmup steps, training steps, width and depth."""
    import altair as alt

    points = ladder["points"].filter(pl.col("onset_lr").is_not_null())  # type: ignore[union-attr]
    panels = []
    for r in points.iter_rows(named=True):
        if r["d_model"] == 64:
            panels.append(("warmup steps", r["warmup"], f"{r['steps']:,} steps", r))
            if r["warmup"] in (30, r["steps"] // 10):
                tag = "30 warmup steps" if r["warmup"] == 30 else "warmup 10% of the run"
                panels.append(("training steps", r["steps"], tag, r))
        if r["steps"] == 300 and r["warmup"] == 30:
            panels.append(("width (d_model)", r["d_model"], "300 steps", r))
    for r in study_rows(studies["mini"]):
        if r["onset_lr"] is not None:
            panels.append(("depth (the mini)", r["depth"], "300 steps", r))
    data = [{"panel": p, "x": x, "series": s, "onset": r["onset_lr"],
             "lo": r["onset_lo"] or 1e-4, "hi": r["onset_hi"] or 3.0} for p, x, s, r in panels]
    y = alt.Y("onset:Q", scale=alt.Scale(type="log", domain=[1e-3, 1]),
              title="LR from which QK-norm is needed (onset)")
    base = alt.Chart().encode(x=alt.X("x:Q", scale=alt.Scale(type="log"), title=None),
                              color=alt.Color("series:N", title=None))
    layers = alt.layer(base.mark_line(point=True).encode(y=y),
                       base.mark_rule().encode(y=alt.Y("lo:Q"), y2="hi:Q"), data=alt.Data(values=data))
    return layers.properties(width=180, height=200).facet(
        column=alt.Column("panel:N", title=None, sort=["warmup steps", "training steps",
                                                       "width (d_model)", "depth (the mini)"])
    ).resolve_scale(x="independent")


def replace_block(text: str, name: str, content: str) -> str:
    pattern = re.compile(rf"(<!-- {re.escape(name)}: [^>]*-->\n).*?(\n<!-- end {re.escape(name)} -->)",
                         re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: no generated block {name!r} in the page")
    return pattern.sub(lambda m: m.group(1) + content + m.group(2), text)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python -m tools.results_tables [--check]", file=sys.stderr)
        return 2
    studies, ladder = analyse_all()
    made = blocks(studies, ladder)
    pages = {ROOT / "README.md": ["answer"], ROOT / "docs" / "results.md": [*STUDIES, "ladder"]}
    stale = []
    for page, names in pages.items():
        text = page.read_text()
        new = text
        for name in names:
            new = replace_block(new, name, made[name])
        if new != text:
            stale.append(page.name)
            if not argv:
                page.write_text(new)
    if not argv:
        from analysis.charts import save_chart
        save_chart(figure(studies, ladder), ROOT / "docs" / "results", "answer")
        for ext in ("svg", "html"):
            (ROOT / "docs" / "results" / f"answer.{ext}").unlink()
        print(f"rewrote {', '.join(stale) or 'nothing'}; docs/results/answer.png", file=sys.stderr)
        return 0
    print(f"stale: {', '.join(stale)}" if stale else "every block matches", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
