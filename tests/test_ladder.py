"""The ladder (qkstudy/sweep/ladder.py, analysis/ladder.py): each point is a plain sweep of the
pre-registered design, the ladder command refuses what it cannot run, and the transfer law, its
claims and its prediction have known answers on planted thresholds."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis.ladder import STUDY_X, PointResult, fit_law, warmup_contrast
from analysis.study import ReportOptions
from analysis import stats as S
from analysis.threshold import DepthDraws, depth_draws
from analysis.threshold import tested_rule as rule_of
from qkstudy.__main__ import main
from qkstudy.sweep.config import parse_sweep_config
from qkstudy.sweep.ladder import KNOWN, LAW_POINTS, LRS, POINTS, point_words


@pytest.mark.parametrize("name", list(POINTS))
def test_each_point_is_the_plans_design(name):
    p = KNOWN[name]
    sweep = parse_sweep_config(point_words(p, [], "runs/ladder"))
    t = sweep.train
    assert sweep.depth == (4,) and t.head_dim == 32 and t.steps == p.steps
    assert sweep.grid_lrs() == list(LRS) and LRS[0] == 1e-4 and LRS[-1] == 3.0
    assert sweep.seeds == (0, 1, 2, 3, 4) and sweep.max_seeds == 5  # no adaptive seeds
    assert sweep.refine and sweep.refine_steps == 1 and sweep.threshold_steps == 2
    assert t.backend == "torch" and t.data == "data/synthetic-bytes"
    assert t.eval_every == t.probe_every == t.divergence_window == p.steps // 6
    assert t.independent_wd and t.weight_decay == 1e-4
    assert sweep.runs_dir == "runs/ladder" and sweep.name == name
    # the corpus holds enough tokens that no point reads one twice (19.8M training tokens)
    assert t.steps * t.tokens_per_step < 19_800_000
    assert t.warmup_steps == (30 if name.endswith("wu30") else p.steps // 10)


def test_extra_words_replace_the_points_own_and_bad_ones_are_refused(capsys):
    words = point_words(KNOWN["w64-s300"], ["jobs=1", "device=cpu"], "elsewhere")
    assert "jobs=1" in words and "jobs=2" not in words and "runs_dir=elsewhere" in words
    assert main(["ladder", "points=w64-s301", "--dry-run"]) == 2
    assert "not a ladder point" in capsys.readouterr().err
    assert main(["ladder", "name=x", "--dry-run"]) == 2
    assert "set by each ladder point" in capsys.readouterr().err


def result(name: str, log_t: float, spread: float = 0.05, seed: int = 0) -> PointResult:
    rng = np.random.default_rng(seed)
    draws = log_t + spread * rng.standard_normal(2000) if math.isfinite(log_t) else \
        np.full(2000, log_t)
    return PointResult(name=name, point=KNOWN[name], study=None, complete=True, left=0,  # type: ignore[arg-type]
                       log_threshold=log_t, draws=draws, seeds=5)


def planted(a: float, b: float, c: float, **kw) -> list[PointResult]:
    out = []
    for i, name in enumerate(LAW_POINTS):
        p = KNOWN[name]
        out.append(result(name, a + b * math.log2(p.d_model / 64) + c * math.log2(p.steps / 300),
                          seed=i, **kw))
    return out


def test_the_law_recovers_planted_coefficients_and_predicts_the_study_point():
    law, prediction = fit_law(planted(-2.0, -0.5, -0.3), ReportOptions())
    terms = {r["term"]: r for r in law.iter_rows(named=True)}
    assert terms["a"]["estimate"] == pytest.approx(-2.0)
    assert terms["b"]["estimate"] == pytest.approx(-0.5)
    assert terms["c"]["estimate"] == pytest.approx(-0.3)
    assert terms["b"]["decision"] == "falls" and terms["c"]["decision"] == "falls"
    expected = -2.0 - 0.5 * math.log2(192 / 64) - 0.3 * math.log2(24_414 / 300)
    assert prediction["log10_lr"] == pytest.approx(expected)
    assert STUDY_X[1] == pytest.approx(math.log2(3))
    assert prediction["ci_lo"] < 10 ** expected < prediction["ci_hi"]


def test_a_flat_law_is_never_read_as_a_fall_and_is_equal_when_precise():
    law, _ = fit_law(planted(-2.0, 0.0, 0.0, spread=0.02), ReportOptions())
    decisions = dict(zip(law["term"], law["decision"]))
    assert decisions["b"] == "equal" and decisions["c"] == "equal"
    noisy, _ = fit_law(planted(-2.0, 0.0, 0.0, spread=0.5), ReportOptions())
    assert set(noisy.filter(pl.col("term") != "a")["decision"]) <= {"undetermined"}


def test_the_law_is_not_fitted_without_both_axes_or_with_a_censored_point():
    widths_only = [r for r in planted(-2, 0, 0) if KNOWN[r.name].steps == 300]
    law, prediction = fit_law(widths_only, ReportOptions())
    assert prediction["lr"] is None and "two widths and two lengths" in prediction["note"]
    censored = planted(-2, 0, 0)
    censored[1] = result(censored[1].name, math.inf)
    _, prediction = fit_law(censored, ReportOptions())
    assert prediction["lr"] is None and "censored at w128-s300" in prediction["note"]
    unfinished = planted(-2, 0, 0)
    unfinished[2].complete = False
    _, prediction = fit_law(unfinished, ReportOptions())
    assert "w64-s1200" not in prediction["points"]


def test_the_warmup_contrast_reads_a_planted_difference():
    long, short = result("w64-s4800", -2.0, seed=1), result("w64-s4800-wu30", -2.6, seed=2)
    row = warmup_contrast({"w64-s4800": long, "w64-s4800-wu30": short}, ReportOptions())
    assert row["log10_ratio"] == pytest.approx(0.6) and row["decision"] == "longer warmup raises it"
    same = warmup_contrast({"w64-s4800": long, "w64-s4800-wu30": result("w64-s4800-wu30", -2.0,
                                                                        spread=0.02, seed=3)},
                           ReportOptions())
    assert same["decision"] == "no effect"


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
        assert "no LR decided" in rule["text"]
    if b is None:
        assert "no LR from which" in rule["text"]


def test_the_rules_off_worse_range_ends_where_qk_norms_own_runs_fail():
    """Amendment 9: an undecided cell where some QK-norm run diverged or degraded does not take
    B away; an undecided cell below it does."""
    c = cells(["no difference", "off worse", "off worse", "undetermined"]).with_columns(
        on_diverged=pl.Series([0, 0, 0, 1]), on_degraded=pl.Series([0, 0, 0, 0]))
    rule = rule_of(c)
    lrs = c["lr"].to_list()
    assert rule["off_worse_from"] == lrs[1] and rule["trained_up_to"] == lrs[2]
    assert f"up to {lrs[2]:.3g}, the largest at which every QK-norm run trained" in rule["text"]
    degraded = c.with_columns(on_degraded=pl.Series([0, 0, 1, 0]))
    assert rule_of(degraded)["off_worse_from"] == lrs[1]  # the trained range ends at lrs[1]
    inside = c.with_columns(decision=pl.Series(["no difference", "undetermined", "off worse",
                                                "undetermined"]))
    assert rule_of(inside)["off_worse_from"] == lrs[2]


def test_the_chart_draws_a_censored_point_at_the_grids_edge_and_no_law_when_unfitted():
    """The law is "not estimable" when a point is censored (the plan): the chart then shows
    each point, the censored one at the grid's edge on its side, and no fitted line."""
    from analysis.ladder import chart
    from qkstudy.sweep.ladder import LRS

    censored = planted(-2, 0, 0)
    censored[-1] = result(censored[-1].name, -math.inf)
    law, prediction = fit_law(censored, ReportOptions())
    rows = []
    for r in censored:
        p = KNOWN[r.name]
        finite = math.isfinite(r.log_threshold)
        rows.append({"d_model": p.d_model, "steps": p.steps, "warmup": p.warmup,
                     "complete": True, "threshold_lr": 10 ** r.log_threshold if finite else None,
                     "censored": None if finite else "below",
                     "ci_lo": None, "ci_hi": None if not finite else 0.02})
    spec = chart(pl.DataFrame(rows), prediction, law).to_dict()
    values = spec["data"]["values"]
    kinds = [v["kind"] for v in values]
    assert "fitted law" not in kinds and "predicted (study point)" not in kinds
    edge = [v for v in values if v["kind"] == "censored (below the grid)"]
    assert len(edge) == 1 and edge[0]["lr"] == min(LRS) and edge[0]["x"] == 4800
    assert edge[0]["hi"] == min(LRS)  # its upper bound is below the grid, not the axis's top


def gaps_with(means: list[float], sd: float = 0.01, seeds: int = 5) -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.array(means)[None] + sd * rng.standard_normal((seeds, len(means)))


ONSET_LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def test_the_onset_reading_skips_an_under_training_gap_below_the_valley():
    """Amendment 11: a gap of 0.3 nats at the smallest LRs (QK-norm learns faster where neither
    arm is trained) censors the plan's threshold below the grid; the onset reading fits from the
    valley up and finds the crossing between 0.03 (gap 0.05) and 0.1 (gap 1.0)."""
    values = gaps_with([0.35, 0.31, 0.01, 0.02, 0.03, 0.05, 1.0])
    draws = S.seed_draws(5, 500, "onset-test")
    plan = depth_draws(values, ONSET_LRS, draws, 0.1)
    onset = depth_draws(values, ONSET_LRS, draws, 0.1, reading="onset")
    assert plan.point == -math.inf and np.isneginf(plan.draws).all()
    assert math.log10(0.03) < onset.point < math.log10(0.1)
    means = values.mean(axis=0)
    t = (0.1 - means[5]) / (means[6] - means[5])  # the plan's straight line, above the valley
    assert onset.point == pytest.approx(math.log10(0.03) + t * (math.log10(0.1) - math.log10(0.03)))
    assert np.isfinite(onset.draws).all()


def test_the_onset_reading_is_the_plans_where_the_gap_only_rises():
    values = gaps_with([0.0, 0.01, 0.02, 0.04, 0.2, 0.5, 1.0], sd=0.002)
    draws = S.seed_draws(5, 500, "onset-test")
    plan = depth_draws(values, ONSET_LRS, draws, 0.1)
    onset = depth_draws(values, ONSET_LRS, draws, 0.1, reading="onset")
    assert onset.point == pytest.approx(plan.point)
    assert np.allclose(onset.draws, plan.draws)


def test_the_onset_reading_is_censored_below_where_the_arms_never_agree():
    values = gaps_with([0.4, 0.3, 0.25, 0.3, 0.5, 0.9, 1.0])
    onset = depth_draws(values, ONSET_LRS, S.seed_draws(5, 200, "onset-test"), 0.1,
                        reading="onset")
    assert onset.point == -math.inf
    with pytest.raises(ValueError, match="reading"):
        depth_draws(values, ONSET_LRS, S.seed_draws(5, 200, "onset-test"), 0.1, reading="x")


def test_the_onset_law_is_fitted_where_the_plans_is_censored():
    """The law on amendment 11's reading: a point censored under the plan but not under the
    onset reading leaves the plan's law unfitted and the onset's fitted."""
    points = planted(-2.0, 0.0, 0.2, spread=0.02)
    for r in points:
        r.onset = DepthDraws(lrs=ONSET_LRS, point=r.log_threshold, draws=r.draws,
                             fit=np.zeros(len(ONSET_LRS)), seeds=5)
    points[-1].log_threshold, points[-1].draws = -math.inf, np.full(2000, -math.inf)
    _, plan = fit_law(points, ReportOptions())
    law, onset = fit_law(points, ReportOptions(), reading="onset")
    assert plan["lr"] is None and "censored at w64-s4800" in plan["note"]
    terms = {r["term"]: r for r in law.iter_rows(named=True)}
    assert terms["c"]["estimate"] == pytest.approx(0.2) and terms["c"]["decision"] == "rises"
    assert onset["log10_lr"] == pytest.approx(-2.0 + 0.2 * math.log2(24_414 / 300))


def test_the_onset_readings_valley_is_searched_only_where_qk_norm_trained():
    """Amendment 11a: at an LR where both arms failed (the gap near 0 for that reason, here
    -0.05) the valley would sit above the onset and no crossing would follow; searched up to
    the largest LR at which every QK-norm run trained, the crossing is found."""
    lrs = ONSET_LRS + [0.3]
    values = gaps_with([0.35, 0.31, 0.01, 0.02, 0.03, 0.05, 1.0, -0.05])
    draws = S.seed_draws(5, 300, "onset-test")
    blind = depth_draws(values, lrs, draws, 0.1, reading="onset")
    seen = depth_draws(values, lrs, draws, 0.1, reading="onset", trained_up_to=0.1)
    assert blind.point == math.inf
    assert math.log10(0.03) < seen.point < math.log10(0.1)


def test_the_study_points_measurement_is_set_against_the_prediction():
    """Item 4 of the ladder: once the GPU's study point is run, the ladder's summary says whether
    its measured threshold (and onset) falls inside the law's prediction interval."""
    from analysis.ladder import prediction_check

    row = {"point": "study-point", "runs": 110, "complete": True, "threshold_lr": 0.05,
           "ci_lo": 0.03, "ci_hi": 0.08, "threshold": "0.05 [0.03, 0.08]", "onset_lr": None,
           "onset_lo": None, "onset_hi": None, "onset": "<= 0.0001 [< 0.0001, < 0.0001]"}
    points = pl.DataFrame([row])
    prediction = {"lr": 0.1, "ci_lo": 0.06, "ci_hi": 0.3}
    text = prediction_check(points, prediction)
    assert "measured threshold 0.05 [0.03, 0.08] against the predicted 0.1 [0.06, 0.3]" in text
    assert "outside the prediction interval" in text and "intervals overlap" in text
    assert "censored, so the prediction is not tested" in prediction_check(points, prediction,
                                                                          "onset")
    assert prediction_check(points, {"lr": None}) == ""
    assert prediction_check(points.with_columns(point=pl.lit("w64-s300")), prediction) == ""
