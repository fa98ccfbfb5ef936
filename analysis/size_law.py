"""The size ladder (docs/report.md): per point each arm's best LR and the best-against-best gap;
the size law in two forms (power, ceiling) over every complete ladder point on the synthetic
corpus, for the onset and for its ratio to QK-norm's best LR, with predictions at the two test
points; and which knob moves the onset."""

from __future__ import annotations

import math
import zlib
from datetime import datetime
from functools import cache

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from qkstudy.config import model_args
from qkstudy.data.tokenizer import VOCAB_BY_TOKENIZER
from qkstudy.parameters import count_params
from qkstudy.sweep.config import parse_sweep_config, run_config
from qkstudy.sweep.ladder import KNOWN, SIZE_POINTS, SIZE_TESTS, WARMUP_POINTS, Point, point_words

from . import stats as S
from .load import lr_key
from .law import lack_of_fit, new_point_draws, unit_variance, widened_draws
from .prediction import STEPS0, WARMUP0
from .metrics import OFF, full_curves, with_losses

ON = "rmsnorm"
FORMS = ("power", "ceiling")
# Every complete ladder point on the synthetic corpus but the test points (and the body point of
# 2026-12-06, superseded by the size ladder's with a grid reaching below 0.01)
FITTED = (*WARMUP_POINTS, "w64-s24414-wu1000", "w128-s300", "w256-s300",
          *(p.name for p in SIZE_POINTS))
TEST_NAMES = tuple(p.name for p in SIZE_TESTS)
# The early warning's level was fitted on the points archived when it was fixed
LEVEL_POINTS = (*WARMUP_POINTS, "w64-s24414-wu1000", "w128-s300", "w256-s300",
                "w192-d6-s1200-wu480")
# Each point's forecast at registration (`just ladder --dry-run`, docs/report.md "Cost"), seconds
FORECAST = {"w128-s1200-wu480": 50 * 60, "w192-s1200-wu480": 115 * 60,
            "w192-d6-hd32-s1200-wu480": 127 * 60, "w192-d6-hd64-s1200-wu480": 126 * 60,
            "w256-d6-hd64-s1200-wu480": 207 * 60, "w192-d6-hd64-s4800-wu1000": 615 * 60}


@cache
def non_embedding(name: str) -> float:
    """The point's parameters outside the embeddings."""
    p = KNOWN[name]
    words = parse_sweep_config(point_words(p, [], "runs/ladder"))
    cfg = run_config(words, p.depth, words.train.lr, ON, 0)
    return count_params(model_args(cfg, VOCAB_BY_TOKENIZER["bytes"]))["non_embedding"]


def knobs(points: list[Point]) -> np.ndarray:
    """(points, 3): w = log2(warmup / 30), s = log2(steps / 300), n = log2(N / N at d_model 64,
    depth 4)."""
    n0 = non_embedding("w64-s300")
    return np.array([[math.log2(p.warmup / WARMUP0), math.log2(p.steps / STEPS0),
                      math.log2(non_embedding(p.name) / n0)] for p in points])


# --- per point ----------------------------------------------------------------------------------

def best_against_best(points: pl.DataFrame) -> dict:
    """Each arm's best LR (the lowest seed-mean clipped loss over the LRs every seed ran) and
    best loss, and per seed off's loss at off's best LR minus on's at on's, with its t-interval:
    what skipping QK-norm costs once each arm's LR is tuned."""
    p = with_losses(full_curves(points)).filter(pl.col("arm").is_in([OFF, ON]))
    seeds = p["seed"].n_unique()
    means = (p.group_by("arm", "lr").agg(pl.col("loss_clipped").mean(), n=pl.col("seed").n_unique())
             .filter(pl.col("n") == seeds).sort("loss_clipped"))
    out: dict = {}
    per_seed = {}
    for arm, key in ((OFF, "off"), (ON, "on")):
        mine = means.filter(pl.col("arm") == arm)
        best = mine.row(0, named=True)
        out[f"best_lr_{key}"], out[f"best_loss_{key}"] = best["lr"], best["loss_clipped"]
        # at the smallest (largest) LR run the best LR is only bounded: at or below (above) it
        edge = "≤ " if best["lr"] == mine["lr"].min() else "≥ " if best["lr"] == mine["lr"].max() \
            else ""
        out[f"best_lr_{key}_text"] = f"{edge}{best['lr']:.3g}"
        rows = p.filter((pl.col("arm") == arm) & (pl.col("lr") == best["lr"]))
        per_seed[key] = dict(zip(rows["seed"], rows["loss_clipped"]))
    gaps = [per_seed["off"][s] - per_seed["on"][s] for s in per_seed["off"] if s in per_seed["on"]]
    lo, hi = S.interval(gaps)
    return out | {"best_gap": float(np.mean(gaps)), "best_gap_lo": lo, "best_gap_hi": hi}


# --- the size law -------------------------------------------------------------------------------

def _ceiling(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    a, b, c, e, h = theta
    return np.minimum(a + b * x[:, 0] + c * x[:, 1], e + h * x[:, 2])


def _fit_ceiling(x: np.ndarray, y: np.ndarray, start: np.ndarray) -> np.ndarray:
    return least_squares(lambda t: _ceiling(t, x) - y, start, method="lm").x


def _power_design(x: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(x)), x])


def fit_form(form: str, x: np.ndarray, y: np.ndarray, point_draws: np.ndarray, key: str
             ) -> tuple[np.ndarray, np.ndarray, float] | str:
    """(estimate, coefficient draws, lack-of-fit variance) or why the form is not estimable.
    Power: least squares on (1, w, s, n). Ceiling: min(a + b w + c s, e + h n), least squares
    from the straight warmup law and a ceiling through the points under it; it needs two
    distinct sizes on the ceiling. Both: the lack of fit added as a t draw (the ceiling's
    through its Jacobian at the estimate)."""
    terms = 4 if form == "power" else 5
    if len(y) <= terms:
        return f"needs more than {terms} points (has {len(y)})"
    if form == "power":
        d = _power_design(x)
        est = np.linalg.pinv(d) @ y
        boot, jac = point_draws @ np.linalg.pinv(d).T, d
    else:
        straight = np.linalg.lstsq(_power_design(x)[:, :3], y, rcond=None)[0]
        under = y < _power_design(x)[:, :3] @ straight
        if len(set(x[under, 2])) < 2:
            return "fewer than two sizes lie under the warmup law: no ceiling to fit"
        e, h = np.polyfit(x[under, 2], y[under], 1)[::-1]
        est = _fit_ceiling(x, y, np.array([*straight, e, h]))
        on_ceiling = _ceiling(est, x) < _power_design(x)[:, :3] @ est[:3]
        if len(set(x[on_ceiling, 2])) < 2:
            return "the fitted ceiling holds fewer than two sizes"
        boot = np.array([_fit_ceiling(x, row, est) for row in point_draws])
        jac = np.column_stack([np.where(on_ceiling[:, None], 0, _power_design(x)[:, :3]),
                               np.where(on_ceiling[:, None], _power_design(x)[:, [0, 3]], 0)])
    resid = y - (_power_design(x) @ est if form == "power" else _ceiling(est, x))
    lack = lack_of_fit(resid, point_draws, terms)
    if lack > 0:
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        chol = np.linalg.cholesky(lack * np.linalg.pinv(jac.T @ jac) + 1e-12 * np.eye(terms))
        t = np.sqrt((len(y) - terms) / rng.chisquare(len(y) - terms, len(boot)))
        boot = boot + (rng.standard_normal((len(boot), terms)) @ chol.T) * t[:, None]
    return est, boot, lack


def evaluate(form: str, theta: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """The form's log10 value at knobs x0 for each row of theta (draws, terms)."""
    theta = np.atleast_2d(theta)
    if form == "power":
        return theta @ np.array([1.0, *x0])
    low = theta[:, 0] + theta[:, 1] * x0[0] + theta[:, 2] * x0[1]
    return np.minimum(low, theta[:, 3] + theta[:, 4] * x0[2])


def fit_size_law(results: list, target: str = "onset") -> list[dict]:
    """Both forms over the fitted points' onsets (target "onset") or the onsets' ratios to
    QK-norm's best LR ("ratio", each point's best LR fixed, not redrawn), with each form's terms
    and its predictions at the test points (the 95% interval of a new five-seed point's
    measured value)."""
    used = [r for r in results if r.name in FITTED and r.complete and math.isfinite(r.onset.point)
            and (target == "onset" or not r.best["best_lr_on_text"].startswith(("≤", "≥")))]
    shift = np.array([math.log10(r.best["best_lr_on"]) if target == "ratio" else 0.0 for r in used])
    x, y = knobs([r.point for r in used]), np.array([r.onset.point for r in used]) - shift
    draws, k = widened_draws(used, f"size-law/{target}/points")
    draws = draws - shift
    unit = unit_variance(draws, np.array([r.seeds for r in used]), k) if used else 0.0
    fits = []
    for form in FORMS:
        fit = {"form": form, "target": target, "points": ", ".join(r.name for r in used),
               "lr": None, "predictions": [], "note": ""}
        out = fit_form(form, x, y, draws, f"size-law/{target}/{form}") if used else "no points"
        if isinstance(out, str):
            fit["note"] = f"not estimable yet: {out}"
            fits.append(fit)
            continue
        est, boot, lack = out
        df = len(y) - len(est)
        fit.update(estimate=est, lack_of_fit=math.sqrt(lack), df=df, lr=True)
        for p in SIZE_TESTS:
            x0 = knobs([p])[0]
            center = evaluate(form, boot, x0)
            lo, hi = S.percentile_interval(new_point_draws(
                center, lack, unit, len(p.seeds), df, f"size-law/{target}/{form}/{p.name}"))
            v = float(evaluate(form, est, x0)[0])
            fit["predictions"].append({"form": f"{form} ({target})", "point": p.name,
                                       "log10_lr": v, "lr": 10 ** v, "ci_lo": 10 ** lo,
                                       "ci_hi": 10 ** hi})
        fits.append(fit)
    return fits


def _bounded(r) -> float:
    return float(np.clip(r.onset.point, *r.onset.bounds))


def shift(a, b) -> dict | None:
    """b's onset minus a's (decades) with the 95% interval of both points' widened draws (each
    at its own seeds); where an onset lies beyond its LRs read, a bound: side "<" or ">"."""
    if a is None or b is None:
        return None
    draws = widened_draws([a, b], f"size-shift/{a.name}/{b.name}")[0]
    lo, hi = S.percentile_interval(draws[:, 1] - draws[:, 0])
    less = b.onset.point == -math.inf or a.onset.point == math.inf
    more = b.onset.point == math.inf or a.onset.point == -math.inf
    if less and more:
        return None  # censored on opposite sides: no bound
    return {"shift": _bounded(b) - _bounded(a), "side": "<" if less else ">" if more else "",
            "ci_lo": lo, "ci_hi": hi}


def width_slope(results: list) -> dict | None:
    """The onset's change per doubling of width at depth 4 and head_dim 32 (480 of 1,200):
    least squares over the points' estimates, interval from their widened draws."""
    by = {r.name: r for r in results}
    names = ("w64-s1200-wu480", "w128-s1200-wu480", "w192-s1200-wu480")
    pts = [by[n] for n in names if n in by and math.isfinite(by[n].onset.point)]
    if len(pts) < 2:
        return None
    x = np.log2([r.point.d_model for r in pts])
    y = np.array([r.onset.point for r in pts])
    draws = widened_draws(pts, "size-width-slope")[0]
    xc = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    lo, hi = S.percentile_interval(draws @ xc)
    return {"shift": float(y @ xc), "side": "", "ci_lo": lo, "ci_hi": hi,
            "points": ", ".join(r.name for r in pts)}


def knob_shifts(results: list) -> dict[str, dict | None]:
    """Which knob moves the onset: width (per doubling, depth 4), depth (4 to 6 at d_model 192),
    head dimension (32 to 64 at d_model 192, depth 6) and the study body against width 64."""
    by = {r.name: r for r in results}
    return {"width, per doubling (depth 4)": width_slope(results),
            "depth 4 to 6 (d_model 192)": shift(by.get("w192-s1200-wu480"),
                                                by.get("w192-d6-hd32-s1200-wu480")),
            "head_dim 32 to 64 (d_model 192, depth 6)": shift(
                by.get("w192-d6-hd32-s1200-wu480"), by.get("w192-d6-hd64-s1200-wu480")),
            "the study body against d_model 64, depth 4": shift(
                by.get("w64-s1200-wu480"), by.get("w192-d6-hd64-s1200-wu480"))}


# --- the early warning and the text ---------------------------------------------------------

def warning_reading(r, seeds: tuple[int, ...] | None = None) -> tuple[dict[float, float], float,
                                                                       str]:
    """The off arm's logit at the warmup's end per grid LR (log10; seeds 0 and 1 unless given)
    and the early warning's predicted onset (log10 LR) with its side."""
    from . import early_warning as E

    step = E.probe_step(r.point.steps, r.point.warmup)
    logits = E.warmup_logits(_grid_marked(r), r.study.probe_steps, step, seeds or E.SEEDS)
    return (logits, *E.crossing(logits, E.LEVEL))


def _grid_marked(r) -> pl.DataFrame:
    """The point's runs with `in_grid`: the analysis' base grid for a complete point; for an
    unfinished one (whose grid LRs may still lack some arm's seeds) its planned grid LRs."""
    if r.complete:
        return r.study.per_run
    grid = {lr_key(lr) for lr in r.point.lrs}
    return r.study.per_run.with_columns(in_grid=pl.col("lr").map_elements(
        lambda lr: lr_key(lr) in grid, return_dtype=pl.Boolean))


def warning_ready(r) -> bool:
    """Whether the off arm's seeds 0 and 1 have run at every grid LR of the point (its early
    warning can be read, and committed, before the point's other runs finish)."""
    from . import early_warning as E

    runs = _grid_marked(r).filter((pl.col("arm") == OFF) & pl.col("seed").is_in(E.SEEDS)
                                  & pl.col("in_grid"))
    have = {(lr_key(lr), seed) for lr, seed in runs.select("lr", "seed").iter_rows()}
    return all((lr_key(lr), seed) in have for lr in r.point.lrs for seed in E.SEEDS)


def warning_error(r, v: float, side: str) -> str:
    """Measured minus predicted onset (decades); a bound where either lies beyond its grid
    ("-" where both do on the same side, or on sides that leave it unbounded)."""
    m = r.onset.point
    low = (m == -math.inf, side == "above")  # the error is at most the value shown
    high = (m == math.inf, side == "below")
    if any(low) and any(high):
        return "-"
    return ("≤ " if any(low) else "≥ " if any(high) else "") + f"{_bounded(r) - v:+.2f}"


def warning_scores(results: list) -> list[dict]:
    """The early warning at each test point: predicted (once seeds 0 and 1 have run at every
    grid LR), measured and the error in decades (once the point is complete)."""
    rows = []
    for r in results:
        if r.name not in TEST_NAMES or not warning_ready(r):
            continue
        _, v, side = warning_reading(r)
        rows.append({"point": r.name, "complete": r.complete,
                     "predicted": {"below": "< ", "above": "> "}.get(side, "") + f"{10 ** v:.3g}",
                     "measured": r.onset.point if r.complete else math.nan,
                     "error": warning_error(r, v, side) if r.complete else "-"})
    return rows


def size_scores(fits: list[dict], results: list) -> pl.DataFrame:
    """Each form's prediction at each measured test point, scored as the warmup law's are (the
    ratio's measured value: the onset over QK-norm's best LR)."""
    from .law import score

    out = []
    for target in ("onset", "ratio"):
        measured = {}
        for r in results:
            if r.name in TEST_NAMES and r.complete:
                v = _bounded(r) - (math.log10(r.best["best_lr_on"]) if target == "ratio" else 0)
                side = ratio_side(r) if target == "ratio" else "" if math.isfinite(
                    r.onset.point) else "below" if r.onset.point < 0 else "above"
                if side is None:
                    continue
                measured[r.name] = {"lr": 10 ** v, "side": side, "text": (
                    {"below": "< ", "above": "> "}.get(side, "") + f"{10 ** v:.3g}")}
        out.append(score([f for f in fits if f["target"] == target], measured))
    return pl.concat(out)


def ratio_side(r) -> str | None:
    """Where the onset over QK-norm's best LR is a bound: "below" where the onset is below its
    LRs or the best LR at or above its grid's top, "above" where the onset is above or the best
    LR at or below the grid's bottom, None where both (bounded on neither side), else ""."""
    low = (r.onset.point == -math.inf, r.best["best_lr_on_text"].startswith("≥"))
    high = (r.onset.point == math.inf, r.best["best_lr_on_text"].startswith("≤"))
    return None if any(low) and any(high) else "below" if any(low) else \
        "above" if any(high) else ""


def size_analysis(results: list) -> dict:
    """The size ladder's outputs for `python -m analysis ladder`."""
    from . import early_warning as E

    archived = [r for r in results if r.name in LEVEL_POINTS and r.complete]
    level = E.fitted_level([(warning_reading(r)[0], r.onset.point) for r in archived]) \
        if archived else None
    fits = fit_size_law(results, "onset") + fit_size_law(results, "ratio")
    return {"fits": fits, "scores": size_scores(fits, results), "shifts": knob_shifts(results),
            "warning": warning_scores(results), "level": level}


def trained_seconds(points: pl.DataFrame, manifests: dict[str, dict]) -> float | None:
    """How long the point took: the time during which at least one of its runs trained, the
    union of each run's span [ended - wall_seconds, ended] (a resumed run's stretch before its
    interruption is counted just before its last one); None where a run's manifest lacks a
    readable end."""
    spans = []
    for run, wall in points.select("run", "wall_seconds").iter_rows():
        try:
            end = datetime.fromisoformat(manifests[run]["ended"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return None
        if wall is None or not math.isfinite(wall) or wall < 0:
            return None
        spans.append((end - wall, end))
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total
