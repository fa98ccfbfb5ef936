"""The published answer comes from the published archives: rebuilding the README's answer table
and docs/results.md's generated blocks from results/ gives the text the pages show, so every
published number can be traced and recomputed."""

from __future__ import annotations

import math
import re
from operator import itemgetter
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]


def block(page: Path, name: str) -> str:
    match = re.search(rf"<!-- {re.escape(name)}: [^>]*-->\n(.*?)\n<!-- end {re.escape(name)} -->",
                      page.read_text(), re.S)
    assert match, f"{page.name} has no generated {name} block"
    return match.group(1)


@pytest.fixture(scope="module")
def analysed() -> tuple:
    from analysis import published as rt

    return rt.analyse_all(ROOT)


@pytest.fixture(scope="module")
def made(analysed) -> dict[str, str]:
    from analysis import published as rt

    return rt.blocks(*analysed)


@pytest.mark.parametrize("name", ["practitioner", "predictions", "advise", "answer"])
def test_the_readmes_answer_tables_are_rebuilt_from_the_archives(made, name):
    assert block(ROOT / "README.md", name) == made[name]


@pytest.mark.parametrize("name", ["mini", "mini-seeds5-9", "mini-tinystories", "mini-l2norm",
                                  "ladder", "warmup-probes"])
def test_each_studys_block_in_results_md_is_rebuilt_from_its_archive(made, name):
    assert block(ROOT / "docs" / "results.md", name) == made[name]


DESIGN = {"0.1", "2", "8", "30", "64", "120", "256", "300", "480", "1,000", "1,920", "4,800", "24,414",
          "12M", "100M"}  # the conditions and the margin, set by the design
NUMBER = r"(?<![\w./])[+-]?\d(?:[\d,]*\d)?(?:\.\d+)?M?"


def ladder_settings() -> dict:
    """The training settings every archived ladder point ran with (one value each), and the
    seeds of a condition and of the two scored points."""
    from qkstudy.sweep.config import parse_sweep_config, run_config
    from qkstudy.sweep.ladder import POINTS, SCORED_POINTS, point_words

    keys = ("block_size", "batch_size", "beta1", "beta2", "weight_decay", "independent_wd",
            "grad_clip", "min_lr_ratio")
    seen: dict[str, set] = {k: set() for k in keys}
    for p in POINTS.values():
        words = parse_sweep_config(point_words(p, [], "runs/ladder"))
        cfg = run_config(words, p.depth, words.train.lr, "rmsnorm", 0)
        for k in keys:
            seen[k].add(getattr(cfg, k))
    assert all(len(v) == 1 for v in seen.values()), seen  # else one sentence cannot say them
    out = {k: v.pop() for k, v in seen.items()}
    scored = {len(p.seeds) for p in SCORED_POINTS}
    assert len(scored) == 1
    return out | {"seeds": len(next(iter(POINTS.values())).seeds), "scored_seeds": scored.pop()}


def answer_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## The answer at laptop scale"):text.index("Tables, figures and what")]


def test_the_answers_header_states_the_settings_the_ladder_ran_with():
    """Context, batch, optimiser, decay, clipping, schedule and seeds, as the code sets them."""
    s = ladder_settings()
    header = " ".join(answer_section().split("<!-- practitioner")[0].split())
    assert s["independent_wd"] and "synthetic corpus" in header
    for phrase in (f"block {s['block_size']}", f"batch {s['batch_size']}",
                   f"({s['block_size'] * s['batch_size']:,} tokens a step)",
                   f"AdamW with betas ({s['beta1']:g}, {s['beta2']:g})",
                   f"independent weight decay {s['weight_decay']:.0e}".replace("e-0", "e-"),
                   f"gradient clipping at {s['grad_clip']:g}",
                   f"linear warmup then a cosine to {s['min_lr_ratio']:g} of the peak LR",
                   f"{s['seeds']} seeds a condition ({s['scored_seeds']} at the two points"):
        assert phrase in header, phrase


def test_every_number_in_the_readmes_answer_comes_from_a_generated_table(made):
    """The sentences around the answer's tables cite their numbers (or the ladder block's law,
    the warmup probes' table or the settings the ladder ran with) as the archives and the code
    give them, so none can go stale unseen."""
    answer = re.sub(r"<!-- (\S+): .*?<!-- end \1 -->", "", answer_section(), flags=re.S)
    answer = re.sub(r"et al\. \(\d{4}\)", "", answer)  # a citation
    tables = (made["practitioner"] + made["predictions"] + made["answer"] + made["ladder"]
              + made["warmup-probes"])
    s = ladder_settings()
    settings = {str(s["block_size"]), str(s["batch_size"]), f"{s['block_size'] * s['batch_size']:,}",
                f"{s['beta1']:g}", f"{s['beta2']:g}", f"{s['grad_clip']:g}", str(s["seeds"]),
                str(s["scored_seeds"]), "1", "4"}  # 1e-4 reads as 1 and 4
    stray = [n for n in re.findall(NUMBER, answer)
             if n.lstrip("+-") not in DESIGN | settings and n not in tables]
    assert not stray, f"numbers in the README's answer that no generated table holds: {stray}"


def rule_and_table(block: str) -> tuple[str, str]:
    table, _, rule = block.partition("\n\n")
    return rule, table


def test_the_rule_cites_only_its_tables_numbers(made):
    """The rule under the measured table: three sentences, size first, then warmup, then what
    it does not show, every number as the table above it gives it."""
    rule, table = rule_and_table(made["practitioner"])
    lead = "**The rule, read off the table.** "
    sentences = rule.removeprefix(lead).split(". ")
    assert rule.startswith(lead) and len(sentences) == 3 and rule.endswith(".")
    assert [s.split(":")[0] for s in sentences[:2]] == ["Model size first", "Then warmup"]
    assert sentences[2].startswith("It shows ")
    stray = [n for n in re.findall(NUMBER, rule) if n not in table]
    assert not stray, f"numbers in the rule that the table does not hold: {stray}"


def test_the_answer_figure_is_drawn_from_the_archives(analysed, made):
    """docs/results/answer.png's spec: one colour per model body in order of size; the study
    body's onset below the LRs run drawn as a lone, labelled arrow in the warmup panel, without
    an interval bar, and in the size panel unless a point of the same body and schedule read
    its onset; every point read drawn; the straight law's band, and its
    prediction at the study schedule as the predictions table gives it."""
    from analysis import published as rt
    from analysis.answer_table import by_schedule, rows_of

    studies, ladder = analysed
    spec = rt.figure(studies, ladder).to_dict()
    panels = [{lay["name"].rsplit("_", 1)[0]: lay["data"]["values"] for lay in p["layer"]}
              for p in spec["hconcat"]]
    size, warmup = panels[0], panels[1]
    rows = rows_of(ladder["points"])
    censored = {r["point"]: r for r in rows if r["onset_lr"] is None and r["onset_side"]}
    assert censored, "the study body's onset lies below the LRs it ran"
    for name, r in censored.items():
        lone = [a for a in warmup["arrows"] if a["name"] == name]
        assert [a["label"] for a in lone] == [f"< {r['read_lo']:.3g}"]
        assert not [i for i in warmup["intervals"] if i["name"] == name]
    shown = {r["point"] for _, group in by_schedule(rows) for r in group}
    assert {a["name"] for a in size["arrows"]} >= set(censored) & shown
    key = itemgetter("body", "warmup", "steps")
    for name in set(censored) - shown:
        read = [r["point"] for r in rows if r["point"] in shown and key(r) == key(censored[name])]
        assert read and read[0] in {o["name"] for o in size["onsets"]}, name
    assert {o["name"] for o in warmup["onsets"]} == {r["point"] for r in rows
                                                      if r["onset_lr"] is not None}
    domain = spec["hconcat"][0]["layer"][2]["encoding"]["color"]["scale"]["domain"]
    assert domain[:2] == ["64/2/32", "64/4/32"] and "192/6/64" in domain
    assert warmup["law-band"] and all(b["lo"] < b["y"] < b["hi"] for b in warmup["law-band"])
    guess, = warmup["prediction"]
    assert f"| {guess['text']} |" in made["predictions"]


SCORED = {"The first scored point": "w192-d6-s1200-wu480",
          "The second scored point": "w64-s24414-wu1000"}


def test_the_scored_points_paragraphs_cite_their_archives(made, tmp_path):
    """Each number in the paragraphs that score the new points is the ladder block's or the
    plan's registered prediction, or a
    seed-mean gap, its interval or a seed's gap as the point's archive gives them (the
    pre-registered seeds, or with the added ones), or a condition of the design."""
    from analysis.load import load_runs
    from analysis.study import analyse
    from qkstudy.archive import extract

    text = (ROOT / "docs" / "results.md").read_text()
    for title, point in SCORED.items():
        study = analyse(load_runs(extract(ROOT / "results" / "ladder" / f"{point}.tar.xz",
                                          tmp_path / point)[0]))
        plan = (ROOT / "docs" / "report.md").read_text()
        registered = plan[plan.index("**The scored points**"):plan.index("**Scoring**")]
        cited = [made["ladder"], registered, "44e502f 5-seed 0-2 3 4",  # commit, seeds named
                 " ".join(f"{lr:.3g}" for lr in study.points["lr"].unique())]
        for r in pl.concat([study.gaps, study.exploratory_gaps]).iter_rows(named=True):
            cited += [f"{r[k]:.3g} {r[k]:.3f}" for k in ("mean_gap", "ci_lo", "ci_hi")]
            cited.append(r["seed_gaps"])
        start = text.index(f"**{title}")
        paragraph = text[start:text.index("\n\n", start)]
        numbers = re.findall(r"(?<![\w./])[+-]?\d(?:[\d,]*\d)?(?:\.\d+)?M?(?![\w])", paragraph)
        stray = [n for n in numbers if n.lstrip("+-") not in DESIGN
                 and not any(n.lstrip("+") in c for c in cited)]
        assert not stray, f"{title}: numbers no table or archive holds: {stray}"


def test_the_advice_table_is_the_archives_and_its_prediction_the_laws(analysed):
    """results/advice.json, which `just advise` reads, is what the archives give; its law
    prediction equals law.predict's at schedules inside and between the measured ones."""
    from analysis import advice_table as T
    from analysis.advise import predict
    from analysis.law import predict as law_predict
    from qkstudy.sweep.ladder import Point

    studies, ladder = analysed
    table = T.build(studies["mini"], ladder)
    assert (ROOT / T.PATH).read_text() == T.text(table)
    fit = next(f for f in ladder["fits"] if f["form"] == "straight")
    for warmup, steps in ((100, 2000), (1000, 24414), (30, 300)):
        mine = predict(T.read(ROOT / T.PATH), {"warmup": warmup, "steps": steps})
        theirs = law_predict(fit, Point(f"w64-s{steps}-wu{warmup}", 64, steps, warmup))
        for k in ("lr", "ci_lo", "ci_hi"):
            assert mine[k] == pytest.approx(theirs[k], rel=2e-3)


def test_the_early_warnings_level_is_the_one_its_archived_points_give(analysed):
    """L (docs/report.md: 157, log10 2.195) refitted from the points it was fixed on."""
    from analysis.early_warning import LEVEL

    assert round(analysed[1]["size"]["level"], 3) == LEVEL


# --- the answer's table, rule and figure on planted ladders ---------------------------------

def planted(name: str, onset: float | None, side: str = "", gap: float = 0.02, seeds: int = 5
            ) -> dict:
    """A ladder point's row as analysis/ladder.py writes it: an onset read (interval a factor
    1.3 either side) or, with side, one beyond the LRs run; each arm's best LR 0.01."""
    from qkstudy.sweep.ladder import KNOWN

    p = KNOWN[name]
    lo, hi = min(p.lrs), max(p.lrs)
    bound = {"below": lo, "above": hi}.get(side)
    mark = {"below": "<", "above": ">"}.get(side, "")
    text = (f"{mark} {bound:.3g} [{mark} {bound:.3g}, {mark} {bound:.3g}]" if side else
            f"{onset:.3g} [{onset / 1.3:.3g}, {onset * 1.3:.3g}]")
    return {"point": name, "d_model": p.d_model, "depth": p.depth, "steps": p.steps,
            "warmup": p.warmup, "seeds": seeds, "no_difference_up_to": lo if onset else None,
            "off_worse_from": None, "onset_lr": None if side else onset,
            "onset_lo": None if side else onset / 1.3, "onset_hi": None if side else onset * 1.3,
            "onset_side": side, "onset_bound": bound, "onset": text, "read_lo": lo,
            "read_hi": hi, "best_lr_off": 0.01, "best_lr_on": 0.01, "best_lr_off_text": "0.01",
            "best_lr_on_text": "0.01", "best_gap": gap,
            "best_gap_lo": gap - 0.03, "best_gap_hi": gap + 0.03}


BASE_ROWS = [("w64-s300", 0.0068), ("w64-s1200-wu30", 0.0064), ("w64-s1200-wu480", 0.044),
             ("w64-s4800-wu1920", 0.063)]
SIZE_ROWS = [("w128-s1200-wu480", 0.03), ("w192-s1200-wu480", 0.02),
             ("w192-d6-hd32-s1200-wu480", 0.012), ("w192-d6-hd64-s1200-wu480", 0.007)]


def planted_ladder(rows: list[dict], measured: dict[str, dict] | None = None) -> dict:
    """The parts of analyse_ladder's output the answer reads: the points, the straight law's
    predictions at its scored points, and the size law's at its test points (scored where
    `measured` names them)."""
    from analysis.law import score
    from qkstudy.sweep.ladder import SIZE_TESTS

    def guess(form: str, point: str, lr: float) -> dict:
        return {"form": form, "point": point, "log10_lr": math.log10(lr), "lr": lr,
                "ci_lo": lr / 2, "ci_hi": lr * 2}
    law = {"form": "straight", "lr": 0.05, "points": "w64-s300", "draws": None, "predictions": [
        guess("straight", "w64-s24414-wu1000", 0.05), guess("straight", "study-point", 0.05)]}
    size = {"form": "power", "target": "onset", "lr": True, "points": "w64-s300, w128-s300",
            "predictions": [guess("power (onset)", p.name, 0.02) for p in SIZE_TESTS]}
    return {"points": pl.DataFrame(rows, infer_schema_length=None), "fits": [law],
            "scores": score([law], {}), "size": {"fits": [size],
                                                 "scores": score([size], measured or {})}}


def test_the_answer_before_the_size_ladder_lands():
    """Only the ladder's model body archived: its rows, a rule that says no two bodies share
    a schedule, the predictions not yet run, and a figure with an empty size panel."""
    from analysis import answer_table as T
    from analysis.answer_figure import answer_chart

    ladder = planted_ladder([planted(n, v) for n, v in BASE_ROWS])
    made = T.practitioner(ladder)
    rule, table = rule_and_table(made)
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| 64/4/32"] * 4
    assert "no two model bodies were measured at one schedule" in rule
    assert "Then warmup: for 64/4/32 a longer warmup raised it, from 0.0064-0.0068 at 30" in rule
    assert not [n for n in re.findall(NUMBER, rule) if n not in table]
    assert T.predictions(ladder).count("not run yet") == 3  # the scored and the test points
    spec = answer_chart(ladder["points"], [], ladder["fits"][0], None).to_dict()
    assert not spec["hconcat"][0]["layer"][0]["data"]["values"]  # the size panel


def test_the_answer_when_the_size_ladder_lands():
    """The size ladder's points join their bodies' rows in order of size; the rule lists every
    body measured at 480 warmup steps of 1,200, a read onset before a bound for one body, and
    cites only the table; a censored test point is a lone arrow; a scored one is scored."""
    from analysis import answer_table as T
    from analysis.answer_figure import answer_chart

    rows = ([planted(n, v) for n, v in BASE_ROWS + SIZE_ROWS]
            + [planted("w192-d6-s1200-wu480", None, "below", gap=0.29, seeds=3),
               planted("w256-d6-hd64-s1200-wu480", None, "below", gap=0.4),
               planted("w192-d6-hd64-s4800-wu1000", 0.015)])
    ladder = planted_ladder(rows, {
        "w192-d6-hd64-s4800-wu1000": {"lr": 0.015, "side": "", "text": "0.015 [0.0115, 0.0195]"},
        "w256-d6-hd64-s1200-wu480": {"lr": 0.001, "side": "below", "text": "< 0.001 [...]"}})
    rule, table = rule_and_table(T.practitioner(ladder))
    bodies = [line.split(" | ")[0].strip("| ") for line in table.splitlines()[2:]]
    assert bodies == ["64/4/32"] * 4 + ["128/4/32", "192/4/32", "192/6/32"] + [
        "192/6/64 (the study preset's)"] * 3 + ["256/6/64"]
    assert ("at 480 warmup steps of 1,200 the onset was 0.044 for 64/4/32 (0.20M parameters "
            "outside the embeddings), 0.03 for 128/4/32 (0.79M), 0.02 for 192/4/32 (1.77M), "
            "0.012 for 192/6/32 (2.66M), 0.007 for 192/6/64 (2.66M) and < 0.001 for 256/6/64 "
            "(4.72M), where skipping QK-norm cost +0.400 [+0.370, +0.430] nats") in rule
    assert "warmups other than 480 and 1,000" in rule
    assert not [n for n in re.findall(NUMBER, rule) if n not in table]
    predicted = T.predictions(ladder).splitlines()
    assert predicted[-1].endswith("| 0.015: inside the interval |")
    assert predicted[-2].endswith("| < 0.001: outside the interval |")
    assert predicted[2].endswith("| not run yet |")  # the warmup law's scored point
    spec = answer_chart(ladder["points"], [], ladder["fits"][0], None).to_dict()
    size = {lay["name"].rsplit("_", 1)[0]: lay["data"]["values"]
            for lay in spec["hconcat"][0]["layer"]}
    assert {r["name"] for r in size["onsets"]} >= {n for n, _ in SIZE_ROWS}
    lone = [a for a in size["arrows"] if a["name"] == "w256-d6-hd64-s1200-wu480"]
    assert [(a["dir"], a["label"]) for a in lone] == [("down", "< 0.001")]
    assert "w256-d6-hd64-s1200-wu480" not in {i["name"] for i in size["intervals"]}


def test_each_registration_in_the_plan_is_what_the_committed_archives_give(analysed):
    """A filled registration block of docs/report.md equals what the archives give; a blank one
    is not ready yet (a registration is committed with the archive that makes it ready)."""
    from analysis.blocks import block_text
    from analysis.registration import BLANK, registrations

    from analysis.registration import size_points_done, registered_grids
    from qkstudy.sweep.ladder import SIZE_TESTS

    page = (ROOT / "docs" / "report.md").read_text()
    for name, content in registrations(ROOT, analysed[1]).items():
        assert block_text(page, name) == (BLANK if content is None else content), name
    if size_points_done(analysed[1]):  # the test points run on the registered grids
        assert {p.name: p.lrs for p in SIZE_TESTS} == registered_grids(analysed[1])


def test_registering_fills_each_ready_blank_block_and_never_rewrites_one():
    from analysis.registration import BLANK, register

    def page(**blocks):
        return "\n".join(f"<!-- {k}: generated -->\n{v}\n<!-- end {k} -->" for k, v in blocks.items())

    text, filled = register(page(a=BLANK, b="registered before", c=BLANK),
                            {"a": "now ready", "b": "recomputed otherwise", "c": None})
    assert filled == ["a"]
    assert text == page(a="now ready", b="registered before", c=BLANK)
    with pytest.raises(SystemExit, match="no generated block 'd'"):
        register(text, {"d": "ready"})


def test_a_test_grid_gains_an_lr_below_only_where_the_bodys_best_lr_needs_it():
    from analysis.registration import half_decade_below, registered_grid

    assert (half_decade_below(0.003), half_decade_below(0.01)) == (0.001, 0.003)
    s4800 = "w192-d6-hd64-s4800-wu1000"

    def preds(*ends):
        return [{"point": s4800, "form": f"{f} (onset)", "ci_hi": e}
                for f, e in zip(("power", "ceiling"), ends)] + [
            {"point": s4800, "form": "power (ratio)", "ci_hi": 1e-6}]

    assert registered_grid(s4800, preds(0.07, 0.012), 0.003) == (0.001, 0.003, 0.01, 0.03)
    assert registered_grid(s4800, preds(0.07, 0.012), 0.01) == (0.003, 0.01, 0.03)
    assert registered_grid(s4800, preds(0.008, 0.009), 0.01) == (0.003, 0.01)  # top LR dropped
    assert registered_grid(s4800, preds(0.008, 0.011), 0.01) == (0.003, 0.01, 0.03)
