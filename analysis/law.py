"""The warmup law over the ladder's width-64 points in two forms (docs/report.md): terms with
intervals, the straight form's three claims, and predictions with a new point's interval."""

from __future__ import annotations

import math
import zlib

import numpy as np
import polars as pl

from qkstudy.sweep.ladder import SCORED_POINTS, STUDY_POINT, WARMUP_POINTS, Point

from . import stats as S
from .hypotheses import small_sample_widening

WARMUP0, STEPS0 = 30, 300  # the anchor: the law's coefficients are per doubling from here
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
    rows = []
    for p in points:
        w, s = math.log2(p.warmup / WARMUP0), math.log2(p.steps / STEPS0)
        rows.append([1.0, w, s, w * w][:len(FORMS[form])])
    return np.array(rows)


def _t_scale(rng: np.random.Generator, df: int, size: int) -> np.ndarray:
    """Per draw the factor that turns a normal draw into Student's t with df degrees."""
    return np.sqrt(df / rng.chisquare(df, size))


def law_draws(points: list[Point], y: np.ndarray, draws: np.ndarray, seeds: int, form: str
              ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Least squares of the points' onsets y (log10) on the form's design: the estimate, the
    coefficient draws (each point's whole-seed draws refitted and widened by t / z, plus the
    lack of fit: the points' scatter about the law beyond their seed noise), the lack-of-fit
    variance and each point's mean seed variance (decades squared)."""
    x = design(points, form)
    n, p = x.shape
    pinv = np.linalg.pinv(x)
    est = pinv @ y
    k = small_sample_widening(seeds)
    point_draws = y + k * (draws - y)  # (B, points), widened about each point's estimate
    boot = point_draws @ pinv.T
    seed_var = float(point_draws.var(axis=0, ddof=1).mean())
    resid = y - x @ est
    lack = max(0.0, float(resid @ resid) / (n - p) - seed_var) if n > p else 0.0
    rng = np.random.default_rng(zlib.crc32(f"warmup-law/{form}".encode()))
    if lack > 0:
        chol = np.linalg.cholesky(lack * np.linalg.inv(x.T @ x))
        shift = rng.standard_normal((len(boot), p)) @ chol.T
        boot = boot + shift * _t_scale(rng, n - p, len(boot))[:, None]
    return est, boot, lack, seed_var


def predict(est: np.ndarray, boot: np.ndarray, lack: float, seed_var: float, point: Point,
            form: str, df: int) -> dict:
    """The form's onset at a point with the 95% interval of a new point's measured onset: the
    coefficient draws, the new point's own deviation from the law and its seed noise."""
    x0 = design([point], form)[0]
    rng = np.random.default_rng(zlib.crc32(f"warmup-law/{form}/{point.name}".encode()))
    own = rng.standard_normal(len(boot)) * math.sqrt(lack + seed_var) * _t_scale(
        rng, max(df, 1), len(boot))
    lo, hi = S.percentile_interval(boot @ x0 + own)
    return {"form": form, "point": point.name, "log10_lr": float(x0 @ est),
            "lr": 10 ** float(x0 @ est), "ci_lo": 10 ** lo, "ci_hi": 10 ** hi}


def predict_at(fit: dict, warmup: int, steps: int) -> dict:
    """A fitted form's prediction at any warmup and length, computed as fit_law computes its
    own: at the schedule of a point fit_law predicts (the study preset first), that point's
    prediction, interval included; elsewhere that of a width-64 point named by the schedule."""
    if fit["lr"] is None:
        raise ValueError(f"the {fit['form']} law is not fitted: {fit['note']}")
    same = [p for p in (STUDY_POINT, *SCORED_POINTS) if (p.warmup, p.steps) == (warmup, steps)]
    point = same[0] if same else Point(f"w64-s{steps}-wu{warmup}", 64, steps, warmup)
    return predict(*fit["draws"], point, fit["form"], fit["df"])


def law_band(fit: dict, steps: int, warmups: list[float]) -> list[dict]:
    """A fitted form's onset along warmups at one training length, with `predict`'s 95% interval
    of a new point's measured onset from the fit's draws; one seed for the whole line (its key
    names the length), so the band is smooth."""
    return [predict(*fit["draws"], Point(f"law band/s{steps}", 64, steps, w), fit["form"],
                    fit["df"]) | {"warmup": w, "steps": steps} for w in warmups]


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
    est, boot, lack, seed_var = law_draws(pts, y, np.stack([r.onset.draws for r in law], axis=1),
                                          min(r.seeds for r in law), form)
    terms = {t: (est[i], boot[:, i]) for i, t in enumerate(FORMS[form])}
    if form == "straight":
        terms["b + c"] = (est[1] + est[2], boot[:, 1] + boot[:, 2])
    rows = [{"form": form, "term": t, "estimate": float(e),
             **dict(zip(("ci_lo", "ci_hi"), S.percentile_interval(d)))}
            for t, (e, d) in terms.items()]
    df = len(law) - len(FORMS[form])
    fit.update(lack_of_fit=math.sqrt(lack), seed_sd=math.sqrt(seed_var), df=df,
               exploratory=bool(left_out), draws=(est, boot, lack, seed_var),
               predictions=[predict(est, boot, lack, seed_var, p, form, df) for p in PREDICTED])
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
