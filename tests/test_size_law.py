"""The size ladder's analysis (analysis/size_law.py) on planted onsets: the power and ceiling
forms recover the law they were planted from and predict the test points; the cost of skipping
QK-norm at each arm's best LR; shifts and their bounds where an onset is censored."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from analysis import size_law as Z
from analysis import size_report as R
from analysis.ladder import PointResult
from analysis.threshold import DepthDraws
from qkstudy.sweep.ladder import KNOWN, SIZE_TESTS


def planted(law, spread: float = 0.02, best_on: float = 0.01) -> list[PointResult]:
    rng = np.random.default_rng(0)
    out = []
    for name in Z.FITTED:
        p = KNOWN[name]
        y = float(law(Z.knobs([p])[0]))
        draws = y + spread * rng.standard_normal(3125)
        out.append(PointResult(name=name, point=p, study=None, complete=True, left=0, seeds=5,
                               onset=DepthDraws(lrs=[1e-4, 3.0], point=y, draws=draws, seeds=5),
                               best={"best_lr_on": best_on, "best_lr_on_text": f"{best_on:g}"}))
    return out


def test_the_power_form_recovers_a_planted_power_of_the_parameters_and_predicts_the_tests():
    law = lambda x: -2.1 + 0.18 * x[0] - 0.2 * x[2]  # noqa: E731
    power, ceiling = Z.fit_size_law(planted(law))
    assert power["estimate"] == pytest.approx([-2.1, 0.18, 0.0, -0.2], abs=1e-6)
    for p, pred in zip(SIZE_TESTS, power["predictions"]):
        truth = law(Z.knobs([p])[0])
        assert pred["log10_lr"] == pytest.approx(truth, abs=1e-6)
        assert pred["ci_lo"] < 10 ** truth < pred["ci_hi"]
    ratio = Z.fit_size_law(planted(law, best_on=0.01), "ratio")[0]
    assert ratio["estimate"][0] == pytest.approx(-2.1 + 2, abs=1e-6)  # onset / 0.01


def test_the_ceiling_form_recovers_a_planted_ceiling():
    law = lambda x: min(-2.1 + 0.18 * x[0], -1.0 - 0.4 * x[2])  # noqa: E731
    _, ceiling = Z.fit_size_law(planted(law))
    assert ceiling["lr"] and ceiling["estimate"][[0, 1, 3, 4]] == pytest.approx(
        [-2.1, 0.18, -1.0, -0.4], abs=1e-3)
    body = next(p for p in ceiling["predictions"] if p["point"] == SIZE_TESTS[1].name)
    assert body["log10_lr"] == pytest.approx(law(Z.knobs([SIZE_TESTS[1]])[0]), abs=1e-3)
    flat = Z.fit_size_law(planted(lambda x: -2.1 + 0.18 * x[0]))[1]  # nothing under the law
    assert flat["lr"] is None and "ceiling" in flat["note"]


def test_best_against_best_takes_each_arms_best_lr_from_the_seed_means():
    rows = []
    for seed in range(3):
        for arm, losses in (("none", {0.01: 1.0, 0.03: 0.9}), ("rmsnorm", {0.01: 0.8, 0.03: 0.85})):
            for lr, loss in losses.items():
                rows.append({"run": f"{arm}{lr}{seed}", "arm": arm, "qk_norm": arm, "lr": lr,
                             "seed": seed, "depth": 4, "status": "completed",
                             "init_loss": 5.0, "final_val_loss": loss + 0.01 * seed,
                             "unigram_entropy": 3.1, "added_seed": False})
    b = Z.best_against_best(pl.DataFrame(rows))
    assert (b["best_lr_off"], b["best_lr_on"]) == (0.03, 0.01)
    # each best LR lies at an end of the two LRs run: a bound, not a number
    assert (b["best_lr_off_text"], b["best_lr_on_text"]) == ("≥ 0.03", "≤ 0.01")
    assert b["best_gap"] == pytest.approx(0.1) and b["best_gap_lo"] == pytest.approx(0.1)


def test_a_shift_against_a_censored_onset_is_a_bound():
    def r(name, point):
        return PointResult(name=name, point=KNOWN[name], study=None, complete=True, left=0,
                           seeds=5, onset=DepthDraws(lrs=[0.001, 0.1], point=point,
                                                     draws=np.full(3125, point if math.isfinite(
                                                         point) else -3.0), seeds=5))
    base, body = r("w64-s1200-wu480", -1.36), r("w192-d6-hd64-s1200-wu480", -math.inf)
    s = Z.shift(base, body)
    assert s["side"] == "<" and s["shift"] == pytest.approx(-3.0 + 1.36)
    assert Z.shift(base, r("w192-d6-hd64-s1200-wu480", -2.0))["side"] == ""


def test_a_point_took_the_time_its_runs_trained_not_the_gaps_between_sessions():
    """Forecast beside actual: overlapping runs (two processes) count once, an idle gap between
    sessions not at all, and a resumed run its whole training time; an unreadable end gives no
    time rather than a wrong one."""
    points = pl.DataFrame({"run": ["a", "b", "c"], "wall_seconds": [100.0, 60.0, 50.0]})
    ends = {"a": "2026-12-07T10:01:40+00:00", "b": "2026-12-07T10:02:00+00:00",
            "c": "2026-12-07T11:00:00+00:00"}  # a: 10:00:00-10:01:40, b 10:01:00-10:02:00
    manifests = {k: {"ended": v} for k, v in ends.items()}
    assert Z.trained_seconds(points, manifests) == pytest.approx(120 + 50)
    assert Z.trained_seconds(points, manifests | {"c": {}}) is None
    assert Z.trained_seconds(points, manifests | {"c": {"ended": "yesterday"}}) is None
    assert Z.trained_seconds(points.with_columns(wall_seconds=pl.lit(-1.0)), manifests) is None
    assert R._took_text("w128-s1200-wu480", 5184.0) == "50m00s / 1h26m"
    assert R._took_text("w64-s1200-wu480", 5184.0) == "-"


def _warned(onset: float, off_runs: list[tuple[float, int]], complete: bool = True,
            in_grid: bool = True):
    from types import SimpleNamespace

    p = KNOWN["w256-d6-hd64-s1200-wu480"]
    per_run = pl.DataFrame({"arm": ["none"] * len(off_runs), "lr": [lr for lr, _ in off_runs],
                            "seed": [s for _, s in off_runs],
                            "in_grid": [in_grid or lr < p.lrs[-1] for lr, _ in off_runs]})
    return PointResult(name=p.name, point=p, study=SimpleNamespace(per_run=per_run),
                       complete=complete, left=0, seeds=5,
                       onset=DepthDraws(lrs=[0.001, 0.03], point=onset, draws=np.zeros(3),
                                        seeds=5))


def test_the_early_warning_is_read_once_seeds_0_and_1_ran_at_every_lr_and_scored_with_bounds():
    p = KNOWN["w256-d6-hd64-s1200-wu480"]
    every = [(lr, s) for lr in p.lrs for s in (0, 1)]
    assert Z.warning_ready(_warned(-2.0, every))
    assert not Z.warning_ready(_warned(-2.0, every[:-1]))  # seed 1 at the top LR still running
    # a partial point: its top LR is not yet in the analysis' base grid (QK-norm's seeds there
    # still running), yet the off arm's seeds 0 and 1 ran at every grid LR
    assert Z.warning_ready(_warned(-2.0, every, complete=False, in_grid=False))
    assert not Z.warning_ready(_warned(-2.0, every + [(0.0055, 0)], in_grid=False))
    # measured minus predicted; a bound where the measured onset or the prediction is censored
    assert Z.warning_error(_warned(-2.0, every), -2.3, "") == "+0.30"
    assert Z.warning_error(_warned(-math.inf, every), -2.5, "") == "≤ -0.50"  # below 0.001
    assert Z.warning_error(_warned(-2.0, every), -3.0, "below") == "≥ +1.00"
    assert Z.warning_error(_warned(-math.inf, every), -3.0, "below") == "-"


def test_the_rerun_pairs_the_runs_both_body_points_share():
    """The body rerun's table compares only the seeds both points ran, per LR and arm, and
    says nothing until both points are read."""
    from types import SimpleNamespace

    from analysis.rerun import EARLIER, RERUN, rerun_cells, rerun_text

    def point(name, losses):
        rows = [{"lr": lr, "arm": arm, "seed": s, "final_val_loss": v}
                for (lr, arm), seeds in losses.items() for s, v in seeds.items()]
        return SimpleNamespace(name=name, study=SimpleNamespace(points=pl.DataFrame(rows)))

    earlier = point(EARLIER, {(0.01, "none"): {0: 0.8, 1: 0.9, 3: 1.0},
                              (0.03, "rmsnorm"): {0: 0.6}})
    rerun = point(RERUN, {(0.01, "none"): {0: 0.75, 1: 1.0, 2: 0.5}, (0.003, "rmsnorm"): {0: 0.5}})
    assert rerun_cells([earlier]) is None and rerun_text(None) == []
    cells = rerun_cells([earlier, rerun])
    assert cells.rows() == [(0.01, "none", 2, pytest.approx(0.85), pytest.approx(0.875),
                             pytest.approx(0.025), pytest.approx(0.1))]
    assert "| 0.01 | off | 2 | 0.850 / 0.875 | +0.025 | 0.100 |" in rerun_text(cells)


def test_the_ratio_at_a_test_point_is_a_bound_where_qk_norms_best_lr_is_at_its_grid_end():
    """Onset over QK-norm's best LR: where that best LR is the grid's smallest LR (its true best
    may lie lower), the measured ratio is a lower bound and is scored as one; where the onset
    is below the grid as well, the ratio is bounded on neither side and not scored."""
    law = lambda x: -2.1 + 0.18 * x[0] - 0.2 * x[2]  # noqa: E731
    fits = Z.fit_size_law(planted(law), "ratio")
    p = SIZE_TESTS[0]

    def measured(onset: float, best_text: str) -> PointResult:
        return PointResult(name=p.name, point=p, study=None, complete=True, left=0, seeds=5,
                           onset=DepthDraws(lrs=[0.001, 0.03], point=onset,
                                            draws=np.zeros(3), seeds=5),
                           best={"best_lr_on": 0.001, "best_lr_on_text": best_text})

    def ratio_scores(r):
        return Z.size_scores(fits, [r]).filter(pl.col("point") == p.name)

    exact = ratio_scores(measured(-2.0, "0.001"))
    assert set(exact["measured"]) == {"10"} and not any(exact["error"].str.starts_with(">"))
    bound = ratio_scores(measured(-2.0, "≤ 0.001"))
    assert set(bound["measured"]) == {"> 10"} and all(bound["error"].str.starts_with("> "))
    assert ratio_scores(measured(-math.inf, "≤ 0.001")).is_empty()


def test_which_transfers_across_size_better_is_the_target_with_the_smaller_absolute_errors():
    """The plan's rule for the onset against its ratio to QK-norm's best LR, per form: the mean
    absolute error over the test points scored on both as numbers; a bound is left out, named."""
    a, b = (p.name for p in SIZE_TESTS)
    rows = [("power (onset)", a, "+0.10"), ("power (onset)", b, "-0.30"),
            ("power (ratio)", a, "-0.05"), ("power (ratio)", b, "+0.15"),
            ("ceiling (onset)", a, "+0.40"), ("ceiling (onset)", b, "< -0.20"),
            ("ceiling (ratio)", a, "+0.50"), ("ceiling (ratio)", b, "+0.01")]
    scores = pl.DataFrame({"form": [f for f, _, _ in rows], "point": [p for _, p, _ in rows],
                           "error": [e for _, _, e in rows]})
    text = R.transfer_text(scores)
    assert "power: the onset 0.20, its ratio to QK-norm's best LR 0.10 decades (2 test points" \
        in text and "the ratio transfers better" in text
    assert f"ceiling: the onset 0.40, its ratio to QK-norm's best LR 0.50 decades (1 test point; " \
        f"left out as a bound: {b})" in text
    assert R.transfer_text(scores.head(0)) == ""
    edge = R.transfer_text(scores.filter(pl.col("point") == b))
    assert edge.endswith(f"ceiling: no test point scored both as numbers (left out as a bound: "
                         f"{b}).")


def test_a_partial_test_point_with_too_few_runs_to_read_is_not_ready_to_register(tmp_path):
    """A session can end after a test point's first runs: its partial archive then holds no
    cell with two paired seeds, and its early warning is not ready (no error)."""
    import shutil
    from pathlib import Path

    from analysis.registration import registrations, warning_block_name
    from qkstudy import archive

    name = SIZE_TESTS[0].name
    root = Path(__file__).resolve().parents[1]
    folder = archive.extract(root / "results" / "ladder" / f"{name}.tar.xz", tmp_path / "runs")[0]
    for run in folder.iterdir():
        if run.is_dir() and not run.name.endswith("-s0-" + run.name.rsplit("-", 1)[-1]):
            shutil.rmtree(run)
    (tmp_path / "results" / "ladder-partial").mkdir(parents=True)
    archive.write_archive(folder, tmp_path / "results" / "ladder-partial" / f"{name}.tar.xz")
    made = registrations(tmp_path, {"points": pl.DataFrame()})
    assert made[warning_block_name(name)] is None
