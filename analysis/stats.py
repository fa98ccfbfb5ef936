"""The statistical tests the verdicts rest on (scipy, statsmodels), over paired seed
differences: t-intervals and t-tests, TOST, the exact sign-flip test (for ties and gaps made by
divergence), the family adjustments, the whole-seed bootstrap and the isotonic fit."""

from __future__ import annotations

import functools
import itertools
import math
import zlib

import numpy as np
from scipy import stats

from .prediction import LEVEL, percentile_interval  # noqa: F401 (the analysis's one interval rule)
from statsmodels.stats.multitest import multipletests

CORRECTION, HOLM = "Benjamini-Hochberg", "Holm"  # H1's large family; H2's and H3's small ones


def _values(diffs) -> np.ndarray:
    return np.asarray([x for x in diffs if x is not None and math.isfinite(x)], dtype=float)


def _flat(d: np.ndarray) -> bool:
    return float(d.std(ddof=1)) <= 1e-12 * max(1.0, float(np.abs(d).max()))


def _t(d: np.ndarray) -> tuple[float, float, int]:
    return float(d.mean()), float(d.std(ddof=1)) / math.sqrt(len(d)), len(d) - 1


def interval(diffs, level: float = LEVEL) -> tuple[float | None, float | None]:
    """The two-sided t-interval of the mean; (None, None) below 2 values."""
    d = _values(diffs)
    if len(d) < 2:
        return None, None
    if _flat(d):
        return float(d.mean()), float(d.mean())
    mean, se, df = _t(d)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return mean - half, mean + half


def p_greater(diffs) -> float | None:
    """One-sided p of mean(diffs) > 0 (Student's t); with no spread the sign-flip bound 2^-n."""
    d = _values(diffs)
    if len(d) < 2:
        return None
    if _flat(d):
        return 0.5 ** len(d) if (d > 0).all() else 1.0
    mean, se, df = _t(d)
    return float(stats.t.sf(mean / se, df))


def p_equivalent(diffs, margin: float) -> float | None:
    """TOST p of -margin < mean(diffs) < margin; with no spread 0.5^n (inside) or 1."""
    d = _values(diffs)
    if len(d) < 2 or margin <= 0:
        return None
    if _flat(d):
        return 0.5 ** len(d) if (np.abs(d) < margin).all() else 1.0
    mean, se, df = _t(d)
    return float(max(stats.t.sf((mean + margin) / se, df), stats.t.cdf((mean - margin) / se, df)))


def adjust(pvalues: list[float | None], alpha: float, method: str = "fdr_bh"
           ) -> list[float | None]:
    """Adjusted p-values of one family (None stays None): Benjamini-Hochberg or Holm."""
    tested = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    if tested:
        p = [pvalues[i] for i in tested]
        adjusted = holm(p) if method == "holm" else multipletests(p, alpha=alpha, method=method)[1]
        for i, q in zip(tested, adjusted):
            out[i] = float(q)
    return out


def holm(pvalues: list[float]) -> np.ndarray:
    """Holm's adjusted p-values, without multipletests' slow gc.collect() per call."""
    p = np.asarray(pvalues, float)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1))
    out = np.empty_like(p)
    out[order] = np.minimum(stepped, 1.0)
    return out


def adjust_family(tests: list[tuple[dict, str]], alpha: float, method: str = "fdr_bh") -> None:
    """Adjust one family in place: each (row, "p_<claim>") gets "q_<claim>" and "family_size"."""
    qs = adjust([row[key] for row, key in tests], alpha, method)
    size = sum(q is not None for q in qs)
    for (row, key), q in zip(tests, qs):
        row["q" + key[1:]] = q
        row["family_size"] = size


EXACT_UP_TO = 18  # sign patterns enumerated up to 2^18; beyond, 2^16 random patterns


def p_signflip(diffs, shift: float = 0.0) -> float | None:
    """One-sided sign-flip p of mean(diffs) > shift (exact up to n = 18)."""
    d = _values(diffs) - shift
    n = len(d)
    if n < 2:
        return None
    observed = d.sum()
    if n <= EXACT_UP_TO:
        signs = _sign_patterns(n)
    else:
        rng = np.random.default_rng(0)
        signs = np.vstack([np.ones(n), rng.choice([-1.0, 1.0], size=(2 ** 16, n))])
    sums = signs @ d
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    return float(np.mean(sums >= observed - tol))


@functools.cache
def _sign_patterns(n: int) -> np.ndarray:
    return (1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)).astype(float)


def p_signflip_equivalent(diffs, margin: float) -> float | None:
    """TOST by sign flips: max of p(mean > -margin) and p(mean < margin)."""
    d = _values(diffs)
    if len(d) < 2 or margin <= 0:
        return None
    return max(p_signflip(d, -margin), p_signflip(-d, -margin))


EXACT_DRAWS = 100_000  # whole-seed resamples enumerated exactly up to this many (n^n)


def seed_draws(n_seeds: int, draws: int, key: str) -> np.ndarray:
    """(B, n_seeds) seed indices: every one of the n^n ordered whole-seed resamples when there
    are at most EXACT_DRAWS (5 seeds: 3,125; the exact bootstrap), else `draws` drawn with
    replacement, reproducibly from `key`."""
    if n_seeds ** n_seeds <= EXACT_DRAWS:
        return np.array(list(itertools.product(range(n_seeds), repeat=n_seeds)), dtype=np.int64
                        ).reshape(-1, n_seeds)
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.integers(0, n_seeds, size=(draws, n_seeds))


def joint_draws(marginals: list[np.ndarray], draws: int, key: str) -> np.ndarray:
    """(draws, k): independent units' draws (each its own length, e.g. an exact enumeration)
    combined by drawing each unit's index at random, reproducibly from `key`."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return np.stack([m[rng.integers(0, len(m), draws)] for m in marginals], axis=1)


def seed_bootstrap(values: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cell means of whole-seed resamples of `values` (seeds, cells; NaN: not run) by `draws`
    (B, k): (means, counts), each (B, cells), the means rescaled about the cell's own mean by
    sqrt(n / (n - 1)) (the t-interval's spread); NaN where no drawn seed ran the cell."""
    present = ~np.isnan(values)
    n = present.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
        scale = np.where(n > 1, np.sqrt(n / np.maximum(n - 1, 1)), 0.0)
    deviation = np.where(present, values - mean, 0.0)
    picked = deviation[draws]  # (B, k, cells)
    counts = present[draws].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = mean + scale * picked.sum(axis=1) / counts
    return np.where(counts > 0, means, np.nan), counts


def is_exact(draws: int, seeds: int) -> bool:
    """Whether `draws` whole-seed resamples of `seeds` seeds are seed_draws' exact enumeration."""
    return seeds ** seeds <= EXACT_DRAWS and draws == seeds ** seeds


def p_bootstrap(null_side: np.ndarray, exact: bool = False) -> float:
    """The share of draws on the null side; random draws count the observed sample as one
    more, an exact enumeration already holds it."""
    extra = 0 if exact else 1
    return float((extra + null_side.sum()) / (len(null_side) + extra))


def p_within(draws: np.ndarray, margin: float, exact: bool = False) -> float:
    """Bootstrap p of -margin < x < margin (both one-sided tests; a NaN draw counts against)."""
    undefined = np.isnan(draws)
    return max(p_bootstrap(undefined | (draws >= margin), exact),
               p_bootstrap(undefined | (draws <= -margin), exact))


def isotonic(means: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted non-decreasing least-squares fit of each row of `means` (rows x points): fit_i =
    max over j <= i of min over k >= i of the weighted mean of points j..k (NaN: weight 0)."""
    means = np.atleast_2d(np.asarray(means, float))
    w = np.where(np.isnan(means), 0.0, np.broadcast_to(np.atleast_2d(weights), means.shape))
    wy = np.cumsum(np.concatenate([np.zeros((means.shape[0], 1)),
                                   np.where(w > 0, means * w, 0.0)], axis=1), axis=1)
    cw = np.cumsum(np.concatenate([np.zeros((means.shape[0], 1)), w], axis=1), axis=1)
    m = means.shape[1]
    j, k = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    with np.errstate(invalid="ignore", divide="ignore"):
        block = (wy[:, k + 1] - wy[:, j]) / (cw[:, k + 1] - cw[:, j])  # (rows, j, k)
    block = np.where((k >= j)[None] & np.isfinite(block), block, np.nan)
    # min over k >= i, for each j: a reversed running minimum (NaN blocks of weight 0 skipped)
    filled = np.where(np.isnan(block), np.inf, block)
    suffix_min = np.minimum.accumulate(filled[:, :, ::-1], axis=2)[:, :, ::-1]
    usable = (j <= k)[None]  # j <= i (the i axis is the k axis here)
    candidates = np.where(usable, suffix_min, -np.inf)
    fit = candidates.max(axis=1)  # max over j <= i
    return np.where(np.isfinite(fit), fit, np.nan)


def clopper_pearson_upper(hits: int, n: int, level: float = LEVEL) -> float:
    """The upper end of the two-sided Clopper-Pearson interval of hits / n."""
    if hits >= n:
        return 1.0
    return float(stats.beta.ppf(1 - (1 - level) / 2, hits + 1, n - hits))
