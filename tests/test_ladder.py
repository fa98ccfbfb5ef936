"""The ladder (qkstudy/sweep/ladder.py, analysis/ladder.py): each point is a plain sweep of the
pre-registered design, the ladder command refuses what it cannot run, and the warmup law, its
claims and its prediction have known answers on planted onsets."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis import stats as S
from analysis.ladder import PointResult
from analysis.law import MARGIN, design, fit_law
from analysis.study import ReportOptions
from analysis.threshold import DepthDraws, depth_draws
from analysis.threshold import tested_rule as rule_of
from qkstudy.__main__ import main
from qkstudy.sweep.config import parse_sweep_config
from qkstudy.sweep.ladder import KNOWN, LRS, POINTS, SCORED_LRS, SCORED_POINTS, SIZE_POINTS, \
    SIZE_TESTS, STUDY_POINT, WARMUP_LRS, WARMUP_POINTS, point_words

STUDY_X = design([STUDY_POINT])[0]
TRAIN_TOKENS = {"data/synthetic-bytes": 19_830_369, "data/synthetic-bytes-30m": 29_747_428}


@pytest.mark.parametrize("name", list(POINTS))
def test_each_point_is_the_plans_design(name):
    p = KNOWN[name]
    sweep = parse_sweep_config(point_words(p, [], "runs/ladder"))
    t = sweep.train
    body = p.name == "w192-d6-s1200-wu480"  # the study preset's model body
    size = p in SIZE_POINTS or p in SIZE_TESTS
    assert sweep.depth == ((6,) if body else (p.depth,) if size else (4,))
    assert t.head_dim == (64 if body else p.head_dim if size else 32)
    assert t.d_model == p.d_model and t.steps == p.steps and t.block_size == 64
    assert t.backend == "torch" and t.data == ("data/synthetic-bytes-30m" if p.steps > 20_000
                                               else "data/synthetic-bytes")
    assert t.eval_every == t.divergence_window == p.steps // 6
    assert t.independent_wd and t.weight_decay == 1e-4 and t.warmup_steps == p.warmup
    assert sweep.runs_dir == "runs/ladder" and sweep.name == name and sweep.max_seeds == 5
    # the corpus holds more tokens than a run reads
    assert t.steps * t.tokens_per_step < TRAIN_TOKENS[t.data]
    if name.startswith("probes-"):  # the warmup figure's runs: the off arm, probes every 48
        assert sweep.arms == ("none",) and not sweep.refine and t.probe_every == 48
        return
    if size:  # five seeds fixed, none added; one threshold step, no boundary bisection
        assert sweep.seeds == (0, 1, 2, 3, 4) and sweep.refine and sweep.refine_steps == 0
        assert sweep.threshold_steps == 1 and sweep.grid_lrs() == list(p.lrs)
        assert min(p.lrs) <= 0.003 and max(p.lrs) >= 0.03  # both sides of the body's 0.01
        return
    scored = p in SCORED_POINTS  # three seeds fixed, more only in cells still undecided
    assert sweep.arms == ("none", "rmsnorm") and sweep.seeds == ((0, 1, 2) if scored else
                                                                 (0, 1, 2, 3, 4))
    assert sweep.refine and sweep.refine_steps == 1 and sweep.threshold_steps == 2
    assert t.probe_every == p.steps // 6
    if scored:
        assert sweep.grid_lrs() == list(SCORED_LRS) == [0.01, 0.03, 0.1, 0.3]
        return
    # the warmup ladder's new points drop 1e-4 and 3e-4 (docs/report.md: what was trimmed)
    assert sweep.grid_lrs() == list(WARMUP_LRS if p.lrs == WARMUP_LRS else LRS)
    assert WARMUP_LRS == LRS[2:] and LRS[0] == 1e-4 and LRS[-1] == 3.0


def test_extra_words_replace_the_points_own_and_bad_ones_are_refused(capsys):
    words = point_words(KNOWN["w64-s300"], ["jobs=1", "device=cpu"], "elsewhere")
    assert "jobs=1" in words and "jobs=2" not in words and "runs_dir=elsewhere" in words
    assert main(["ladder", "points=w64-s301", "--dry-run"]) == 2
    assert "not a ladder point" in capsys.readouterr().err
    assert main(["ladder", "name=x", "--dry-run"]) == 2
    assert "set by each ladder point" in capsys.readouterr().err


def result(name: str, log_onset: float, spread: float = 0.05, seed: int = 0) -> PointResult:
    rng = np.random.default_rng(seed)
    draws = (log_onset + spread * rng.standard_normal(2000) if math.isfinite(log_onset)
             else np.full(2000, log_onset))
    onset = DepthDraws(lrs=list(LRS), point=log_onset, draws=draws, seeds=5)
    return PointResult(name=name, point=KNOWN[name], study=None, complete=True, left=0,
                       onset=onset, seeds=5)


def planted(a: float, b: float, c: float, **kw) -> list[PointResult]:
    out = []
    for i, name in enumerate(WARMUP_POINTS):
        p = KNOWN[name]
        out.append(result(name, a + b * math.log2(p.warmup / 30) + c * math.log2(p.steps / 300),
                          seed=i, **kw))
    return out


def test_the_law_recovers_planted_coefficients_and_predicts_the_study_schedule():
    law, fit = fit_law(planted(-2.0, 0.2, -0.2, spread=0.02), ReportOptions())
    terms = {r["term"]: r["estimate"] for r in law.iter_rows(named=True)}
    assert terms["a"] == pytest.approx(-2.0) and terms["b"] == pytest.approx(0.2)
    assert terms["c"] == pytest.approx(-0.2) and terms["b + c"] == pytest.approx(0.0, abs=1e-9)
    expected = -2.0 + 0.2 * math.log2(1000 / 30) - 0.2 * math.log2(24_414 / 300)
    assert STUDY_X[1] == pytest.approx(math.log2(1000 / 30))
    assert fit["log10_lr"] == pytest.approx(expected)
    assert fit["ci_lo"] < 10 ** expected < fit["ci_hi"]
    # the onset follows the warmup's share: b > 0 and b + c within the margin, not c
    assert fit["decided"] == "warmup raises it; it follows the warmup's share of the run"


def test_the_law_tells_steps_from_share_and_decides_nothing_on_noise():
    _, steps = fit_law(planted(-2.0, 0.2, 0.0, spread=0.02), ReportOptions())
    assert steps["decided"] == "warmup raises it; it follows the warmup's steps"
    _, noisy = fit_law(planted(-2.0, 0.2, 0.0, spread=0.6), ReportOptions())
    assert noisy["decided"] == "none decided"
    assert MARGIN == pytest.approx(math.log10(2) / 4)


def test_a_censored_point_is_left_out_and_named_and_too_few_points_fit_nothing():
    points = planted(-2.0, 0.2, 0.0, spread=0.02)
    points[-1] = result(points[-1].name, math.inf)
    law, fit = fit_law(points, ReportOptions())
    assert points[-1].name not in fit["points"].split(", ") and fit["exploratory"]
    assert fit["left_out"] == f"{points[-1].name} (above the LRs read)"
    assert law.filter(pl.col("term") == "b")["estimate"][0] == pytest.approx(0.2)
    short = [r for r in planted(-2, 0, 0) if KNOWN[r.name].steps == 300]
    _, none = fit_law(short, ReportOptions())
    assert none["lr"] is None and "2 warmups and 2 lengths" in none["note"]
    unfinished = planted(-2, 0, 0)
    unfinished[2].complete = False
    _, fit = fit_law(unfinished, ReportOptions())
    assert unfinished[2].name not in fit["points"].split(", ")


def cells(decisions: list[str], informative: list[bool] | None = None) -> pl.DataFrame:
    lrs = [1e-4 * 3 ** i for i in range(len(decisions))]
    return pl.DataFrame({"lr": lrs, "decision": decisions,
                         "informative": informative or [True] * len(decisions)})


@pytest.mark.parametrize("decisions, informative, a, b", [
    (["no difference", "no difference", "undetermined", "off worse", "off worse"], None, 1, 3),
    # an undecided cell inside the low run ends it; one inside the high run moves B above it
    (["no difference", "undetermined", "no difference", "off worse", "undetermined",
      "off worse"], None, 0, 5),
    # uninformative cells (every run failed) are passed over
    (["no difference", "off worse", "uninformative"], [True, True, False], 0, 1),
    (["undetermined", "off worse"], None, None, 1),
    (["no difference", "no difference"], None, 1, None),
])
def test_the_tested_rule_is_made_of_decided_cells_only(decisions, informative, a, b):
    c = cells(decisions, informative)
    rule = rule_of(c)
    lrs = c["lr"].to_list()
    assert rule["no_difference_up_to"] == (lrs[a] if a is not None else None)
    assert rule["off_worse_from"] == (lrs[b] if b is not None else None)
    if a is None:
        assert '"no difference" decided at no LR' in rule["text"]
    if b is None:
        assert "no LR from which" in rule["text"]


def test_the_rules_off_worse_range_ends_where_qk_norms_own_runs_fail():
    """An undecided cell where some QK-norm run diverged or degraded does not take
    B away; an undecided cell below it does."""
    c = cells(["no difference", "off worse", "off worse", "undetermined"]).with_columns(
        on_diverged=pl.Series([0, 0, 0, 1]), on_degraded=pl.Series([0, 0, 0, 0]))
    rule = rule_of(c)
    lrs = c["lr"].to_list()
    assert rule["off_worse_from"] == lrs[1] and rule["trained_up_to"] == lrs[2]
    assert f"to {lrs[2]:.3g}, the largest LR up to which every QK-norm run trained" in rule["text"]
    degraded = c.with_columns(on_degraded=pl.Series([0, 0, 1, 0]))
    assert rule_of(degraded)["off_worse_from"] == lrs[1]  # the trained range ends at lrs[1]
    inside = c.with_columns(decision=pl.Series(["no difference", "undetermined", "off worse",
                                                "undetermined"]))
    assert rule_of(inside)["off_worse_from"] == lrs[2]


def gaps_with(means: list[float], sd: float = 0.01, seeds: int = 5) -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.array(means)[None] + sd * rng.standard_normal((seeds, len(means)))


ONSET_LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def onset_of(values: np.ndarray, lrs: list[float], draws: np.ndarray,
             trained_up_to: float | None = None) -> DepthDraws:
    return depth_draws(values, lrs, draws, 0.1, trained_up_to=trained_up_to)


def crossing(lrs: list[float], means: np.ndarray, i: int) -> float:
    """log10 LR where the straight line in log LR from lrs[i] to lrs[i + 1] reaches 0.1."""
    t = (0.1 - means[i]) / (means[i + 1] - means[i])
    return math.log10(lrs[i]) + t * (math.log10(lrs[i + 1]) - math.log10(lrs[i]))


def test_the_onset_skips_an_under_training_gap_below_the_valley():
    """A gap of 0.3 nats at the smallest LRs (QK-norm learns faster where neither arm is
    trained) is not the instability: the onset is read from the gap's valley up, between 0.03
    (gap 0.05) and 0.1 (gap 1.0)."""
    values = gaps_with([0.35, 0.31, 0.01, 0.02, 0.03, 0.05, 1.0])
    onset = onset_of(values, ONSET_LRS, S.seed_draws(5, 500, "onset-test"))
    assert onset.point == pytest.approx(crossing(ONSET_LRS, values.mean(axis=0), 5))
    assert np.isfinite(onset.draws).all()


def test_where_the_gap_only_rises_the_onset_is_its_first_crossing():
    values = gaps_with([0.0, 0.01, 0.02, 0.04, 0.2, 0.5, 1.0], sd=0.002)
    onset = onset_of(values, ONSET_LRS, S.seed_draws(5, 500, "onset-test"))
    assert onset.point == pytest.approx(crossing(ONSET_LRS, values.mean(axis=0), 3))


def test_the_onset_is_below_the_lrs_tested_where_the_arms_never_agree():
    values = gaps_with([0.4, 0.3, 0.25, 0.3, 0.5, 0.9, 1.0])
    assert onset_of(values, ONSET_LRS, S.seed_draws(5, 200, "onset-test")).point == -math.inf


def test_the_onset_readings_valley_is_searched_only_where_qk_norm_trained():
    """At an LR where both arms failed (the gap near 0 for that reason, here
    -0.05) the valley would sit above the onset and no crossing would follow; searched up to
    the largest LR at which every QK-norm run trained, the crossing is found."""
    lrs = ONSET_LRS + [0.3]
    values = gaps_with([0.35, 0.31, 0.01, 0.02, 0.03, 0.05, 1.0, -0.05])
    draws = S.seed_draws(5, 300, "onset-test")
    blind = onset_of(values, lrs, draws)
    seen = onset_of(values, lrs, draws, trained_up_to=0.1)
    assert blind.point == math.inf
    assert math.log10(0.03) < seen.point < math.log10(0.1)


def test_the_onset_is_read_only_where_qk_norm_trained_and_draws_past_it_are_censored():
    """Above the largest LR at which every QK-norm run trained no run measures the onset: a fit
    that does not cross by then is "above" it, and each draw that does not cross is kept at that
    bound (never dropped, never placed at an LR no run trained at)."""
    from analysis.threshold import estimate_text, threshold_interval

    values = gaps_with([0.35, 0.31, 0.01, 0.02, 0.03, 0.09, 1.0], sd=0.02)
    onset = onset_of(values, ONSET_LRS, S.seed_draws(5, 500, "onset-test"), trained_up_to=0.03)
    assert onset.point == math.inf and onset.lrs == ONSET_LRS[:6]
    assert (onset.draws == math.log10(0.03)).all() and onset.bounds[1] == math.log10(0.03)
    lo, hi = threshold_interval(onset, 2.5)
    assert estimate_text(onset.point, lo, hi, onset.lrs) == "> 0.03 [> 0.03, > 0.03]"
    # a crossing near the top: the draws that miss it sit at the bound, widened ones too
    near = onset_of(gaps_with([0.01, 0.02, 0.03, 0.05, 0.08, 0.13, 1.0], sd=0.02), ONSET_LRS,
                    S.seed_draws(5, 500, "onset-test"), trained_up_to=0.03)
    assert math.isfinite(near.point) and (near.draws <= math.log10(0.03)).all()
    assert (near.draws == math.log10(0.03)).any()
    lo, hi = threshold_interval(near, 2.5)
    assert hi == math.inf and estimate_text(near.point, lo, hi, near.lrs).endswith("> 0.03]")
    # never below the smallest LR measured
    low = onset_of(gaps_with([0.05, 0.08, 0.2, 0.5, 0.9, 1.0, 1.0], sd=0.05), ONSET_LRS,
                   S.seed_draws(5, 500, "onset-test"))
    assert threshold_interval(low, 2.5)[0] >= math.log10(ONSET_LRS[0])


def test_the_law_interval_carries_its_lack_of_fit_and_the_documented_widening():
    """Points that scatter about the plane by 0.1 decades, each known to 0.02 from its seeds:
    the interval of a new point's onset is as wide as that scatter demands, and each point's
    draws are widened by t(0.975, 4) / z = 1.42 (five whole seeds)."""
    from analysis.law import law_draws, widened_draws

    pts = [KNOWN[n] for n in WARMUP_POINTS]
    rng = np.random.default_rng(3)
    y = design(pts) @ [-2.0, 0.2, 0.0] + 0.1 * rng.standard_normal(len(pts))
    draws = y + 0.02 * rng.standard_normal((2000, len(pts)))
    results = [PointResult(name=p.name, point=p, study=None, complete=True, left=0, seeds=5,
                           onset=DepthDraws(lrs=list(LRS), point=float(v), draws=d, seeds=5))
               for p, v, d in zip(pts, y, draws.T)]
    widened, k = widened_draws(results, "test")
    assert k == pytest.approx([1.42] * len(pts), abs=0.01)
    seed_var = float(widened.var(axis=0, ddof=1).mean())
    assert seed_var == pytest.approx((0.02 * 1.42) ** 2, rel=0.1)
    est, boot, lack = law_draws(design(pts), y, widened, "test")
    resid = y - design(pts) @ est
    assert lack == pytest.approx(resid @ resid / 5 - seed_var)
    points = planted(-2.0, 0.2, 0.0, spread=0.02)
    for r, v in zip(points, y):
        r.onset.point, r.onset.draws = float(v), v + r.onset.draws - r.onset.draws.mean()
    _, fit = fit_law(points, ReportOptions())
    width = math.log10(fit["ci_hi"] / fit["ci_lo"])
    assert width > 2 * 1.96 * math.sqrt(lack) and fit["lack_of_fit"] == pytest.approx(
        math.sqrt(lack), rel=0.05)
    _, bent = fit_law(points, ReportOptions(), "bent")
    assert "decided" not in bent and len(bent["predictions"]) == 3


def test_each_form_is_scored_on_the_measured_points():
    """A measured onset inside or outside each form's interval, its error in decades, and a
    measured bound judged by whether the interval reaches past it."""
    from analysis.law import score

    fits = [{"predictions": [{"form": "straight", "point": "w64-s24414-wu1000",
                              "log10_lr": math.log10(0.05), "lr": 0.05, "ci_lo": 0.025,
                              "ci_hi": 0.1}]}]
    inside = score(fits, {"w64-s24414-wu1000": {"lr": 0.06, "text": "0.06 [0.05, 0.07]",
                                                "side": ""}}).row(0, named=True)
    assert inside["inside"] == "inside" and inside["error"] == f"{math.log10(0.06 / 0.05):+.2f}"
    outside = score(fits, {"w64-s24414-wu1000": {"lr": 0.2, "text": "0.2", "side": ""}})
    assert outside["inside"][0] == "outside"
    bound = score(fits, {"w64-s24414-wu1000": {"lr": 0.3, "text": "> 0.3", "side": "above"}})
    assert bound["inside"][0] == "outside" and bound["error"][0].startswith("> +")
    assert score(fits, {}).is_empty()


def test_the_warmup_figure_reads_the_probe_sweeps_first_fifth(tiny_cfg, tmp_path):
    """The probe sweeps' runs give the off arm's max attention logit and attention entropy up
    to a fifth of the point's steps, keyed by the point's warmup, drawn as one figure."""
    from analysis.ladder import warmup_chart, warmup_probes
    from qkstudy.trainer import train

    train(tiny_cfg(sweep="probes-s4800-wu30", probe_every=5, max_steps=20))
    table = warmup_probes([tmp_path / "runs" / "probes-s4800-wu30"])
    assert set(table["probe"]) == {"max attention logit (off)", "attention entropy, nats (off)"}
    assert set(table["warmup"]) == {30} and table["step"].max() <= 4800 // 5
    assert table.filter(pl.col("step") == 20).height == 2  # each probe at the last step
    spec = warmup_chart(table).to_dict()
    assert [row["facet"]["column"]["field"] for row in spec["vconcat"]] == ["lr", "lr"]
    assert {v["probe"] for v in spec["vconcat"][0]["data"]["values"]} == {
        "max attention logit (off)"}


def test_the_warmup_figure_has_a_log_logit_axis_numeric_legend_and_the_warmups_end():
    """The logits on a log axis, the entropy on a linear one, the warmups in numeric order
    (30 before 480 before 1,920, not as text) and a rule where each warmup ends."""
    from analysis.ladder import PROBED, warmup_chart

    rows = [{"warmup": w, "lr": lr, "seed": 0, "step": step, "probe": probe,
             "value": 1.0 + step * lr * (1000 if "logit" in probe else 0.001)}
            for w in (1920, 30, 480) for lr in (0.1, 0.03) for step in (0, 48, 96)
            for probe in PROBED.values()]
    spec = warmup_chart(pl.DataFrame(rows)).to_dict()
    logit, entropy = spec["vconcat"]
    lines, rules = logit["spec"]["layer"]
    assert lines["encoding"]["y"]["scale"]["type"] == "log"
    assert "type" not in entropy["spec"]["layer"][0]["encoding"]["y"].get("scale", {})
    assert lines["encoding"]["color"]["scale"]["domain"] == [30, 480, 1920]
    assert logit["facet"]["column"]["sort"] == ["LR 0.03", "LR 0.1"]
    ends = [r for r in logit["data"]["values"] if r["kind"] == "end"]
    assert rules["mark"]["type"] == "rule" and {(r["step"], r["warmup"]) for r in ends} == {
        (30, 30), (480, 480), (1920, 1920)}


def test_the_law_band_is_predicts_interval_of_a_new_five_seed_point():
    """The figure's law band (tests/test_published.py draws it): at the study schedule the
    study preset's prediction (five seeds), and narrower than the three-seed scored point's."""
    from analysis.law import law_band

    _, fit = fit_law(planted(-2.0, 0.2, 0.0, spread=0.02), ReportOptions())
    scored = next(p for p in fit["predictions"] if p["point"] == "study-point")
    three = next(p for p in fit["predictions"] if p["point"] == "w64-s24414-wu1000")
    at, = law_band(fit, 24_414, [1000])
    assert three["ci_hi"] / three["ci_lo"] > 1.2 * at["ci_hi"] / at["ci_lo"]
    assert at["log10_lr"] == pytest.approx(scored["log10_lr"])
    assert math.log10(at["ci_hi"] / at["ci_lo"]) == pytest.approx(
        math.log10(scored["ci_hi"] / scored["ci_lo"]), rel=0.1)
