"""A law's prediction at a new condition, in numpy alone (so `just advise` loads no scipy): the
schedule's design, Student's t draws and the 95% interval of a new point's measured onset."""

from __future__ import annotations

import math
import zlib

import numpy as np

LEVEL = 0.95
WARMUP0, STEPS0 = 30, 300  # the anchor: the laws' coefficients are per doubling from here


def schedule_x(warmup: int, steps: int, terms: int = 3) -> list[float]:
    """The warmup law's design row: 1, log2(warmup / 30), log2(steps / 300) (and its square)."""
    w, s = math.log2(warmup / WARMUP0), math.log2(steps / STEPS0)
    return [1.0, w, s, w * w][:terms]


def t_scale(rng: np.random.Generator, df: int, size: int) -> np.ndarray:
    """Per draw the factor that turns a normal draw into Student's t with df degrees."""
    return np.sqrt(df / rng.chisquare(df, size))


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The two-sided percentile interval of bootstrap draws (an infinity: an open end)."""
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail], method="inverted_cdf")
    return float(lo), float(hi)


def new_point_draws(center: np.ndarray, lack: float, unit_var: float, widening: float,
                    seeds: int, df: int, key: str) -> np.ndarray:
    """A new point's measured onset about the law's draws `center`: its own deviation from the
    law (lack) and its seed noise at its own seed count (unit_var * widening^2 / seeds, widening
    t / z at those seeds), as a t draw with the law's df."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    sd = math.sqrt(lack + unit_var * widening ** 2 / seeds)
    return center + rng.standard_normal(len(center)) * sd * t_scale(rng, max(df, 1), len(center))
