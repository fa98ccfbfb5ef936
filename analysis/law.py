"""The warmup law over the ladder's width-64 points in two forms (docs/report.md): terms with
intervals, the straight form's three claims, and predictions with a new point's interval."""

from __future__ import annotations

import math
import zlib

import numpy as np
import polars as pl

from qkstudy.sweep.ladder import SCORED_POINTS, STUDY_POINT, WARMUP_POINTS, Point

from . import prediction as P
from . import stats as S
from .prediction import STEPS0, WARMUP0, schedule_x  # noqa: F401 (the laws' anchor)
from .hypotheses import small_sample_widening

MARGIN = math.log10(2) / 4  # decades per doubling: under x2 across the 16x range of steps
# The straight law in log2(warmup / 30) and log2(steps / 300); the bent one adds the square of
# log2(warmup / 30), so the warmup's effect can level off (or steepen) with its length.
FORMS = {"straight": ("a", "b", "c"), "bent": ("a", "b", "c", "d")}
CLAIMS = {"p_raises": "warmup raises it", "p_steps": "it follows the warmup's steps",
          "p_share": "it follows the warmup's share of the run"}
LAW_SCHEMA = {"form": pl.String, "term": pl.String, "estimate": pl.Float64,
              "ci_lo": pl.Float64, "ci_hi": pl.Float64}
PREDICTED = (*SCORED_POINTS, STUDY_POINT)


def design(points: list[Point], form: str = "straight") -> np.ndarray:
    return np.array([schedule_x(p.warmup, p.steps, len(FORMS[form])) for p in points])


def widened_draws(results: list, key: str, draws: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(B, points) whole-seed draws, each point's widened about its estimate by t / z at its
    own seeds and drawn independently of the others (the points share no run); and each
    point's widening factor."""
    k = np.array([small_sample_widening(r.seeds) for r in results])
    own = [r.onset.point + kk * (r.onset.draws - r.onset.point) if math.isfinite(r.onset.point)
           else r.onset.draws for r, kk in zip(results, k)]  # censored: draws at their bound
    return S.joint_draws(own, draws, key), k


def lack_of_fit(resid: np.ndarray, point_draws: np.ndarray, terms: int) -> float:
    """The points' variance about the law beyond their seed noise (decades squared)."""
    n = len(resid)
    seed_var = float(point_draws.var(axis=0, ddof=1).mean())
    return max(0.0, float(resid @ resid) / (n - terms) - seed_var) if n > terms else 0.0


def unit_variance(point_draws: np.ndarray, seeds: np.ndarray, k: np.ndarray) -> float:
    """One seed's onset variance before widening, averaged over the points (var_i n_i / k_i^2):
    a new point of n seeds carries unit_variance * k(n)^2 / n."""
    return float(np.mean(point_draws.var(axis=0, ddof=1) * seeds / k ** 2))


def law_draws(x: np.ndarray, y: np.ndarray, point_draws: np.ndarray, key: str
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """Least squares of the points' onsets y (log10) on the design x: the estimate, the
    coefficient draws (the points' widened draws refitted, plus the lack of fit as a t draw with
    the residual degrees of freedom) and the lack-of-fit variance."""
    n, p = x.shape
    pinv = np.linalg.pinv(x)
    est = pinv @ y
    boot = point_draws @ pinv.T
    lack = lack_of_fit(y - x @ est, point_draws, p)
    if lack > 0:
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        chol = np.linalg.cholesky(lack * np.linalg.inv(x.T @ x))
        shift = rng.standard_normal((len(boot), p)) @ chol.T
        boot = boot + shift * P.t_scale(rng, n - p, len(boot))[:, None]
    return est, boot, lack


def new_point_draws(center: np.ndarray, lack: float, unit_var: float, seeds: int, df: int,
                    key: str) -> np.ndarray:
    """prediction.new_point_draws at t / z of the new point's own seeds."""
    return P.new_point_draws(center, lack, unit_var, small_sample_widening(seeds), seeds, df, key)


def predict(fit: dict, point: Point) -> dict:
    """The form's onset at a point with the 95% interval of a new point's measured onset: the
    coefficient draws, the new point's own deviation from the law and its seed noise."""
    est, boot, lack, unit_var = fit["draws"]
    x0 = design([point], fit["form"])[0]
    lo, hi = S.percentile_interval(new_point_draws(
        boot @ x0, lack, unit_var, len(point.seeds), fit["df"],
        f"warmup-law/{fit['form']}/{point.name}"))
    return {"form": fit["form"], "point": point.name, "log10_lr": float(x0 @ est),
            "lr": 10 ** float(x0 @ est), "ci_lo": 10 ** lo, "ci_hi": 10 ** hi}


def predict_at(fit: dict, warmup: int, steps: int) -> dict:
    """A fitted form's prediction at any warmup and length, computed as fit_law computes its
    own: at the schedule of a point fit_law predicts (the study preset first), that point's
    prediction, interval included; elsewhere that of a width-64 point named by the schedule."""
    if fit["lr"] is None:
        raise ValueError(f"the {fit['form']} law is not fitted: {fit['note']}")
    same = [p for p in (STUDY_POINT, *SCORED_POINTS) if (p.warmup, p.steps) == (warmup, steps)]
    point = same[0] if same else Point(f"w64-s{steps}-wu{warmup}", 64, steps, warmup)
    return predict(fit, point)


def law_band(fit: dict, steps: int, warmups: list[float]) -> list[dict]:
    """A fitted form's onset along warmups at one training length, with `predict`'s 95% interval
    of a new point's measured onset from the fit's draws; one seed for the whole line (its key
    names the length), so the band is smooth."""
    return [predict(fit, Point(f"law band/s{steps}", 64, steps, w)) | {"warmup": w, "steps": steps}
            for w in warmups]


def fit_law(results: list, options, form: str = "straight") -> tuple[pl.DataFrame, dict]:
    """One form's terms (the straight form's b + c too) with intervals, the straight form's
    three claims under Holm, and the predictions (with the draws they come from, for
    law_band). A point whose onset is outside the LRs read is left out and named; the claims
    are then exploratory."""
    ready = [r for r in results if r.name in WARMUP_POINTS and r.complete]
    law = [r for r in ready if math.isfinite(r.onset.point)]
    left_out = [f"{r.name} ({'below' if r.onset.point < 0 else 'above'} the LRs read)"
                for r in ready if r not in law]
    fit = {"form": form, "points": ", ".join(r.name for r in law), "left_out": ", ".join(left_out),
           "lr": None, "predictions": [], "note": ""}
    pts = [r.point for r in law]
    need = len(FORMS[form]) + 1
    if len({p.warmup for p in pts}) < len(FORMS[form]) - 1 or len({p.steps for p in pts}) < 2 \
            or len(law) < need:
        fit["note"] = (f"not estimable yet: the {form} law needs {need} complete points at "
                       f"{len(FORMS[form]) - 1} warmups and 2 lengths (has "
                       f"{fit['points'] or 'none'})")
        return pl.DataFrame(schema=LAW_SCHEMA), fit
    y = np.array([r.onset.point for r in law])
    point_draws, k = widened_draws(law, f"warmup-law/{form}/points")
    est, boot, lack = law_draws(design(pts, form), y, point_draws, f"warmup-law/{form}")
    unit_var = unit_variance(point_draws, np.array([r.seeds for r in law]), k)
    terms = {t: (est[i], boot[:, i]) for i, t in enumerate(FORMS[form])}
    if form == "straight":
        terms["b + c"] = (est[1] + est[2], boot[:, 1] + boot[:, 2])
    rows = [{"form": form, "term": t, "estimate": float(e),
             **dict(zip(("ci_lo", "ci_hi"), S.percentile_interval(d)))}
            for t, (e, d) in terms.items()]
    df = len(law) - len(FORMS[form])
    fit.update(lack_of_fit=math.sqrt(lack), seed_sd=math.sqrt(float(
               point_draws.var(axis=0, ddof=1).mean())),
               df=df, exploratory=bool(left_out), draws=(est, boot, lack, unit_var))
    fit["predictions"] = [predict(fit, p) for p in PREDICTED]
    fit.update({k: v for k, v in fit["predictions"][-1].items() if k in ("lr", "ci_lo", "ci_hi",
                                                                         "log10_lr")})
    if form == "straight":
        b, c = boot[:, 1], boot[:, 2]
        tests = {"p_raises": S.p_bootstrap(b <= 0), "p_steps": S.p_within(c, MARGIN),
                 "p_share": S.p_within(b + c, MARGIN)}
        S.adjust_family([(tests, k) for k in CLAIMS], options.study.alpha, method="holm")
        fit.update(tests, decided="; ".join(CLAIMS[k] for k in CLAIMS
                                            if tests["q" + k[1:]] < options.study.alpha)
                   or "none decided")
    return pl.DataFrame(rows, schema=LAW_SCHEMA), fit


def _interval(r: dict) -> str:
    return f"{r['estimate']:+.2f} [{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}]"


def law_text(law: pl.DataFrame, fit: dict) -> str:
    """One form's fit, claims and prediction at the study preset, or why it was not fitted."""
    if fit["lr"] is None:
        return f"Warmup law ({fit['form']}): {fit['note']}."
    t = {r["term"]: r for r in law.filter(pl.col("form") == fit["form"]).iter_rows(named=True)}
    bend = f" {t['d']['estimate']:+.3f} log2(warmup/30)^2" if "d" in t else ""
    out = (f"Warmup law, {fit['form']}, over {fit['points']}: log10(onset) = "
           f"{t['a']['estimate']:+.2f} {t['b']['estimate']:+.2f} log2(warmup/30) "
           f"{t['c']['estimate']:+.2f} log2(steps/300){bend}; "
           + ", ".join(f"{k} {_interval(v)}" for k, v in t.items() if k != "a")
           + f"; the points scatter about it by {fit['lack_of_fit']:.3f} decades beyond their "
           f"seed noise ({fit['seed_sd']:.3f}; {fit['df']} degrees of freedom).")
    if "decided" in fit:
        out += (f" Decided (Holm, 0.05; margin {MARGIN:.3f}): {fit['decided']} (adjusted p: "
                f"warmup raises it {fit['q_raises']:.2g}, steps {fit['q_steps']:.2g}, share "
                f"{fit['q_share']:.2g}).")
    out += (f" Predicted onset at the study preset's schedule (1,000 warmup steps of 24,414): "
            f"LR {fit['lr']:.3g} [{fit['ci_lo']:.3g}, {fit['ci_hi']:.3g}] (an extrapolation).")
    if fit["left_out"]:
        out += f" Left out: {fit['left_out']}; the claims are exploratory."
    return out


def score(fits: list[dict], measured: dict[str, dict]) -> pl.DataFrame:
    """Each form's prediction at each scored point that was measured: the error (measured minus
    predicted, decades; a bound where the measured onset lies beyond the LRs read) and whether
    the measured onset lies inside the prediction's interval."""
    rows = []
    for fit in fits:
        for p in fit["predictions"]:
            m = measured.get(p["point"])
            if m is None:
                continue
            side = m["side"]  # "", "above" or "below": the measured onset is a bound
            v = math.log10(m["lr"])
            lo, hi = math.log10(p["ci_lo"]), math.log10(p["ci_hi"])
            inside = (lo <= v <= hi) if not side else (hi > v if side == "above" else lo < v)
            rows.append({"form": p["form"], "point": p["point"], "predicted": p["lr"],
                         "ci_lo": p["ci_lo"], "ci_hi": p["ci_hi"], "measured": m["text"],
                         "error": ("> " if side == "above" else "< " if side else "")
                         + f"{v - p['log10_lr']:+.2f}", "inside": "inside" if inside else "outside"})
    return pl.DataFrame(rows, schema={"form": pl.String, "point": pl.String,
                                      "predicted": pl.Float64, "ci_lo": pl.Float64,
                                      "ci_hi": pl.Float64, "measured": pl.String,
                                      "error": pl.String, "inside": pl.String})
