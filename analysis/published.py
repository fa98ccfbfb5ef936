"""`python -m analysis.published [--check | --register]`: rewrite (or, with --check, compare) the
blocks between `<!-- NAME: ... -->` and `<!-- end NAME -->` in README.md and docs/results.md, and
the figures in docs/results/, from the archives in results/; with --register, fill
docs/report.md's blank registration blocks (analysis/registration.py) and nothing else."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import polars as pl

from analysis.advice_table import PATH as ADVICE_TABLE, build as build_advice, text as advice_text
from analysis.answer_table import practitioner, predictions
from analysis.blocks import replace_block
from analysis.ladder import analyse_ladder, ci_text, seed_effects, summary_text
from analysis.load import load_runs
from analysis.study import Study, analyse
from analysis.threshold import ABOVE, BELOW
from qkstudy.archive import extract
from qkstudy.progress import table
from qkstudy.sweep.config import MINI
from qkstudy.sweep.ladder import SCORED_POINTS

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("mini", "mini-seeds5-9", "mini-tinystories", "mini-l2norm")
HEADER = ["study", "depth", "d_model", "steps", "warmup", "skip below (tested)", "off worse decided from",
          "onset [95% CI]", "max usable LR on/off [95% CI]", "LR-sensitivity gap, nats [95% CI]"]


def _lr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def row_cells(r: dict) -> list[str]:
    return [f"`{r['study']}`", str(r["depth"]), str(r["d_model"]), f"{r['steps']:,}", f"{r['warmup']:,}",
            _lr(r["no_difference_up_to"]), _lr(r["off_worse_from"]), r["onset"],
            ci_text(r, "usable_ratio", ".2f", "x"), ci_text(r, "sensitivity_gap", "+.2f")]


def read_range(study: Study, t: dict) -> dict:
    """The informative LRs a depth's onset is read over (as threshold.onset_columns reads them), and
    the side and bound of an onset beyond them."""
    lrs = sorted(study.gaps.filter((pl.col("compared_arm") == t["compared_arm"])
                                   & (pl.col("depth") == t["depth"]) & pl.col("informative"))
                 ["lr"].to_list()) or [None]
    top = t["trained_up_to"]
    read = [lr for lr in lrs if top is None or lr is None or lr <= top] or lrs[:1]
    side = {ABOVE: "above", BELOW: "below"}.get(t["outside"] or "", "")
    return {"read_lo": read[0], "read_hi": read[-1], "onset_side": side,
            "onset_bound": {"above": read[-1], "below": read[0]}.get(side)}


def study_rows(study: Study, name: str) -> list[dict]:
    """Per depth and compared arm of a study at the mini preset's model: the answer table's row."""
    rows = []
    for t in study.thresholds.sort("depth").iter_rows(named=True):
        arm = t["compared_arm"]
        rows.append({"study": name, "depth": t["depth"] if arm == "rmsnorm" else f"{t['depth']} ({arm})",
                     "d_model": MINI.train.d_model,
                     "steps": MINI.train.max_steps, "warmup": MINI.train.warmup_steps,
                     "no_difference_up_to": t["no_difference_up_to"],
                     "off_worse_from": t["off_worse_from"], "onset": t["onset"] or t["note"],
                     "onset_lr": t["onset_lr"], "onset_lo": t["ci_lo"], "onset_hi": t["ci_hi"],
                     **read_range(study, t), **seed_effects(study, t["depth"], arm)})
    return rows


ADVICE = {"lr": 3e-3, "warmup": 100, "steps": 2000}  # the README's example of `just advise`


def advise_example(advice: dict) -> str:
    """The README's `just advise` call and what it prints, from the published archives' table."""
    from analysis.advise import advise

    call = " ".join(f"{k}={v:g}" for k, v in ADVICE.items())
    return "\n".join([f"    $ just advise {call}", *("    " + line for line in
                                                      advise(ADVICE, advice))])


def verdict_line(study: Study) -> str:
    """Per compared arm, the three verdicts."""
    lines = []
    for (arm,), rows in study.verdicts.group_by("compared_arm", maintain_order=True):
        lines.append(f"QK-norm on ({arm}) against off: " + "; ".join(
            f"{r['hypothesis']} **{r['verdict']}**" for r in rows.iter_rows(named=True)) + ".")
    return "\n".join(lines)


def analyse_all(root: Path = ROOT) -> tuple[dict[str, Study], dict]:
    studies = {}
    with tempfile.TemporaryDirectory(prefix="qkstudy-results-") as tmp:
        for name in STUDIES:
            folder, _, _ = extract(root / "results" / f"{name}.tar.xz", Path(tmp) / name)
            studies[name] = analyse(load_runs(folder))
    return studies, analyse_ladder([root / "results" / "ladder"])


def _seeds(values: pl.Series) -> str:
    return " / ".join(f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" for v in values) or "-"


def probe_table(probes: pl.DataFrame | None) -> str:
    """Per warmup and LR, the off arm's max logit and entropy of each seed at the warmup's end and
    at a fifth of training."""
    if probes is None:
        return "No probe sweep archived yet."
    fifth = probes["step"].max()
    probes = probes.with_columns(end=pl.col("step").filter(pl.col("step") >= pl.col("warmup"))
                                 .min().over("warmup"))
    rows = []
    for (warmup, lr), t in probes.sort("warmup", "lr", "seed").group_by("warmup", "lr",
                                                                       maintain_order=True):
        end = t["end"][0]
        cells = [_seeds(t.filter((pl.col("step") == step) & (pl.col("probe") == probe))["value"])
                 for probe in ("max attention logit (off)", "attention entropy, nats (off)")
                 for step in (end, fifth)]
        rows.append([str(warmup), f"{lr:.3g}", str(end), *cells])
    return "\n".join(table(["warmup", "LR", "warmup's end (step)", "max logit at the end",
                            f"max logit at step {fifth}", "entropy at the end",
                            f"entropy at step {fifth}"], rows))


def blocks(studies: dict[str, Study], ladder: dict) -> dict[str, str]:
    """Every generated block by name."""
    mini = study_rows(studies["mini"], "mini")
    points = [{**r, "study": r["point"]} for r in ladder["points"].iter_rows(named=True)]  # type: ignore[union-attr]
    out = {"answer": "\n".join(table(HEADER, [row_cells(r) for r in mini + points])),
           "practitioner": practitioner(ladder), "predictions": predictions(ladder),
           "advise": advise_example(build_advice(studies["mini"], ladder)),
           "ladder": summary_text(ladder).strip(), "warmup-probes": probe_table(ladder["probes"])}
    for name, study in studies.items():
        out[name] = (verdict_line(study) + "\n\n"
                     + "\n".join(table(HEADER, [row_cells(r) for r in study_rows(study, name)])))
    return out


def figure(studies: dict[str, Study], ladder: dict):
    """The answer's figure (analysis/answer_figure.py)."""
    from analysis.answer_figure import answer_chart

    fit = next(f for f in ladder["fits"] if f["form"] == "straight")  # type: ignore[attr-defined]
    schedule = next((p for p in fit["predictions"] if p["point"] == SCORED_POINTS[0].name), None)
    return answer_chart(ladder["points"], study_rows(studies["mini"], "mini"), fit, schedule)  # type: ignore[arg-type]


def register_page(ladder: dict) -> int:
    """Fill docs/report.md's blank registration blocks whose content the archives now give."""
    from analysis.registration import register, registrations

    page = ROOT / "docs" / "report.md"
    text, filled = register(page.read_text(), registrations(ROOT, ladder))
    if filled:
        page.write_text(text)
    print(f"registered {', '.join(filled)} in docs/report.md" if filled
          else "nothing to register: every ready block is filled", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"], ["--register"]):
        asked = argv in (["--help"], ["-h"])
        print("usage: python -m analysis.published [--check | --register]",
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    studies, ladder = analyse_all()
    if argv == ["--register"]:
        return register_page(ladder)
    made = blocks(studies, ladder)
    pages = {ROOT / "README.md": ["practitioner", "predictions", "advise", "answer"], ROOT / "docs" / "results.md": [*STUDIES, "ladder", "warmup-probes"]}
    stale = []
    advice, table_file = advice_text(build_advice(studies["mini"], ladder)), ROOT / ADVICE_TABLE
    if not table_file.is_file() or table_file.read_text() != advice:
        stale.append(ADVICE_TABLE.name)
        if not argv:
            table_file.write_text(advice)
    for page, names in pages.items():
        new = text = page.read_text()
        for name in names:
            new = replace_block(new, name, made[name])
        if new != text:
            stale.append(page.name)
            if not argv:
                page.write_text(new)
    if not argv:
        import vl_convert as vlc

        from analysis.ladder import warmup_chart
        charts = {"answer": figure(studies, ladder)}
        if ladder["probes"] is not None:
            charts["warmup_probes"] = warmup_chart(ladder["probes"])
        for name, chart in charts.items():
            (ROOT / "docs" / "results" / f"{name}.png").write_bytes(
                vlc.vegalite_to_png(chart.to_dict(), scale=2.0))
        print(f"rewrote {', '.join(stale) or 'nothing'}; "
              + ", ".join(f"docs/results/{n}.png" for n in charts), file=sys.stderr)
        return 0
    print(f"stale: {', '.join(stale)}" if stale else "every block matches", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
