"""Study metrics in Polars: LR sensitivity, max stable LR, optimal LR, necessity threshold,
verdicts.

Every function takes a "points" frame with one row per finished run of one setting and one
framework: depth, qk_norm, lr, seed, status (completed | diverged), init_loss, final_val_loss
(and optionally refine). `qk_norm == "none"` is the off arm; every other value is an on arm.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np
import polars as pl

OFF = "none"
ARM_KEYS = ("depth", "qk_norm")


@dataclass(frozen=True)
class Options:
    """Knobs of the study metrics (all visible in the report)."""

    noise_k: float = 2.0  # "worse by more than seed noise": mean gap > noise_k * seed std
    n_boot: int = 1000  # bootstrap resamples of the seeds for the necessity threshold
    boot_seed: int = 0
    interval: float = 0.95


def with_losses(points: pl.DataFrame) -> pl.DataFrame:
    """Add `diverged`, `loss` (+inf for a diverged run) and `loss_clipped` = min(loss, init_loss).

    Wortsman et al. 2023 (arXiv:2309.14322, Sec. 2.2) clip each final loss at the loss at
    initialisation, so a diverged run counts as init_loss. A run without its own init_loss
    borrows the mean init_loss of its (depth, qk_norm) arm.
    """
    init = pl.coalesce(pl.col("init_loss"), pl.col("init_loss").mean().over(ARM_KEYS))
    loss = (pl.when(pl.col("status") == "diverged").then(pl.lit(math.inf))
            .otherwise(pl.col("final_val_loss").fill_nan(None)))
    return (points.with_columns(diverged=pl.col("status") == "diverged", loss=loss,
                                init_loss=init)
            .with_columns(loss_clipped=pl.min_horizontal("loss", "init_loss"))
            .filter(pl.col("loss").is_not_null()))


def mark_base_grid(points: pl.DataFrame) -> pl.DataFrame:
    """Add `in_grid` (the LR belongs to the base grid used by LR sensitivity) and `grid_rule`.

    Refinement runs are extra LRs between the last stable and first divergent grid point; they
    must not enter LR sensitivity, and both arms must be scored on the same points. In order:
    - "marked": some run carries a `refine` flag (config.json, summary.json, or the sweep
      folder's sweep.json grid): unmarked LRs run for every (qk_norm, seed) of the depth;
    - "common": LRs run for every (depth, qk_norm, seed) of the study, which also makes LR
      sensitivity comparable across depths (needs >= 2 such LRs);
    - "per depth": otherwise, LRs run for every (qk_norm, seed) of that depth.
    """
    marked = "refine" in points.columns and points["refine"].is_not_null().any()
    candidate = ~pl.col("refine").fill_null(False) if marked else pl.lit(True)
    pairs, triples = pl.struct("qk_norm", "seed"), pl.struct("depth", "qk_norm", "seed")
    p = points.with_columns(
        _per_depth=candidate & (pairs.filter(candidate).n_unique().over("depth", "lr")
                                == pairs.n_unique().over("depth")),
        _common=triples.n_unique().over("lr") == triples.n_unique())
    if marked:
        return p.with_columns(in_grid="_per_depth", grid_rule=pl.lit("marked")).drop(
            "_per_depth", "_common")
    common = p.filter("_common")["lr"].n_unique() >= 2
    return (p.with_columns(in_grid="_common" if common else "_per_depth",
                           grid_rule=pl.lit("common" if common else "per depth"))
            .drop("_per_depth", "_common"))


def lr_sensitivity_per_seed(points: pl.DataFrame) -> pl.DataFrame:
    """Wortsman et al. 2023, Sec. 2.2: LR sensitivity = E_lr[min(loss(lr), init_loss)] - loss*.

    The expectation is the mean over the base-grid LRs (divide by the number of grid points) and
    loss* = min over the grid of loss(lr), computed for each (depth, qk_norm, seed). Null when
    every grid point diverged (loss* undefined) or the grid has fewer than two points.
    """
    grid = with_losses(points)
    if "in_grid" not in grid.columns:
        grid = mark_base_grid(grid)
    best = pl.col("loss").min()
    return (grid.filter("in_grid").group_by(*ARM_KEYS, "seed")
            .agg(grid_points=pl.len(), mean_clipped_loss=pl.col("loss_clipped").mean(),
                 best_loss=best, lr_min=pl.col("lr").min(), lr_max=pl.col("lr").max(),
                 grid_rule=pl.col("grid_rule").first())
            .with_columns(lr_sensitivity=pl.when(pl.col("best_loss").is_finite()
                                                 & (pl.col("grid_points") >= 2))
                          .then(pl.col("mean_clipped_loss") - pl.col("best_loss")))
            .sort(*ARM_KEYS, "seed"))


def lr_sensitivity(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, qk_norm): LR sensitivity averaged over seeds, with its spread."""
    return (lr_sensitivity_per_seed(points).group_by(ARM_KEYS)
            .agg(lr_sensitivity=pl.col("lr_sensitivity").mean(),
                 lr_sensitivity_sd=pl.col("lr_sensitivity").std(),
                 sensitivity_seeds=pl.col("lr_sensitivity").count(),
                 grid_points=pl.col("grid_points").max(),
                 grid_lr_min=pl.col("lr_min").min(), grid_lr_max=pl.col("lr_max").max(),
                 grid_rule=pl.col("grid_rule").first())
            .sort(ARM_KEYS))


def _geo_mean(col: str) -> pl.Expr:
    return pl.col(col).log().mean().exp()


def max_stable_lr_per_seed(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, qk_norm, seed), over every LR run (grid and refinement points).

    first_divergent_lr: the smallest LR that diverged. max_stable_lr: the largest LR below it
    that did not diverge (so refinement runs between the last stable and first divergent grid
    point tighten it). With no divergence it is the largest LR run, a lower bound (censored).
    """
    p = with_losses(points)
    first_div = pl.col("lr").filter(pl.col("diverged")).min()
    return (p.group_by(*ARM_KEYS, "seed")
            .agg(first_divergent_lr=first_div,
                 max_stable_lr=pl.col("lr").filter(~pl.col("diverged") & (
                     first_div.is_null() | (pl.col("lr") < first_div))).max(),
                 lrs_run=pl.len())
            .with_columns(censored=pl.col("first_divergent_lr").is_null())
            .sort(*ARM_KEYS, "seed"))


def max_stable_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, qk_norm): geometric mean over seeds of max stable LR, its range, censoring."""
    return (max_stable_lr_per_seed(points).group_by(ARM_KEYS)
            .agg(max_stable_lr=_geo_mean("max_stable_lr"),
                 max_stable_lr_lo=pl.col("max_stable_lr").min(),
                 max_stable_lr_hi=pl.col("max_stable_lr").max(),
                 first_divergent_lr=_geo_mean("first_divergent_lr"),
                 stable_seeds=pl.len(), censored_seeds=pl.col("censored").sum())
            .sort(ARM_KEYS))


def optimal_lr(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, qk_norm): the LR of lowest final loss per seed (geometric mean over seeds)
    and that best loss (mean and sd over seeds). Diverged runs count as +inf, never best."""
    p = with_losses(points).filter(pl.col("loss").is_finite())
    per_seed = (p.group_by(*ARM_KEYS, "seed")
                .agg(optimal_lr=pl.col("lr").sort_by("loss").first(),
                     best_loss=pl.col("loss").min()))
    return (per_seed.group_by(ARM_KEYS)
            .agg(optimal_lr=_geo_mean("optimal_lr"), optimal_lr_lo=pl.col("optimal_lr").min(),
                 optimal_lr_hi=pl.col("optimal_lr").max(), best_loss=pl.col("best_loss").mean(),
                 best_loss_sd=pl.col("best_loss").std(), best_seeds=pl.len())
            .sort(ARM_KEYS))


def arm_table(points: pl.DataFrame) -> pl.DataFrame:
    """One row per (depth, qk_norm): run counts, LR sensitivity, max stable LR, optimum."""
    p = with_losses(points)
    counts = p.group_by(ARM_KEYS).agg(runs=pl.len(), diverged=pl.col("diverged").sum(),
                                      seeds=pl.col("seed").n_unique(), lrs=pl.col("lr").n_unique())
    out = counts
    for part in (lr_sensitivity(points), max_stable_lr(points), optimal_lr(points)):
        out = out.join(part, on=ARM_KEYS, how="left")
    return out.sort(ARM_KEYS)


# --- QK-norm off minus on ---------------------------------------------------------------------

def seed_noise(points: pl.DataFrame) -> pl.DataFrame:
    """Per (depth, on_kind): the median over (arm, LR) cells of the across-seed std of final loss.

    Only cells with >= 2 seeds and no divergence count (a diverged run has no final loss).
    This one yardstick per depth is steadier than a std from two or three seeds at one LR.
    """
    p = with_losses(points)
    cells = (p.group_by("depth", "qk_norm", "lr")
             .agg(sd=pl.col("loss").std(), n=pl.len(), div=pl.col("diverged").any())
             .filter((pl.col("n") >= 2) & ~pl.col("div") & pl.col("sd").is_not_null()))
    frames = []
    for on in _on_kinds(p):
        frames.append(cells.filter(pl.col("qk_norm").is_in([OFF, on]))
                      .group_by("depth").agg(seed_noise=pl.col("sd").median(),
                                             noise_cells=pl.len())
                      .with_columns(on_kind=pl.lit(on)))
    schema = {"depth": pl.Int64, "seed_noise": pl.Float64, "noise_cells": pl.UInt32,
              "on_kind": pl.String}
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def _on_kinds(points: pl.DataFrame) -> list[str]:
    return sorted(k for k in points["qk_norm"].unique().to_list() if k != OFF)


def paired_gaps(points: pl.DataFrame) -> pl.DataFrame:
    """One row per (depth, on_kind, lr, seed) run in both arms: gap = off - on (clipped losses)."""
    p = with_losses(points).select("depth", "qk_norm", "lr", "seed", "loss_clipped", "diverged")
    off = p.filter(pl.col("qk_norm") == OFF).drop("qk_norm")
    frames = []
    for on in _on_kinds(p):
        on_runs = p.filter(pl.col("qk_norm") == on).drop("qk_norm")
        frames.append(off.join(on_runs, on=["depth", "lr", "seed"], suffix="_on")
                      .rename({"loss_clipped": "loss_off", "loss_clipped_on": "loss_on",
                               "diverged": "diverged_off"})
                      .with_columns(on_kind=pl.lit(on), gap=pl.col("loss_off") - pl.col("loss_on")))
    if not frames:
        return pl.DataFrame(schema={"depth": pl.Int64, "lr": pl.Float64, "seed": pl.Int64,
                                    "loss_off": pl.Float64, "diverged_off": pl.Boolean,
                                    "loss_on": pl.Float64, "diverged_on": pl.Boolean,
                                    "on_kind": pl.String, "gap": pl.Float64})
    return pl.concat(frames).sort("on_kind", "depth", "lr", "seed")


def gap_table(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, on_kind, lr): mean gap over paired seeds, divergence counts, and `needed`.

    needed: off is worse than on by more than noise_k x seed noise, or off diverged (any seed)
    while on diverged in none.
    """
    gaps = paired_gaps(points)
    noise = seed_noise(points)
    table = (gaps.group_by("depth", "on_kind", "lr")
             .agg(mean_gap=pl.col("gap").mean(), gap_sd=pl.col("gap").std(), pairs=pl.len(),
                  off_diverged=pl.col("diverged_off").sum(),
                  on_diverged=pl.col("diverged_on").sum(),
                  loss_off=pl.col("loss_off").mean(), loss_on=pl.col("loss_on").mean())
             .join(noise, on=["depth", "on_kind"], how="left"))
    beyond_noise = pl.col("mean_gap") > options.noise_k * pl.col("seed_noise")
    only_off = (pl.col("off_diverged") > 0) & (pl.col("on_diverged") == 0)
    return (table.with_columns(needed=(only_off | beyond_noise.fill_null(False))
                               & pl.col("seed_noise").is_not_null())
            .sort("on_kind", "depth", "lr"))


def _threshold_from(lrs: np.ndarray, gap: np.ndarray, off_div: np.ndarray, on_div: np.ndarray,
                    present: np.ndarray, limit: float) -> np.ndarray:
    """Smallest needed LR along axis 0 (inf if none) for arrays (L, ..., n_seeds)."""
    n = present.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_gap = np.where(present, gap, 0.0).sum(axis=-1) / n
    needed = (n > 0) & (((off_div & present).any(axis=-1) & ~(on_div & present).any(axis=-1))
                        | (mean_gap > limit))
    first = np.argmax(needed, axis=0)
    return np.where(needed.any(axis=0), lrs[first], np.inf)


def necessity_threshold(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """Per (depth, on_kind): the smallest LR at which QK-norm is needed, with a bootstrap interval.

    The bootstrap resamples the paired seeds with replacement (the seed noise yardstick stays
    fixed: a resample that repeats one seed has no spread of its own) and recomputes the
    threshold; "none" counts as +inf, above every LR run. Intervals use observed values only.
    """
    gaps = paired_gaps(points)
    noise = seed_noise(points)
    rows = []
    rng = np.random.default_rng(options.boot_seed)
    for (on, depth), group in gaps.group_by("on_kind", "depth", maintain_order=True):
        lrs = np.array(sorted(group["lr"].unique().to_list()))
        seeds = sorted(group["seed"].unique().to_list())
        n_seeds = len(seeds)
        noise_row = noise.filter((pl.col("depth") == depth) & (pl.col("on_kind") == on))
        sd = noise_row["seed_noise"][0] if noise_row.height else None
        row = {"depth": depth, "on_kind": on, "seeds": n_seeds, "lrs": len(lrs),
               "lr_min": float(lrs.min()), "lr_max": float(lrs.max()), "seed_noise": sd,
               "noise_k": options.noise_k, "threshold_lr": None, "threshold_lo": None,
               "threshold_hi": None, "found_fraction": None, "note": ""}
        if sd is None or n_seeds < 2:
            row["note"] = "not enough data: seed noise needs >= 2 seeds of a stable cell"
            rows.append(row)
            continue
        shape = (len(lrs), n_seeds)
        gap, off_div, on_div = np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, bool)
        present = np.zeros(shape, bool)
        li = {v: i for i, v in enumerate(lrs)}
        si = {v: i for i, v in enumerate(seeds)}
        for r in group.iter_rows(named=True):
            i, j = li[r["lr"]], si[r["seed"]]
            gap[i, j], off_div[i, j], on_div[i, j] = r["gap"], r["diverged_off"], r["diverged_on"]
            present[i, j] = True
        limit = options.noise_k * sd
        point = float(_threshold_from(lrs, gap, off_div, on_div, present, limit))
        idx = rng.integers(0, n_seeds, size=(options.n_boot, n_seeds))  # (B, n)
        boot = _threshold_from(lrs, gap[:, idx], off_div[:, idx], on_div[:, idx],
                               present[:, idx], limit)  # (B,)
        tail = (1 - options.interval) / 2
        lo = float(np.quantile(boot, tail, method="lower"))
        hi = float(np.quantile(boot, 1 - tail, method="higher"))
        row.update(threshold_lr=point if math.isfinite(point) else None,
                   threshold_lo=lo if math.isfinite(lo) else None,
                   threshold_hi=hi if math.isfinite(hi) else None,
                   found_fraction=float(np.isfinite(boot).mean()))
        if not math.isfinite(point):
            row["note"] = f"off never worse beyond noise up to lr {lrs.max():.3g}"
        elif not math.isfinite(hi):
            row["note"] = f"upper end: none found in some resamples (> {lrs.max():.3g})"
        rows.append(row)
    schema = {"depth": pl.Int64, "on_kind": pl.String, "seeds": pl.Int64, "lrs": pl.Int64,
              "lr_min": pl.Float64, "lr_max": pl.Float64, "seed_noise": pl.Float64,
              "noise_k": pl.Float64, "threshold_lr": pl.Float64, "threshold_lo": pl.Float64,
              "threshold_hi": pl.Float64, "found_fraction": pl.Float64, "note": pl.String}
    return pl.DataFrame(rows, schema=schema).sort("on_kind", "depth")


# --- hypotheses -------------------------------------------------------------------------------

SUPPORTED, NOT_SUPPORTED, MIXED, NO_DATA = ("supported", "not supported", "mixed",
                                            "not enough data")


def _combine(verdicts: list[str]) -> str:
    """Parts that lack data are left out; the rest must agree, else "mixed"."""
    known = {v for v in verdicts if v != NO_DATA}
    if not known:
        return NO_DATA
    return known.pop() if len(known) == 1 else MIXED


def _lr(x: float | None) -> str:
    return "none" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _measured(parts: list[str]) -> str:
    return f"{sum(p != NO_DATA for p in parts)} of {len(parts)}"


def verdicts(points: pl.DataFrame, options: Options = Options()) -> pl.DataFrame:
    """H1-H3 per on_kind, each with the per-depth numbers behind it.

    H1 (effect is LR-conditional): at a depth, supported when a necessity threshold exists and
    some lower LR shows no difference beyond noise; not supported when off is already worse at
    every LR below the threshold (or at the lowest LR), or never worse although off diverged
    somewhere; not enough data when off never diverged and was never worse (the grid did not
    reach the unstable region) or seed noise is unknown.
    H2 (QK-norm raises max stable LR and lowers LR sensitivity): judged per depth and part; a
    max stable LR is not measurable when off never diverged (a lower bound only); LR
    sensitivity must drop by more than noise_k standard errors of the difference of the seed
    means (so it needs >= 2 seeds per arm).
    H3 (the necessity LR falls with depth): the thresholds (none = above every LR run) never
    rise with depth and fall at least once; "firm" when the bootstrap intervals of the
    shallowest and deepest depth do not overlap.
    "measured" says how many of the per-depth comparisons had the data to be judged.
    """
    gaps, thresholds = gap_table(points, options), necessity_threshold(points, options)
    arms = arm_table(points)
    rows = []
    for on in _on_kinds(points):
        rows += [_h1(on, gaps, thresholds, options), _h2(on, arms, options.noise_k),
                 _h3(on, thresholds)]
    return pl.DataFrame(rows, schema={"hypothesis": pl.String, "on_kind": pl.String,
                                      "claim": pl.String, "verdict": pl.String,
                                      "measured": pl.String, "evidence": pl.String})


def _h1(on: str, gaps: pl.DataFrame, thresholds: pl.DataFrame, options: Options) -> dict:
    per_depth, notes = [], []
    for t in thresholds.filter(pl.col("on_kind") == on).iter_rows(named=True):
        d = t["depth"]
        g = gaps.filter((pl.col("on_kind") == on) & (pl.col("depth") == d)).sort("lr")
        if t["seed_noise"] is None:
            per_depth.append(NO_DATA)
            notes.append(f"depth {d}: seed noise unknown (needs >= 2 seeds)")
            continue
        limit = options.noise_k * t["seed_noise"]
        low = g.row(0, named=True)
        if t["threshold_lr"] is None:
            off_diverged = g["off_diverged"].sum() > 0
            per_depth.append(NOT_SUPPORTED if off_diverged else NO_DATA)
            notes.append(f"depth {d}: off never worse than on by > {limit:.3g} up to lr "
                         f"{g['lr'].max():.3g}"
                         + (" although off diverged" if off_diverged else
                            "; off never diverged (grid too low)"))
            continue
        calm = g.filter((pl.col("lr") < t["threshold_lr"]) & (pl.col("mean_gap").abs() <= limit)
                        & (pl.col("off_diverged") == 0) & (pl.col("on_diverged") == 0))
        per_depth.append(SUPPORTED if calm.height else NOT_SUPPORTED)
        notes.append(f"depth {d}: gap {low['mean_gap']:+.3g} at the lowest lr {low['lr']:.3g} "
                     f"(noise limit {limit:.3g}); {calm.height} lower LRs within noise; "
                     f"needed from lr {_lr(t['threshold_lr'])}; largest gap "
                     f"{g['mean_gap'].max():+.3g}")
    return {"hypothesis": "H1", "on_kind": on,
            "claim": "QK-norm's effect on final loss is LR-conditional: none at low LR, "
                     "large at high LR",
            "verdict": _combine(per_depth), "measured": _measured(per_depth),
            "evidence": "; ".join(notes) or "no paired runs"}


def _h2(on: str, arms: pl.DataFrame, noise_k: float) -> dict:
    parts, notes = [], []
    for d in sorted(arms["depth"].unique().to_list()):
        a = arms.filter(pl.col("depth") == d)
        off, onr = a.filter(pl.col("qk_norm") == OFF), a.filter(pl.col("qk_norm") == on)
        if not off.height or not onr.height:
            continue
        off, onr = off.row(0, named=True), onr.row(0, named=True)
        text = []
        off_censored, on_censored = off["censored_seeds"] > 0, onr["censored_seeds"] > 0
        if off["max_stable_lr"] is None or onr["max_stable_lr"] is None or off_censored:
            parts.append(NO_DATA)
            text.append("max stable LR not measurable (off "
                        + ("never diverged)" if off_censored else "diverged at every LR)"))
        else:
            # an arm that never diverged is only bounded below, which is enough to say "raised"
            raised = onr["max_stable_lr"] > off["max_stable_lr"]
            parts.append(SUPPORTED if raised else NOT_SUPPORTED)
            text.append(f"max stable LR off {off['max_stable_lr']:.3g} vs on "
                        f"{'>= ' if on_censored else ''}{onr['max_stable_lr']:.3g}")
        if off["lr_sensitivity"] is None or onr["lr_sensitivity"] is None:
            parts.append(NO_DATA)
            text.append("LR sensitivity undefined (base grid < 2 LRs or all diverged)")
        elif min(off["sensitivity_seeds"], onr["sensitivity_seeds"]) < 2:
            parts.append(NO_DATA)
            text.append(f"LR sensitivity off {off['lr_sensitivity']:.3g} vs on "
                        f"{onr['lr_sensitivity']:.3g} from one seed (no spread to judge by)")
        else:
            # lowered by more than noise_k standard errors of the difference of seed means
            se = math.sqrt(off["lr_sensitivity_sd"] ** 2 / off["sensitivity_seeds"]
                           + onr["lr_sensitivity_sd"] ** 2 / onr["sensitivity_seeds"])
            drop = off["lr_sensitivity"] - onr["lr_sensitivity"]
            parts.append(SUPPORTED if drop > noise_k * se else NOT_SUPPORTED)
            text.append(f"LR sensitivity off {off['lr_sensitivity']:.3g} vs on "
                        f"{onr['lr_sensitivity']:.3g} (drop {drop:+.3g}, {noise_k:g} x se "
                        f"{noise_k * se:.3g}) over {off['grid_points']} grid LRs")
        notes.append(f"depth {d}: " + ", ".join(text))
    return {"hypothesis": "H2", "on_kind": on,
            "claim": "QK-norm raises the max stable LR and lowers LR sensitivity",
            "verdict": _combine(parts), "measured": _measured(parts),
            "evidence": "; ".join(notes) or "no paired arms"}


def _interval(r: dict) -> str:
    """The bootstrap interval; an end with no threshold reads "> the largest LR run"."""
    above = f"> {_lr(r['lr_max'])}"
    lo, hi = r["threshold_lo"], r["threshold_hi"]
    return f"[{_lr(lo) if lo is not None else above}, {_lr(hi) if hi is not None else above}]"


def _h3(on: str, thresholds: pl.DataFrame) -> dict:
    t = thresholds.filter(pl.col("on_kind") == on).sort("depth")
    usable = t.filter(pl.col("seed_noise").is_not_null())
    row = {"hypothesis": "H3", "on_kind": on, "claim": "the necessity LR falls with depth",
           "measured": f"{usable.height} of {t.height} depths"}
    text = "; ".join(f"depth {r['depth']}: {_lr(r['threshold_lr'])} {_interval(r)}"
                     for r in usable.iter_rows(named=True))
    if usable.height < 2:
        return {**row, "verdict": NO_DATA,
                "evidence": (text + "; " if text else "") + "needs >= 2 depths with seed noise"}
    values = [r if r is not None else math.inf for r in usable["threshold_lr"].to_list()]
    if all(math.isinf(v) for v in values):
        return {**row, "verdict": NO_DATA,
                "evidence": text + "; no depth has a threshold within the LRs run"}
    moves = [b - a for a, b in itertools.pairwise(values) if not (math.isinf(a) and math.isinf(b))]
    if not (all(m <= 0 for m in moves) and any(m < 0 for m in moves)):
        return {**row, "verdict": NOT_SUPPORTED, "evidence": text}
    shallow, deep = usable.row(0, named=True), usable.row(-1, named=True)
    deep_hi = deep["threshold_hi"] if deep["threshold_hi"] is not None else math.inf
    shallow_lo = shallow["threshold_lo"] if shallow["threshold_lo"] is not None else math.inf
    firm = deep_hi < shallow_lo
    return {**row, "verdict": SUPPORTED,
            "evidence": text + ("; firm: the intervals of the shallowest and deepest depth do "
                                "not overlap" if firm else "; weak: the intervals overlap")}


# --- per-run extras ---------------------------------------------------------------------------

# A probe named like a minimum is reduced over layers by min, one named like a peak or an
# outlier measure by max (the worst layer is the one that matters), anything else by mean.
MIN_PATTERN = r"(^|_)min(_|$)"
MAX_PATTERN = r"(^|_)max(_|$)|kurtosis|outlier"
WHOLE_MODEL = -1  # the layer of whole-model rows and of values pooled over all layers


def layer_reduction(name: str) -> str:
    """How a probe is reduced over layers: "min", "max" or "mean" (see the patterns above)."""
    if re.search(MIN_PATTERN, name):
        return "min"
    return "max" if re.search(MAX_PATTERN, name) else "mean"


def probe_over_layers(probes: pl.LazyFrame) -> pl.LazyFrame:
    """(run, step, name) -> one value: the whole-model (layer -1) row when there is one, else
    the per-layer values reduced by `layer_reduction`. Non-finite values are dropped."""
    value = pl.col("value")
    per_layer = pl.col("layer") != WHOLE_MODEL
    reduced = (probes.filter(value.is_finite())
               .group_by("run", "step", "name")
               .agg(whole=value.filter(~per_layer).first(), lo=value.filter(per_layer).min(),
                    hi=value.filter(per_layer).max(), mean=value.filter(per_layer).mean()))
    name = pl.col("name")
    by_name = (pl.when(name.str.contains(MIN_PATTERN)).then("lo")
               .when(name.str.contains(MAX_PATTERN)).then("hi").otherwise("mean"))
    return reduced.select("run", "step", "name", value=pl.coalesce("whole", by_name))


def probe_summary(per_step: pl.DataFrame) -> pl.DataFrame:
    """Per run: peak_max_attention_logit and final_<name> for every probe name found.

    `per_step` is `probe_over_layers(...)` collected; "final" is each run's last probe step.
    """
    if per_step.is_empty():
        return pl.DataFrame(schema={"run": pl.String})
    final = (per_step.filter(pl.col("step") == pl.col("step").max().over("run", "name"))
             .with_columns(pl.format("final_{}", "name").alias("column"))
             .pivot(on="column", index="run", values="value"))
    peak = (per_step.filter(pl.col("name") == "max_attention_logit").group_by("run")
            .agg(peak_max_attention_logit=pl.col("value").max()))
    return final.join(peak, on="run", how="left") if peak.height else final


def steps_to_threshold(metrics: pl.LazyFrame, runs: pl.DataFrame,
                       thresholds: pl.DataFrame) -> pl.DataFrame:
    """Per run: the first eval step (and tokens) whose val loss is <= its depth's threshold.

    `thresholds` has columns depth, loss_threshold. Null when never reached.
    """
    depth_of = runs.select("run", "depth").lazy()
    return (metrics.filter(pl.col("val_loss").is_not_null())
            .join(depth_of, on="run").join(thresholds.lazy(), on="depth")
            .filter(pl.col("val_loss") <= pl.col("loss_threshold"))
            .group_by("run").agg(steps_to_threshold=pl.col("step").min(),
                                 tokens_to_threshold=pl.col("tokens").min())
            .collect())


def default_loss_thresholds(arms: pl.DataFrame) -> pl.DataFrame:
    """Per depth: the worse of the two arms' best losses, a level both arms reach at their best."""
    return (arms.group_by("depth").agg(loss_threshold=pl.col("best_loss").max())
            .filter(pl.col("loss_threshold").is_not_null()).sort("depth"))
