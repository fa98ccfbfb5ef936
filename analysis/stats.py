"""The statistical tests the verdicts rest on, over paired seed differences, from scipy and
statsmodels. What is specific to the study (which LRs, which arms, what counts as a threshold)
lives in analysis.metrics and analysis.verdicts; every rule is written out in docs/report.md.

All tests here are on the mean of n paired differences d_1..d_n (one per seed):
- `interval`: the two-sided 95% t-interval of the mean (scipy.stats.ttest_1samp). With 3-6
  seeds a bootstrap over seeds cannot resolve a 2.5% tail (3 seeds have 10 distinct resamples),
  so gaps use the t-interval; thresholds, which are not means, use the bootstrap (metrics.py).
- `p_greater`: one-sided t-test of mean > 0. With no spread at all the t statistic is undefined;
  the test falls back to the exact sign-flip permutation p (2^-n when every difference has the
  sign of the claim, else 1), which needs no variance and is never 0.
- `p_equivalent`: TOST (two one-sided tests, statsmodels ttost_paired) of |mean| < margin.
- `adjust`: Benjamini-Hochberg over one hypothesis's family of p-values (statsmodels
  multipletests), so the expected share of false claims among a family's claims is <= alpha.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

CORRECTION = "Benjamini-Hochberg"
LEVEL = 0.95  # every interval reported is a two-sided 95% interval


def _values(diffs) -> np.ndarray:
    return np.asarray([x for x in diffs if x is not None and math.isfinite(x)], dtype=float)


def _flat(d: np.ndarray) -> bool:
    """No spread to speak of: a t statistic would divide by (almost) zero."""
    return float(d.std(ddof=1)) <= 1e-12 * max(1.0, float(np.abs(d).max()))


def interval(diffs, level: float = LEVEL) -> tuple[float | None, float | None]:
    """The two-sided t-interval of the mean; (None, None) below 2 values; the point itself when
    every value is equal (no spread to widen it)."""
    d = _values(diffs)
    if len(d) < 2:
        return None, None
    if _flat(d):
        return float(d.mean()), float(d.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(level)
    return float(ci.low), float(ci.high)


def p_greater(diffs) -> float | None:
    """One-sided p of mean(diffs) > 0; None below 2 values (see the module docstring)."""
    d = _values(diffs)
    if len(d) < 2:
        return None
    if _flat(d):
        return 0.5 ** len(d) if (d > 0).all() else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue)


def p_less(diffs) -> float | None:
    """One-sided p of mean(diffs) < 0."""
    return p_greater([-x for x in _values(diffs)])


def p_equivalent(diffs, margin: float) -> float | None:
    """TOST p of -margin < mean(diffs) < margin; None below 2 values. With no spread: 0.5^n
    when every value lies inside the margin (the exact sign-flip bound), else 1."""
    d = _values(diffs)
    if len(d) < 2 or margin <= 0:
        return None
    if _flat(d):
        return 0.5 ** len(d) if (np.abs(d) < margin).all() else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p, _, _ = ttost_paired(d, np.zeros_like(d), -margin, margin)
    return float(p)


def adjust(pvalues: list[float | None], alpha: float) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values of one family (None stays None, untested)."""
    tested = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    if tested:
        _, adjusted, _, _ = multipletests([pvalues[i] for i in tested], alpha=alpha,
                                          method="fdr_bh")
        for i, q in zip(tested, adjusted):
            out[i] = float(q)
    return out


def adjust_family(tests: list[tuple[dict, str]], alpha: float) -> None:
    """Adjust one hypothesis's family in place: `tests` are (row, "p_<claim>") pairs; each row
    gets "q_<claim>" (Benjamini-Hochberg) and "family_size" (the tests that had a p-value)."""
    qs = adjust([row[key] for row, key in tests], alpha)
    size = sum(q is not None for q in qs)
    for (row, key), q in zip(tests, qs):
        row["q" + key[1:]] = q
        row["family_size"] = size
