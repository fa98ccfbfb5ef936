"""The tests of H1-H3, fixed by the analysis plan (docs/report.md) before any data: H1 per
(depth, compared arm, LR) cell on the paired gaps (Benjamini-Hochberg per arm), H2 pooled over
depths by exact sign-flip tests (Holm), H3 the onset's slope against depth (bootstrap, Holm)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from qkstudy.sweep.adaptive import near_beyond_margin

from . import stats as S
from .metrics import (ARM, Options, compared_arms, full_curves, lr_sensitivity_per_seed,
                      max_usable_lr_per_seed, pair_arms, paired_gaps, with_losses)
from .threshold import BELOW, DepthDraws, gap_matrix

OFF_WORSE, ON_WORSE, NO_DIFFERENCE, UNDETERMINED, UNINFORMATIVE, TOO_FEW = (
    "off worse", "on worse", "no difference", "undetermined", "uninformative", "too few seeds")

GAP_SCHEMA = {"depth": pl.Int64, "compared_arm": pl.String, "lr": pl.Float64, "pairs": pl.Int64,
              "mean_gap": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
              "gap_sd": pl.Float64, "seed_gaps": pl.String, "spread": pl.String,
              "p_off_worse": pl.Float64, "p_on_worse": pl.Float64, "p_equivalent": pl.Float64,
              "q_off_worse": pl.Float64, "q_on_worse": pl.Float64, "q_equivalent": pl.Float64,
              "family_size": pl.Int64, "decision": pl.String, "informative": pl.Boolean,
              "off_diverged": pl.Int64, "on_diverged": pl.Int64, "off_degraded": pl.Int64,
              "on_degraded": pl.Int64, "loss_off": pl.Float64, "loss_on": pl.Float64,
              "significant": pl.Boolean, "worse": pl.Boolean, "no_difference": pl.Boolean,
              "both_diverged": pl.Boolean, "needed": pl.Boolean, "near_margin": pl.Boolean}

BEST_SCHEMA = {"depth": pl.Int64, "compared_arm": pl.String, "pairs": pl.Int64,
               "best_loss_off": pl.Float64, "best_loss_on": pl.Float64, "mean_gap": pl.Float64,
               "ci_lo": pl.Float64, "ci_hi": pl.Float64, "seed_gaps": pl.String,
               "p_off_worse": pl.Float64, "q_off_worse": pl.Float64, "family_size": pl.Int64,
               "decision": pl.String}


def _cell(g: dict[str, list], options: Options) -> dict:
    """One cell's interval and raw p-values (`g`: its paired_gaps columns)."""
    values = g["gap"]
    n = len(values)
    off_failed = [a or b for a, b in zip(g["diverged_off"], g["degraded_off"])]
    on_failed = [a or b for a, b in zip(g["diverged_on"], g["degraded_on"])]
    failed = all(off_failed) and all(on_failed)
    tested = n >= 2 and not failed
    m = options.min_gap
    lo, hi = S.interval(values) if n >= 2 else (None, None)
    # a gap made by a divergence is a yes/no event, not a precise number: sign-flip tests
    mixed = any(g["diverged_off"]) or any(g["diverged_on"])
    greater = S.p_signflip if mixed else S.p_greater
    return {
        "pairs": n, "mean_gap": float(np.mean(values)), "ci_lo": lo, "ci_hi": hi,
        "gap_sd": float(np.std(values, ddof=1)) if n > 1 else None,
        "seed_gaps": ", ".join(f"{v:+.3g}" for v in values), "spread": f"n={n}",
        "p_off_worse": greater([v - m for v in values]) if tested else None,
        "p_on_worse": greater([-v - m for v in values]) if tested else None,
        "p_equivalent": ((S.p_signflip_equivalent(values, m) if mixed
                          else S.p_equivalent(values, m)) if tested else None),
        "informative": not failed,
        "off_diverged": sum(g["diverged_off"]), "on_diverged": sum(g["diverged_on"]),
        "off_degraded": sum(g["degraded_off"]), "on_degraded": sum(g["degraded_on"]),
        "loss_off": float(np.mean(g["loss_off"])), "loss_on": float(np.mean(g["loss_on"])),
        "both_diverged": sum(g["diverged_on"]) == n}


def mark_near_margin(cells: list[dict], margin: float) -> None:
    """near_margin: another LR of the cell's (compared arm, depth) within NEAR_DECADES has its
    seed-mean gap beyond the margin (near_beyond_margin), so "no difference" is not decided
    there; its TOST stays in the family (the sweep's adaptive seeds close cells by this rule)."""
    means: dict[tuple[str, int], dict[float, float]] = {}
    for c in cells:
        if c["informative"]:
            means.setdefault((c["compared_arm"], c["depth"]), {})[c["lr"]] = c["mean_gap"]
    for c in cells:
        c["near_margin"] = near_beyond_margin(
            c["lr"], means.get((c["compared_arm"], c["depth"]), {}), margin)


def decided(row: dict, claims: dict[str, str], alpha: float) -> str:
    """The decision of the first claim (q column: decision) whose adjusted p is below alpha."""
    return next((d for q, d in claims.items() if row[q] is not None and row[q] < alpha),
                UNDETERMINED)


H1_CLAIMS = {"q_off_worse": OFF_WORSE, "q_on_worse": ON_WORSE, "q_equivalent": NO_DIFFERENCE}
NEAR_MARGIN_CLAIMS = {q: d for q, d in H1_CLAIMS.items() if d != NO_DIFFERENCE}


def best_loss_gaps(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, compared_arm, seed): each arm's best finite final loss."""
    p = with_losses(full_curves(points)).filter(pl.col("loss").is_finite())
    best = p.group_by("depth", ARM, "seed").agg(best=pl.col("loss").min())
    return pair_arms(best, ["depth", "seed"]).sort("compared_arm", "depth", "seed")


def h1_tests(points: pl.DataFrame, options: Options) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(gap cells, best-loss gaps): H1's family, adjusted per compared arm."""
    gaps = paired_gaps(points, options).sort("compared_arm", "depth", "lr", "seed")
    cells = [{"depth": depth, "compared_arm": on, "lr": lr,
              **_cell(g.to_dict(as_series=False), options)}
             for (on, depth, lr), g in gaps.group_by("compared_arm", "depth", "lr",
                                                      maintain_order=True)]
    mark_near_margin(cells, options.min_gap)
    best_rows = []
    for (on, depth), g in best_loss_gaps(points).group_by("compared_arm", "depth",
                                                          maintain_order=True):
        values = (g["best"] - g["best_on"]).to_list()
        lo, hi = S.interval(values)
        best_rows.append({"depth": depth, "compared_arm": on, "pairs": len(values),
                          "best_loss_off": float(g["best"].mean()),
                          "best_loss_on": float(g["best_on"].mean()),
                          "mean_gap": float(np.mean(values)), "ci_lo": lo, "ci_hi": hi,
                          "seed_gaps": ", ".join(f"{v:+.3g}" for v in values),
                          "p_off_worse": S.p_greater(values)})
    for on in {c["compared_arm"] for c in cells} | {b["compared_arm"] for b in best_rows}:
        keys = [(c, k) for c in cells if c["compared_arm"] == on
                for k in ("p_off_worse", "p_on_worse", "p_equivalent")]
        keys += [(b, "p_off_worse") for b in best_rows if b["compared_arm"] == on]
        S.adjust_family(keys, options.alpha)
    for c in cells:
        c["decision"] = (TOO_FEW if c["pairs"] < 2 else UNINFORMATIVE if not c["informative"]
                         else decided(c, NEAR_MARGIN_CLAIMS if c["near_margin"] else H1_CLAIMS,
                                      options.alpha))
        c.update(significant=None if c["q_off_worse"] is None else c["q_off_worse"] < options.alpha,
                 worse=c["decision"] == OFF_WORSE, no_difference=c["decision"] == NO_DIFFERENCE,
                 needed=None)
    for b in best_rows:
        b["decision"] = (TOO_FEW if b["pairs"] < 2
                         else decided(b, {"q_off_worse": OFF_WORSE}, options.alpha))
    return (pl.DataFrame(cells, schema=GAP_SCHEMA).sort("compared_arm", "depth", "lr"),
            pl.DataFrame(best_rows, schema=BEST_SCHEMA).sort("compared_arm", "depth"))


def mark_needed(gaps: pl.DataFrame, thresholds: pl.DataFrame) -> pl.DataFrame:
    """`needed`: the cell is "off worse" and lies at or above its depth's onset."""
    return (gaps.drop("needed")
            .join(thresholds.select("depth", "compared_arm", "onset_lr", "outside"),
                  on=["depth", "compared_arm"], how="left")
            .with_columns(needed=(pl.col("decision") == OFF_WORSE)
                          & ((pl.col("outside") == BELOW)
                             | (pl.col("lr") >= pl.col("onset_lr")).fill_null(False)))
            .drop("onset_lr", "outside").select(list(GAP_SCHEMA))
            .sort("compared_arm", "depth", "lr"))


H2_SCHEMA = {"depth": pl.Int64, "compared_arm": pl.String, "measure": pl.String, "role": pl.String,
             "pairs": pl.Int64, "effect": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
             "unit": pl.String, "per_seed": pl.String, "resolution": pl.Float64,
             "p_for": pl.Float64, "p_against": pl.Float64, "p_equivalent": pl.Float64,
             "smallest_p": pl.Float64, "q_for": pl.Float64, "q_against": pl.Float64,
             "q_equivalent": pl.Float64, "family_size": pl.Int64, "decision": pl.String,
             "note": pl.String}

MAX_USABLE, SENSITIVITY = "max usable LR", "LR sensitivity"
H2_MEASURES = (MAX_USABLE, SENSITIVITY)
PRIMARY, PER_DEPTH = "primary", "per depth (descriptive)"


def _h2_units(per_seed: pl.DataFrame, sensitivity: pl.DataFrame, on: str, measure: str
              ) -> pl.DataFrame:
    """Per (depth, seed) in both arms: diff (on vs off), off_censored and resolution."""
    if measure == SENSITIVITY:
        s = sensitivity.drop_nulls("lr_sensitivity").select("depth", ARM, "seed",
                                                            v="lr_sensitivity")
        units = pair_arms(s, ["depth", "seed"]).with_columns(
            diff=pl.col("v") - pl.col("v_on"), off_censored=pl.lit(False),
            resolution=pl.lit(None, pl.Float64))
    else:
        res = pl.col("first_failed_lr") / pl.col("max_usable_lr")
        cols = per_seed.drop_nulls("max_usable_lr").select(
            "depth", ARM, "seed", v="max_usable_lr", res=res, cens="lower_bound")
        units = pair_arms(cols, ["depth", "seed"]).with_columns(
            diff=(pl.col("v_on") / pl.col("v")).log(), off_censored="cens",
            resolution=pl.when(pl.col("res").is_not_null() & pl.col("res_on").is_not_null())
            .then(pl.max_horizontal("res", "res_on")))
    return units.filter(pl.col("compared_arm") == on).sort("depth", "seed")


def _h2_row(on: str, depth: int | None, measure: str, role: str, units: pl.DataFrame,
            options: Options, seed_ids: list[int]) -> dict:
    """One H2 row: the effect, its whole-seed interval and (pooled rows) the sign-flip tests."""
    diffs = units["diff"].to_list()
    log_scale = measure == MAX_USABLE
    margin = math.log(options.lr_ratio_margin) if log_scale else options.min_gap
    matrix = gap_matrix(units.select("seed", lr="depth", gap="diff"), seed_ids,
                        sorted(set(units["depth"].to_list())))  # (seeds, depths)
    lo = hi = None
    if len(diffs) >= 2 and len(set(units["seed"].to_list())) >= 2:
        means, counts = S.seed_bootstrap(matrix, S.seed_draws(len(seed_ids), options.bootstrap,
                                                              f"h2/{on}/{measure}{options.draw_key}"))
        with np.errstate(invalid="ignore"):
            pooled = np.nansum(means * counts, axis=1) / counts.sum(axis=1)
        finite = pooled[np.isfinite(pooled)]
        lo, hi = S.percentile_interval(finite) if finite.size else (None, None)
    censored = int(units["off_censored"].sum())
    resolution = (units["resolution"].max() if units.height
                  and not units["resolution"].null_count() else None)
    seeds = units["seed"].n_unique()
    tested = role != PER_DEPTH and seeds >= 2 and not censored
    row = {"depth": depth, "compared_arm": on, "measure": measure, "role": role,
           "pairs": len(diffs),
           "effect": math.exp(np.mean(diffs)) if log_scale else float(np.mean(diffs)),
           "ci_lo": None if lo is None else (math.exp(lo) if log_scale else lo),
           "ci_hi": None if hi is None else (math.exp(hi) if log_scale else hi),
           "unit": "ratio on/off (geometric mean)" if log_scale else "nats (off - on)",
           "per_seed": ", ".join((f"x{math.exp(x):.3g}" if log_scale else f"{x:+.3g}")
                                 for x in diffs),
           "resolution": resolution,
           "p_for": S.p_signflip([x - margin for x in diffs]) if tested else None,
           "p_against": S.p_signflip([-x - margin for x in diffs]) if tested else None,
           "p_equivalent": None, "smallest_p": None,
           "q_for": None, "q_against": None, "q_equivalent": None, "family_size": 0,
           "decision": PER_DEPTH if role == PER_DEPTH else None, "note": ""}
    if tested:
        row["smallest_p"] = 0.5 ** (sum(1 for x in diffs if x != 0) or len(diffs))
        coarse = log_scale and (resolution is None or resolution > options.equivalence_bracket)
        if coarse:
            row["note"] = (f"equivalence not tested: a boundary known only to within "
                           f"x{resolution:.3g}, not x{options.equivalence_bracket:g} or finer"
                           if resolution is not None else
                           "equivalence not tested: a boundary is not bracketed")
        else:
            row["p_equivalent"] = S.p_signflip_equivalent(diffs, margin)
    elif censored and role != PER_DEPTH:
        row["note"] = (f"off never diverged or degraded above its best LR in {censored} "
                       "(depth, seed) units: a lower bound only")
    return row


def h2_tests(points: pl.DataFrame, options: Options) -> pl.DataFrame:
    """Per compared arm and measure: the pooled, tested row and one descriptive row per depth."""
    rows = []
    per_seed = max_usable_lr_per_seed(points, options)
    sensitivity = lr_sensitivity_per_seed(points)
    for on in compared_arms(points):
        for measure in H2_MEASURES:
            units = _h2_units(per_seed, sensitivity, on, measure)
            if not units.height:
                continue
            seed_ids = sorted(set(units["seed"].to_list()))
            rows.append(_h2_row(on, None, measure, PRIMARY, units, options, seed_ids))
            for d in sorted(set(units["depth"].to_list())):
                rows.append(_h2_row(on, d, measure, PER_DEPTH,
                                    units.filter(pl.col("depth") == d), options, seed_ids))
    a = options.alpha
    for on in {r["compared_arm"] for r in rows}:
        family = [r for r in rows if r["compared_arm"] == on and r["role"] == PRIMARY]
        S.adjust_family([(r, k) for r in family for k in ("p_for", "p_against", "p_equivalent")],
                        a, method="holm")
    for r in (r for r in rows if r["decision"] is None):
        r["decision"] = ((UNDETERMINED if r["note"] else TOO_FEW) if r["p_for"] is None
                         else decided(r, {f"q_{d}": d for d in ("for", "against", "equivalent")},
                                      a))
    return pl.DataFrame(rows, schema=H2_SCHEMA).sort(
        "compared_arm", "measure", pl.col("depth").fill_null(0))


H3_SCHEMA = {"compared_arm": pl.String, "depths": pl.String, "slope": pl.Float64,
             "ci_lo": pl.Float64, "ci_hi": pl.Float64, "censored_share": pl.Float64,
             "p_fall": pl.Float64, "p_rise": pl.Float64, "p_equal": pl.Float64,
             "q_fall": pl.Float64, "q_rise": pl.Float64, "q_equal": pl.Float64,
             "family_size": pl.Int64, "decision": pl.String, "note": pl.String}


def slope(depths: list[int], log_thresholds: np.ndarray) -> np.ndarray:
    """Least-squares slope of log10(onset) on log2(depth) per row; NaN if one is infinite."""
    x = np.log2(np.asarray(depths, float))
    x = x - x.mean()
    y = np.atleast_2d(log_thresholds)
    with np.errstate(invalid="ignore"):
        out = (y - y.mean(axis=1, keepdims=True)) @ x / (x @ x)
    return np.where(np.isfinite(y).all(axis=1), out, np.nan)


def small_sample_widening(seeds: int) -> float:
    """t(0.975, n - 1) / z(0.975): how much wider a t-interval of n seeds is than a normal one."""
    return float(S.stats.t.ppf(0.975, max(seeds - 1, 1)) / S.stats.norm.ppf(0.975))


def h3_tests(points: pl.DataFrame, draws: dict[tuple[str, int], DepthDraws],
             options: Options) -> pl.DataFrame:
    """Per compared arm with >= 2 depths: the onset's slope, its interval and tests."""
    rows = []
    for on in compared_arms(points):
        depths = sorted(d for (k, d) in draws if k == on)
        if len(depths) < 2:
            continue
        mine = [draws[(on, d)] for d in depths]
        point = float(slope(depths, np.array([[x.point for x in mine]]))[0])
        boot = slope(depths, np.stack([x.draws for x in mine], axis=1))
        # a few seeds' bootstrap is too narrow (77-87% coverage at 5 seeds): widened
        k = options.slope_widening or small_sample_widening(min(x.seeds for x in mine))
        boot = point + k * (boot - point)
        # a draw with some depth's onset at a bound it lies beyond
        censored = np.any([np.isin(x.draws, x.bounds) for x in mine], axis=0)
        undefined = np.isnan(boot)
        finite = boot[~undefined]
        lo, hi = S.percentile_interval(finite) if finite.size else (math.nan, math.nan)
        outside = [d for d, x in zip(depths, mine) if not math.isfinite(x.point)]
        exact = S.is_exact(len(boot), max(x.seeds for x in mine))
        rows.append({
            "compared_arm": on, "depths": ", ".join(map(str, depths)), "slope": point,
            "ci_lo": lo, "ci_hi": hi, "censored_share": float(censored.mean()),
            "p_fall": S.p_bootstrap(undefined | (boot >= 0), exact),
            "p_rise": S.p_bootstrap(undefined | (boot <= 0), exact),
            "p_equal": S.p_within(boot, options.slope_margin, exact),
            "q_fall": None, "q_rise": None, "q_equal": None, "family_size": 0,
            "decision": None,
            "note": (f"onset outside the LRs read at depth {', '.join(map(str, outside))}:"
                     " no slope" if outside else "")})
    for r in rows:
        S.adjust_family([(r, k) for k in ("p_fall", "p_rise", "p_equal")], options.alpha,
                        method="holm")
        r["decision"] = decided(r, {"q_fall": "falls", "q_rise": "rises", "q_equal": "equal"},
                                options.alpha)
    return pl.DataFrame(rows, schema=H3_SCHEMA).sort("compared_arm")
