"""Calibration of the analysis plan: the whole procedure, run on simulated studies of known
truth, counts every kind of false claim and measures power and interval coverage
(docs/report.md shows the table; `just calibrate`).

One simulated study is the mini's design run by the sweep's own rules: depths 2, 4, 8, both
arms, the 8 grid LRs, a fixed number of seeds, the mini preset's boundary-bisection steps per
curve (two; qkstudy.sweep.refine.next_midpoint) and two threshold-bisection steps per depth
(qkstudy.sweep.adaptive.next_threshold_lr), then the report's verdict code
(analysis.verdicts.study_verdicts) on the runs.

Noise, fitted from real sweeps (`fit_noise`; `runs=` refits it from a runs folder): per depth
and LR the seed SD of the gap (off minus on), the correlation of one seed's gap deviations
across LRs (a Gaussian process over log LR whose correlation at a half-decade step is the fitted
one), each arm's divergence boundary (log10 of the first diverged LR, mean and SD over seeds)
and the LR from which both arms collapse to unigram-level loss. Without a runs folder the
default is NOISE below, fitted from the earlier mini's published intervals (3 seeds plus
adaptive seeds, init=mlx; in docs/results.md's history).

Scenarios (the truth is the noiseless version of the same study):
- null: no effect anywhere, the same boundaries in both arms. Every claim of an effect is false.
- same onset: off is worse from the same LR at every depth (0.45 nats once past it), with a
  small (0.03-nat) low-LR gap at depth 2: H1 true, H3 false (slope 0), H2's LR sensitivity
  true, its max stable LR false.
- one decade per doubling: the onset falls from 0.2 (depth 2) to 0.02 (4) and 0.002 (8).
- sharp onset: the same onset at every depth, the gap stepping to its full size within 0.005
  decades (between two grid LRs), so where each depth reads it depends on its bisection.
- half a decade per doubling (the fall of one decade from depth 2 to 8 the plan powers for),
  with QK-norm's divergence boundary x3 higher: every hypothesis true.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.errors import UsageError
from qkstudy.sweep.adaptive import next_threshold_lr
from qkstudy.sweep.config import MINI
from qkstudy.sweep.refine import next_midpoint

from . import stats as S
from .hypotheses import (MAX_STABLE, NO_DIFFERENCE, OFF_WORSE, ON_WORSE, SENSITIVITY, TOO_FEW,
                         h1_tests, h3_tests)
from .metrics import Options
from .threshold import reread, threshold_draws, threshold_interval
from .verdicts import FOR, h1_direction, study_verdicts

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
DEPTHS = (2, 4, 8)
UNIGRAM = 3.118  # nats: the synthetic byte corpus's unigram entropy
INIT_LOSS = 5.6
PLATEAU = 0.45  # nats: off minus on once well past the onset (0.42-0.58 at LR 0.1-0.3)
# the mini preset's bisection: boundary steps per curve (refine_steps= overrides), threshold
# steps per depth, the ratio at which both stop
REFINE_STEPS, THRESHOLD_STEPS, REFINE_FACTOR = MINI.refine_steps, MINI.threshold_steps, \
    MINI.refine_factor
SLOPE_TOLERANCE = 1e-9  # decades per doubling: a true slope this close to 0 is 0


@dataclass(frozen=True)
class Noise:
    """What a real sweep's runs scatter by (see the module docstring)."""

    gap_sd: dict[int, tuple[float, ...]]  # per depth, per grid LR (NaN: no informative cell)
    correlation: float  # of one seed's gap deviations at adjacent half-decade LRs
    boundary: tuple[float, float]  # log10 first diverged LR: mean and SD over seeds
    collapse_lr: float  # from this LR both arms end near the unigram entropy (degraded)
    on_sd: float = 0.02  # seed SD of the on arm's loss (shared by both arms of a seed)
    source: str = ""
    # decades: each seed's onset shifted by N(0, onset_sd) (0: one onset for every seed); real
    # cells near the onset are two-humped: some seeds past their onset, some not
    onset_sd: float = 0.0
    # the off arm's first degraded LR (unigram-level loss while stable), in decades above the
    # depth's threshold, one value per real (depth, seed); a simulated seed draws one of them
    # (empty: the off arm degrades only from collapse_lr)
    off_degrade: tuple[float, ...] = ()
    # log10 of the on arm's first degraded LR per real (depth, seed), +inf where it never
    # degraded before it diverged; drawn the same way (and by both arms where there is no effect)
    on_degrade: tuple[float, ...] = ()
    # of one seed's two divergence boundaries (a seed's data order moves both)
    boundary_correlation: float = 0.0


# Fitted from the earlier mini (docs/results.md's history, synthetic corpus, init=mlx): the SD of each
# cell's gaps recovered from its 95% t-interval and seed count (sd = half-width / t * sqrt(n)),
# e.g. depth 4 at LR 0.01: [-0.11, +0.22] on 6 seeds gives 0.157. LRs 1 and 3: neither arm
# learned (both collapsed or diverged). Divergence: first diverged LR 0.548 or 1 in every seed
# of both arms. The correlation across LRs cannot be recovered from a table; 0.5 is assumed
# until `fit_noise` reads it off runs.
PUBLISHED = {  # depth: (mean, lo, hi, n) per grid LR 1e-3 ... 0.3
    2: ((0.021, 0.01, 0.03, 5), (0.024, -0.02, 0.07, 6), (-0.002, -0.10, 0.10, 6),
        (0.191, 0.07, 0.31, 6), (0.462, 0.45, 0.47, 3), (0.575, 0.40, 0.75, 4)),
    4: ((0.018, 0.00, 0.03, 6), (0.023, -0.00, 0.05, 6), (0.056, -0.11, 0.22, 6),
        (0.327, 0.15, 0.50, 5), (0.531, 0.39, 0.67, 4), (0.538, 0.37, 0.71, 3)),
    8: ((0.024, -0.00, 0.05, 6), (0.013, -0.01, 0.03, 6), (0.217, 0.12, 0.31, 4),
        (0.303, 0.17, 0.43, 3), (0.420, 0.21, 0.63, 5), (0.424, 0.26, 0.59, 5)),
}


def _published_noise() -> Noise:
    from scipy import stats

    sd = {}
    for depth, cells in PUBLISHED.items():
        values = [(hi - lo) / 2 / stats.t.ppf(0.975, n - 1) * math.sqrt(n)
                  for _, lo, hi, n in cells]
        sd[depth] = tuple(values) + (math.nan, math.nan)
    return Noise(gap_sd=sd, correlation=0.5, boundary=(math.log10(0.7), 0.13), collapse_lr=1.0,
                 source="the earlier mini's gap intervals (docs/results.md's history); correlation "
                        "across LRs assumed 0.5; failures short of divergence from the mini",
                 off_degrade=MINI_OFF_DEGRADE, on_degrade=MINI_ON_DEGRADE,
                 boundary_correlation=0.65)


# How the republished mini's runs (results/mini.tar.xz, 330 runs) fail short of divergence,
# by `fit_failures`, per (depth 2, 4, 8) x seeds 0-4: the off arm's first degraded LR in decades
# above the depth's threshold (every off seed degrades, 0.3 to 1.7 decades past it), and the on
# arm's (log10; inf: never before it diverged). Its arms' first diverged LRs correlate 0.65.
MINI_OFF_DEGRADE = (0.815, 0.815, 0.815, 1.292, 0.292, 0.66, 1.66, 1.183, 0.66, 0.66, 1.022,
                    1.022, 1.022, 0.5, 1.022)
MINI_ON_DEGRADE = (0.0, math.inf, 0.0, math.inf, 0.0, math.inf, math.inf, math.inf, math.inf,
                   math.inf, -0.261, math.inf, -0.261, math.inf, math.inf)
NOISE = _published_noise()




def fit_noise(points: pl.DataFrame, options: Options | None = None) -> Noise:
    """The noise of a real sweep: per depth and grid LR the seed SD of the gap over
    informative cells (each shrunk towards the LR's SD pooled over depths with 4 degrees of
    freedom, so a 3-seed cell does not set a near-zero SD), the mean correlation of seeds'
    gap deviations at adjacent informative grid LRs, the divergence boundary over every
    (depth, arm, seed) and the smallest grid LR where every on-arm run failed to learn."""
    from .metrics import max_stable_lr_per_seed, paired_gaps

    options = options or Options()
    cells = h1_tests(points, options)[0]
    gaps = paired_gaps(points, options)
    informative = cells.filter(pl.col("informative") & (pl.col("pairs") >= 2))
    var = {(d, lr): s ** 2 for d, lr, s in informative.select("depth", "lr", "gap_sd").iter_rows()}
    dof = {(d, lr): n - 1 for d, lr, n in informative.select("depth", "lr", "pairs").iter_rows()}
    sd = {}
    for depth in DEPTHS:
        row = []
        for lr in LRS:
            pooled = [var[(d, lr)] for d in DEPTHS if (d, lr) in var]
            if (depth, lr) not in var:
                row.append(math.nan)
                continue
            prior = float(np.mean(pooled))
            k = dof[(depth, lr)]
            row.append(math.sqrt((var[(depth, lr)] * k + prior * 4) / (k + 4)))
        sd[depth] = tuple(row)
    r = []
    for depth in DEPTHS:
        ok = informative.filter(pl.col("depth") == depth)["lr"].to_list()
        g = gaps.filter((pl.col("depth") == depth) & pl.col("lr").is_in(LRS))
        wide = g.pivot(on="lr", index="seed", values="gap").drop("seed")
        for a, b in zip(LRS, LRS[1:]):
            if a in ok and b in ok and str(a) in wide.columns and str(b) in wide.columns:
                x, y = wide[str(a)].to_numpy(), wide[str(b)].to_numpy()
                keep = np.isfinite(x) & np.isfinite(y)
                if keep.sum() >= 3 and x[keep].std() > 0 and y[keep].std() > 0:
                    r.append(float(np.corrcoef(x[keep], y[keep])[0, 1]))
    stable = max_stable_lr_per_seed(points, options).drop_nulls("first_divergent_lr")
    first = np.log10(stable["first_divergent_lr"].to_numpy())
    on_failed = (cells.filter(~pl.col("informative"))["lr"].to_list())
    collapse = min([lr for lr in LRS if lr in on_failed] or [max(LRS)])
    off_degrade, on_degrade, rho = fit_failures(points, cells, options)
    return Noise(gap_sd=sd, correlation=float(np.clip(np.mean(r), 0, 0.95)) if r else 0.5,
                 boundary=(float(first.mean()), float(first.std(ddof=1)) if first.size > 1
                           else 0.13), collapse_lr=collapse,
                 source=f"fitted from {points.height} runs", off_degrade=off_degrade,
                 on_degrade=on_degrade, boundary_correlation=rho)


def fit_failures(points: pl.DataFrame, cells: pl.DataFrame, options: Options
                 ) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """How a real sweep's runs fail short of divergence, per (depth, seed): the off arm's first
    degraded LR in decades above its depth's threshold estimate, the on arm's (log10, +inf
    where it never degraded), and the correlation of the two arms' first diverged LRs (log10;
    0.5, assumed, where one arm's boundary does not vary)."""
    from .metrics import with_losses

    runs = with_losses(points, options.degraded_margin)
    points_at = {d: v.point for (_, d), v in threshold_draws(points, cells, options).items()}
    first = (runs.group_by("depth", "arm", "seed")
             .agg(degraded=pl.col("lr").filter(pl.col("degraded")).min(),
                  diverged=pl.col("lr").filter(pl.col("diverged")).min()))
    off, on = [], []
    for depth, arm, _, degraded, _ in first.sort("depth", "arm", "seed").iter_rows():
        if arm == "none":
            if degraded is not None and math.isfinite(points_at.get(depth, math.inf)):
                off.append(round(math.log10(degraded) - points_at[depth], 3))
        else:
            on.append(math.inf if degraded is None else round(math.log10(degraded), 3))
    wide = (first.filter(pl.col("diverged").is_not_null())
            .pivot(on="arm", index=["depth", "seed"], values="diverged").drop_nulls())
    rho = 0.5
    if {"none", "rmsnorm"} <= set(wide.columns) and wide.height >= 3:
        a, b = (np.log10(wide[c].to_numpy()) for c in ("none", "rmsnorm"))
        if a.std() > 0 and b.std() > 0:
            rho = float(np.clip(np.corrcoef(a, b)[0, 1], 0, 0.95))
    return tuple(off), tuple(on), rho


@dataclass(frozen=True)
class Scenario:
    """A truth: the onset LR per depth (None: no effect), a small constant gap below the onset
    at some depths, how much higher QK-norm's divergence boundary sits (x), and how sharp the
    onset is (the logistic's width in decades)."""

    onset: dict[int, float] | None
    low_gap: dict[int, float] = field(default_factory=dict)
    boundary_ratio: float = 1.0
    ramp: float = 0.15
    # an under-training gap (nats) at the smallest LRs, where QK-norm learns faster than the
    # off arm and neither is trained (the ladder's w256-s300 and w64-s4800): the full value
    # below LR 3e-4, falling logistically to about nothing by 1e-3; not part of the onset
    undertrain: dict[int, float] = field(default_factory=dict)


UNDERTRAIN_CENTRE, UNDERTRAIN_WIDTH = math.log10(math.sqrt(3e-4 * 1e-3)), 0.08


def undertrain_gap(scenario: Scenario, depth: int, lr: float) -> float:
    """The under-training part of the gap at `lr` (0 where the scenario has none)."""
    size = scenario.undertrain.get(depth, 0.0)
    if not size:
        return 0.0
    z = (math.log10(lr) - UNDERTRAIN_CENTRE) / UNDERTRAIN_WIDTH
    return size / (1 + math.exp(min(z, 700.0)))


SCENARIOS = {
    "null": Scenario(None),
    "same onset": Scenario({2: 0.012, 4: 0.012, 8: 0.012}, low_gap={2: 0.03}),
    "one decade per doubling": Scenario({2: 0.2, 4: 0.02, 8: 0.002}),
    "half a decade per doubling": Scenario({2: 10 ** -1.5, 4: 1e-2, 8: 10 ** -2.5},
                                           boundary_ratio=3.0),
    # the gap steps from 0 to its full size within a tenth of a grid step, at one LR between
    # grid points for every depth: the bisection's brackets decide where each depth reads it
    "sharp onset": Scenario({2: 0.015, 4: 0.015, 8: 0.015}, ramp=0.005),
    # H2's max stable LR at true ratios inside, at and beyond its x2 margin (amendment 3)
    "boundary x1.5": Scenario({2: 0.012, 4: 0.012, 8: 0.012}, boundary_ratio=1.5),
    "boundary x2": Scenario({2: 0.012, 4: 0.012, 8: 0.012}, boundary_ratio=2.0),
}


def true_gap(scenario: Scenario, depth: int, lr: float, margin: float,
             shift: float = 0.0) -> float:
    """Off minus on without noise: a logistic in log LR that reaches `margin` at the onset
    (moved by `shift` decades: one seed's own onset)."""
    if scenario.onset is None:
        return 0.0
    onset = math.log10(scenario.onset[depth]) + shift
    width = scenario.ramp
    centre = onset + width * math.log(PLATEAU / margin - 1)
    z = (math.log10(lr) - centre) / width
    ramp = PLATEAU / (1 + math.exp(-z)) if z > -700 else 0.0
    return ramp + (scenario.low_gap.get(depth, 0.0) if math.log10(lr) < onset else 0.0)


def base_loss(lr: float) -> float:
    """The on arm's loss without noise: a U over log LR with its minimum 2.23 at 3e-3."""
    return 2.23 + 0.06 * (math.log10(lr) + 2.5) ** 2


# --- one simulated sweep ---------------------------------------------------------------------

LATTICE = np.arange(-3.25, 0.75, 1 / 32)  # log10 LRs where one seed's noise is drawn


@dataclass
class World:
    """One simulated study's random draws, fixed before any run is 'trained', so the sweep's
    adaptive steps (bisection) read the same runs they would on disk."""

    scenario: Scenario
    noise: Noise
    margin: float
    seeds: int
    gap_noise: dict[tuple[int, str], np.ndarray]  # (depth, arm) -> (seeds, lattice)
    on_offset: dict[int, np.ndarray]  # depth -> (seeds,) shared by both arms and LRs
    on_noise: dict[int, np.ndarray]  # depth -> (seeds, lattice): the collapsed runs' scatter
    boundary: dict[tuple[int, str], np.ndarray]  # (depth, arm) -> (seeds,) log10 first diverged
    onset_shift: dict[int, np.ndarray] = field(default_factory=dict)  # depth -> (seeds,)
    # (depth, arm) -> (seeds,) log10 of the first degraded LR (inf: only from collapse_lr)
    degrade: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    depths: tuple[int, ...] = DEPTHS  # the study's depths (or any keys of noise.gap_sd)
    lrs: tuple[float, ...] = LRS  # its grid
    refine_steps: int = REFINE_STEPS  # boundary-bisection steps per curve
    lattice: np.ndarray = field(default_factory=lambda: LATTICE)

    def sd(self, depth: int, lr: float) -> float:
        """The gap's seed SD at any LR: interpolated in log LR between the fitted grid LRs."""
        x = [math.log10(v) for v, s in zip(LRS, self.noise.gap_sd[depth]) if math.isfinite(s)]
        y = [s for s in self.noise.gap_sd[depth] if math.isfinite(s)]
        return float(np.interp(math.log10(lr), x, y))

    def run(self, depth: int, arm: str, lr: float, seed: int) -> tuple[str, float | None]:
        """(status, final val loss) of one run."""
        if math.log10(lr) >= self.boundary[(depth, arm)][seed]:
            return "diverged", None
        i = int(np.argmin(np.abs(self.lattice - math.log10(lr))))
        degraded = self.degrade and math.log10(lr) >= self.degrade[(depth, arm)][seed]
        if lr >= self.noise.collapse_lr or degraded:
            return "completed", UNIGRAM - 0.05 + 0.02 * self.on_noise[depth][seed, i]
        # each arm carries half the gap's variance, so the null is symmetric in the arms
        loss = base_loss(lr) + self.on_offset[depth][seed] + \
            self.sd(depth, lr) / math.sqrt(2) * self.gap_noise[(depth, arm)][seed, i]
        if arm == "none":
            shift = float(self.onset_shift[depth][seed]) if self.onset_shift else 0.0
            loss += true_gap(self.scenario, depth, lr, self.margin, shift) + \
                undertrain_gap(self.scenario, depth, lr)
        return "completed", loss


def make_world(scenario: Scenario, noise: Noise, seeds: int, margin: float,
               rng: np.random.Generator, noiseless: bool = False,
               depths: tuple[int, ...] = DEPTHS, lrs: tuple[float, ...] = LRS,
               lattice: np.ndarray = LATTICE, refine_steps: int = REFINE_STEPS) -> World:
    ell = 0.5 / -math.log(min(max(noise.correlation, 1e-3), 0.999))  # corr at 0.5 decades
    d = np.abs(lattice[:, None] - lattice[None, :])
    chol = np.linalg.cholesky(np.exp(-d / ell) + 1e-9 * np.eye(len(lattice)))

    def process() -> np.ndarray:
        return np.zeros((seeds, len(lattice))) if noiseless else \
            rng.standard_normal((seeds, len(lattice))) @ chol.T

    mean, spread = noise.boundary
    world = World(
        scenario=scenario, noise=noise, margin=margin, seeds=seeds,
        gap_noise={(dp, arm): process() for dp in depths for arm in ("none", "rmsnorm")},
        on_offset={dp: np.zeros(seeds) if noiseless else rng.normal(0, noise.on_sd, seeds)
                   for dp in depths},
        on_noise={dp: process() for dp in depths},
        boundary={(dp, arm): mean + (math.log10(scenario.boundary_ratio) if arm != "none"
                                     else 0.0)
                  + (np.zeros(seeds) if noiseless else rng.normal(0, spread, seeds))
                  for dp in depths for arm in ("none", "rmsnorm")},
        # drawn after the others and only when asked for, so the other draws are those of a
        # world without it
        onset_shift={dp: rng.normal(0, noise.onset_sd, seeds) for dp in depths}
        if noise.onset_sd > 0 and not noiseless else {},
        depths=depths, lrs=lrs, refine_steps=refine_steps, lattice=lattice)
    rho = noise.boundary_correlation
    if rho > 0 and not noiseless:  # a shared part: b = mean + spread (sqrt(1-rho) z + sqrt(rho) s)
        for dp in depths:
            shared = rng.normal(0, spread, seeds)
            for arm in ("none", "rmsnorm"):
                own = world.boundary[(dp, arm)] - mean - (
                    math.log10(scenario.boundary_ratio) if arm != "none" else 0.0)
                world.boundary[(dp, arm)] += (math.sqrt(1 - rho) - 1) * own + math.sqrt(rho) * shared
    if noise.off_degrade or noise.on_degrade:
        world.degrade = failure_draws(scenario, noise, seeds, margin, rng, noiseless, depths,
                                      world.onset_shift)
    return world


def failure_draws(scenario: Scenario, noise: Noise, seeds: int, margin: float,
                  rng: np.random.Generator, noiseless: bool, depths: tuple[int, ...],
                  onset_shift: dict[int, np.ndarray]) -> dict[tuple[int, str], np.ndarray]:
    """Each simulated (depth, arm, seed)'s first degraded LR (log10), drawn from a real sweep's
    (`Noise.off_degrade`, `on_degrade`; their medians in the noiseless study): the off arm's
    above its seed's own onset where there is an effect, the on arm's wherever it is, and both
    arms' from the on arm's where there is none."""
    def pick(values: tuple[float, ...]) -> np.ndarray:
        if not values:
            return np.full(seeds, math.inf)
        v = np.asarray(values, float)
        return np.full(seeds, float(np.median(v))) if noiseless else rng.choice(v, seeds)

    out = {}
    for dp in depths:
        out[(dp, "rmsnorm")] = pick(noise.on_degrade)
        if scenario.onset is None or not noise.off_degrade:
            out[(dp, "none")] = pick(noise.on_degrade)
        else:
            shift = onset_shift.get(dp, np.zeros(seeds))
            out[(dp, "none")] = (mean_crossing(scenario, dp, margin, 0.0) + shift
                                 + pick(noise.off_degrade))
    return out


def sweep(world: World) -> pl.DataFrame:
    """The runs the mini's sweep would train in this world: the grid, world.refine_steps
    boundary-bisection steps per curve, then two threshold-bisection steps per depth (every
    seed, both arms)."""
    runs: dict[tuple[int, str, float, int], tuple[str, float | None]] = {}

    def train(depth: int, arm: str, lr: float, seed: int) -> tuple[str, float | None]:
        key = (depth, arm, lr, seed)
        if key not in runs:
            runs[key] = world.run(depth, arm, lr, seed)
        return runs[key]

    for depth in world.depths:
        for seed in range(world.seeds):
            for arm in ("none", "rmsnorm"):
                results = {lr: train(depth, arm, lr, seed)[0] == "completed" for lr in world.lrs}
                while (lr := next_midpoint(results, world.lrs, world.refine_steps,
                                           REFINE_FACTOR)) is not None:
                    results[lr] = train(depth, arm, lr, seed)[0] == "completed"
        means: dict[float, float] = {}
        lrs = list(world.lrs)
        for step in range(THRESHOLD_STEPS + 1):
            for lr in lrs:
                pairs = [(train(depth, "none", lr, s), train(depth, "rmsnorm", lr, s))
                         for s in range(world.seeds)]
                losses = [[INIT_LOSS if st == "diverged" else min(v, INIT_LOSS)
                           for st, v in pair] for pair in pairs]
                failed = all(_failed(a) and _failed(b) for a, b in pairs)
                if not failed:
                    means[lr] = float(np.mean([a - b for a, b in losses]))
            if step == THRESHOLD_STEPS:
                break
            mid = next_threshold_lr(means, world.margin, REFINE_FACTOR)
            if mid is None:
                break
            lrs = [mid]
    return pl.DataFrame(
        [{"depth": dp, "arm": arm, "qk_norm": arm, "lr": lr, "seed": s, "status": st,
          "init_loss": INIT_LOSS, "final_val_loss": v, "unigram_entropy": UNIGRAM}
         for (dp, arm, lr, s), (st, v) in runs.items()],
        schema={"depth": pl.Int64, "arm": pl.String, "qk_norm": pl.String, "lr": pl.Float64,
                "seed": pl.Int64, "status": pl.String, "init_loss": pl.Float64,
                "final_val_loss": pl.Float64, "unigram_entropy": pl.Float64})


def _failed(run: tuple[str, float | None]) -> bool:
    status, loss = run
    return status == "diverged" or loss > UNIGRAM - Options.degraded_margin


# --- the truth and the claims -------------------------------------------------------------------

@dataclass(frozen=True)
class Truth:
    """What the noiseless study says, the yardstick of every claim."""

    h1: bool
    stable_effect: float  # log(on / off) of the median boundaries
    sensitivity_drop: float  # off - on, pooled over depths
    thresholds: dict[int, float]  # log10, +-inf when censored in the noiseless study
    slope: float  # NaN when some depth has no threshold


def truth_of(scenario: Scenario, noise: Noise, seeds: int, options: Options) -> Truth:
    world = make_world(scenario, noise, seeds, options.min_gap, np.random.default_rng(0),
                       noiseless=True)
    r = study_verdicts(sweep(world), replace(options, bootstrap=10))
    th, h2 = r.thresholds, r.h2
    sens = h2.filter((pl.col("measure") == SENSITIVITY) & pl.col("depth").is_null())["effect"]
    logs = {}
    for r in th.iter_rows(named=True):
        logs[r["depth"]] = (math.log10(r["threshold_lr"]) if r["threshold_lr"] else
                            (math.inf if r["censored"] == "above" else -math.inf))
    if scenario.onset is not None:  # where the seed-mean gap reaches the margin
        logs = {d: mean_crossing(scenario, d, options.min_gap, noise.onset_sd)
                for d in scenario.onset}
    slope = (float(np.polyfit(np.log2(DEPTHS), [logs[d] for d in DEPTHS], 1)[0])
             if scenario.onset is not None else math.nan)
    if abs(slope) < SLOPE_TOLERANCE:  # polyfit's rounding of an equal onset (2.5e-16) is 0
        slope = 0.0
    return Truth(h1=scenario.onset is not None, stable_effect=math.log(scenario.boundary_ratio),
                 sensitivity_drop=float(sens[0]) if sens.len() else 0.0, thresholds=logs,
                 slope=slope)


def mean_crossing(scenario: Scenario, depth: int, margin: float, onset_sd: float) -> float:
    """log10 of the LR where the expected gap over seeds reaches `margin`: the crossing the
    threshold estimator targets. With one onset for every seed it is the planted onset; with
    per-seed onsets the seed-mean curve is flatter and crosses elsewhere."""
    if onset_sd == 0:
        return math.log10(scenario.onset[depth])  # type: ignore[index]
    shifts = onset_sd * np.sqrt(2) * np.polynomial.hermite.hermgauss(40)[0]
    weights = np.polynomial.hermite.hermgauss(40)[1] / np.sqrt(np.pi)

    def mean_gap(x: float) -> float:
        return float(sum(w * true_gap(scenario, depth, 10 ** x, margin, z)
                         for z, w in zip(shifts, weights)))

    lo, hi = -6.0, 2.0
    for _ in range(60):  # the seed-mean logistic rises in log LR: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_gap(mid) < margin else (lo, mid)
    return (lo + hi) / 2


def supported(verdict: str) -> bool:
    """A verdict that claims support, in whole or in part."""
    return verdict.startswith(("supported", "partly supported"))


def judge(world: World, truth: Truth, options: Options, slope_widenings: tuple[float, ...] = (),
          threshold_widenings: tuple[float, ...] = ()) -> dict[str, float]:
    """Run the procedure on one simulated study and score every claim against the truth:
    1 where a claim of that kind was made and false (or, for power and coverage, held).
    slope_widenings, threshold_widenings: candidate widenings of H3's slope draws and of the
    threshold's interval, scored on the same study beside the plan's."""
    runs = sweep(world)
    study = study_verdicts(runs, options)
    v, gaps, th, h2, h3 = study.verdicts, study.gaps, study.thresholds, study.h2, study.h3
    verdict = dict(zip(v["hypothesis"], v["verdict"]))
    m = options.min_gap
    out: dict[str, float] = {}
    # H1: the verdict, and every cell claim against the noiseless gap at its LR
    out["H1 false supported"] = float(not truth.h1 and supported(verdict["H1"]))
    out["H1 false not supported"] = float(truth.h1 and verdict["H1"] == "not supported")
    out["H1 power"] = float(truth.h1 and supported(verdict["H1"]))
    if truth.h1:  # each depth's part: every seed can favour QK-norm and a depth stay undecided
        for depth in world.depths:
            cells = gaps.filter((pl.col("depth") == depth) & pl.col("informative")
                                & (pl.col("decision") != TOO_FEW))
            out[f"H1 depth {depth} power"] = float(h1_direction(cells) == FOR)
    # cells: the share of studies with any false cell claim (under the complete null what
    # Benjamini-Hochberg bounds), and beside it the share of false claims among the cell claims
    # made, pooled over studies (what it bounds otherwise; no bound is asked of it: in the null
    # every claim is false by definition)
    bad_worse = bad_same = worse = same = 0
    for depth, lr, decision in gaps.select("depth", "lr", "decision").iter_rows():
        g = true_gap(world.scenario, depth, lr, m)
        worse += decision in (OFF_WORSE, ON_WORSE)
        same += decision == NO_DIFFERENCE
        bad_worse += (decision == OFF_WORSE and g <= m) or (decision == ON_WORSE and g >= -m)
        bad_same += decision == NO_DIFFERENCE and abs(g) >= m
    out["cells false needed"] = float(bad_worse > 0)  # per study: any false cell claim
    out["cells false no difference"] = float(bad_same > 0)
    out["cell claims share false needed"] = (bad_worse, worse)
    out["cell claims share false no difference"] = (bad_same, same)
    # H2: each primary measure's claim against its noiseless effect
    pooled = h2.filter(pl.col("depth").is_null())
    decision = dict(zip(pooled["measure"], pooled["decision"]))
    for measure, effect, margin in ((MAX_STABLE, truth.stable_effect,
                                     math.log(options.lr_ratio_margin)),
                                    (SENSITIVITY, truth.sensitivity_drop, m)):
        d = decision.get(measure)
        # each claim against the margin (amendment 3): "for" is an effect beyond +margin
        out[f"H2 {measure} false supported"] = float(d == "for" and effect <= margin)
        out[f"H2 {measure} false not supported"] = float(
            (d == "against" and effect >= -margin) or (d == "equivalent" and abs(effect) >= margin))
        out[f"H2 {measure} false no difference"] = float(d == "equivalent"
                                                         and abs(effect) >= margin)
        out[f"H2 {measure} power"] = float(effect > margin and d == "for")
        # "equivalent" where the truth lies inside the margin (x1 and x1.5 of the boundary)
        out[f"H2 {measure} equivalence power"] = float(abs(effect) < margin and d == "equivalent")
    # H3: the slope's claims against the planted one
    row = h3.row(0, named=True) if h3.height else None
    d3 = row["decision"] if row else None
    s, sm = truth.slope, options.slope_margin
    falls = not math.isnan(s) and s < 0
    out["H3 false supported"] = float(supported(verdict["H3"]) and not falls)
    out["H3 false not supported"] = float(verdict["H3"] == "not supported" and (
        (d3 == "rises" and not (s > 0)) or (d3 == "equal" and not (abs(s) < sm))))
    out["H3 false no difference"] = float(d3 == "equal" and not (abs(s) < sm))
    out["H3 false rises"] = float(d3 == "rises" and not (s > 0))
    out["H3 power"] = float(falls and supported(verdict["H3"]))
    for k in slope_widenings:
        rows = h3_tests(runs, gaps, replace(options, slope_widening=k), study.draws)
        d = rows["decision"][0] if rows.height else None
        name = f"H3 slope draws x{k:g}"
        out[f"{name} false supported"] = float(d == "falls" and not falls)
        out[f"{name} false rises"] = float(d == "rises" and not (s > 0))
        out[f"{name} false no difference"] = float(d == "equal" and not (abs(s) < sm))
        out[f"{name} power"] = float(falls and d == "falls")
    # coverage: the threshold's interval (where the true threshold lies inside the grid) and
    # the slope's interval (where the slope is defined)
    hits = total = 0
    errors = []
    for r in th.iter_rows(named=True):
        t = truth.thresholds.get(r["depth"])
        if t is None or not math.isfinite(t) or not (-3 <= t <= math.log10(0.3)):
            continue
        lo = math.log10(r["ci_lo"]) if r["ci_lo"] else -math.inf
        hi = math.log10(r["ci_hi"]) if r["ci_hi"] else math.inf
        hits += lo <= t <= hi
        total += 1
        if r["threshold_lr"]:
            errors.append(math.log10(r["threshold_lr"]) - t)
    out["threshold coverage"] = hits / total if total else math.nan
    for k in threshold_widenings:
        inside = inner = 0
        for (_, depth), d in study.draws.items():
            t = truth.thresholds.get(depth)
            if t is None or not math.isfinite(t) or not (-3 <= t <= math.log10(0.3)):
                continue
            lo, hi = threshold_interval(d, k)
            inside += lo <= t <= hi
            inner += 1
        out[f"threshold x{k:g} coverage"] = inside / inner if inner else math.nan
    out["threshold bias"] = float(np.mean(errors)) if errors else math.nan
    if row and not math.isnan(s) and not math.isnan(row["slope"]):
        out["slope coverage"] = float(row["ci_lo"] <= s <= row["ci_hi"])
    else:
        out["slope coverage"] = math.nan
    return out


FALSE_KINDS = ("false supported", "false not supported", "false no difference", "false needed",
               "false rises")


def calibrate(studies: int, seeds: int = 5, noise: Noise = NOISE,
              scenarios: tuple[str, ...] = tuple(SCENARIOS), options: Options | None = None,
              base_seed: int = 0, candidates: bool = False,
              refine_steps: int = REFINE_STEPS) -> pl.DataFrame:
    """Per scenario and claim: how many of `studies` simulated studies made it, the rate and
    the upper end of its 95% Clopper-Pearson interval (false claims), or the rate (power) or
    mean (coverage). candidates: also score every candidate widening of H3's slope draws
    (SLOPE_WIDENINGS) and of the threshold interval (WIDENINGS) on the same studies.
    refine_steps: boundary-bisection steps per curve (the mini preset's by default)."""
    extra = (SLOPE_WIDENINGS, WIDENINGS) if candidates else ((), ())
    options = options or Options()
    rows = []
    for name in scenarios:
        scenario = SCENARIOS[name]
        truth = truth_of(scenario, noise, seeds, options)
        rng = np.random.default_rng([base_seed, seeds, list(SCENARIOS).index(name)])
        scores = [judge(make_world(scenario, noise, seeds, options.min_gap, rng,
                                   refine_steps=refine_steps), truth,
                        replace(options, draw_key=f"#{name}/{i}"), *extra)
                  for i in range(studies)]
        for key in scores[0]:
            what, claim = _split(key)
            if isinstance(scores[0][key], tuple):  # (false claims, claims) pooled over studies
                hits, n = (int(sum(s[key][i] for s in scores)) for i in (0, 1))
                rows.append({"scenario": name, "seeds": seeds, "hypothesis": "cell claims",
                             "claim": key.removeprefix("cell claims "), "count": hits,
                             "studies": n, "rate": hits / n if n else math.nan,
                             "upper_95": math.nan})
                continue
            values = np.array([s[key] for s in scores], float)
            values = values[np.isfinite(values)]
            kind = "coverage" if "coverage" in claim else "power" if claim == "power" else claim
            if kind == "power" and not _true(name, what, truth):
                continue  # no power to speak of where the hypothesis is false
            hits = int(values.sum()) if kind not in ("coverage", "bias") else None
            n = len(values)
            rows.append({"scenario": name, "seeds": seeds, "hypothesis": what, "claim": kind,
                         "count": hits, "studies": n,
                         "rate": float(values.mean()) if n else math.nan,
                         "upper_95": (S.clopper_pearson_upper(hits, n) if kind.startswith("false")
                                      and n else math.nan)})
    return pl.DataFrame(rows, schema={"scenario": pl.String, "seeds": pl.Int64,
                                      "hypothesis": pl.String, "claim": pl.String,
                                      "count": pl.Int64, "studies": pl.Int64,
                                      "rate": pl.Float64, "upper_95": pl.Float64})


WIDENINGS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)  # amendment 5's candidates, in order
COVERAGE_TARGET = 0.93


# the threshold's estimators scored side by side: the plan's (linear in the gap) and a
# candidate reading log(gap), gaps under a tenth of the margin read as that (threshold_from_fit)
# the plan's reading and the candidates: amendment 10's log-gap, amendment 12's midpoint,
# amendment 13's fitted logistic
ESTIMATORS: dict[str, dict] = {"linear": {}, "log-gap": {"floor": 0.01},
                               "bracket midpoint": {"midpoint": True},
                               "logistic": {"logistic": True}}


def threshold_coverage(studies: int, seeds: int, noise: Noise, scenarios: tuple[str, ...],
                       widenings: tuple[float, ...] = WIDENINGS, base_seed: int = 0
                       ) -> pl.DataFrame:
    """The necessity threshold's interval alone, on the same simulated studies for every
    estimator (ESTIMATORS) and widening k: per scenario, estimator and k, its coverage (true
    threshold inside), the shares missed below and above, and the estimate's bias (mean log10
    estimate - truth), over every depth whose true threshold lies inside the grid."""
    options = Options()
    counts: dict[tuple[str, str, float], list[int]] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    for name in scenarios:
        scenario = SCENARIOS[name]
        if scenario.onset is None:
            continue
        truth = truth_of(scenario, noise, seeds, options)
        rng = np.random.default_rng([base_seed, seeds, list(SCENARIOS).index(name), 5])
        for i in range(studies):
            runs = sweep(make_world(scenario, noise, seeds, options.min_gap, rng))
            opts = replace(options, draw_key=f"#{name}/{i}")
            gaps, _ = h1_tests(runs, opts)
            for (_, depth), linear in threshold_draws(runs, gaps, opts).items():
                t = truth.thresholds.get(depth)
                if t is None or not (-3 <= t <= math.log10(0.3)):
                    continue
                for estimator, how in ESTIMATORS.items():
                    d = reread(linear, options.min_gap, **how) if how else linear
                    if math.isfinite(d.point):
                        errors.setdefault((name, estimator), []).append(d.point - t)
                    for k in widenings:
                        lo, hi = threshold_interval(d, k)
                        c = counts.setdefault((name, estimator, k), [0, 0, 0])
                        c[0 if t < lo else 2 if t > hi else 1] += 1
    rows = []
    for (name, estimator, k), (below, inside, above) in counts.items():
        n = below + inside + above
        rows.append({"noise": noise.source, "scenario": name, "estimator": estimator,
                     "widening": k, "intervals": n, "coverage": inside / n, "below": below / n,
                     "above": above / n,
                     "bias": float(np.mean(errors.get((name, estimator), [math.nan])))})
    return pl.DataFrame(rows)


def chosen_widening(tables: list[pl.DataFrame], estimator: str = "linear") -> float | None:
    """Amendment 5's rule: the smallest candidate whose coverage is >= 93% in every scenario
    of every noise model (None when none is), for one estimator."""
    table = pl.concat(tables)
    if "estimator" in table.columns:
        table = table.filter(pl.col("estimator") == estimator)
    for k in WIDENINGS:
        if (table.filter(pl.col("widening") == k)["coverage"] >= COVERAGE_TARGET).all():
            return k
    return None


SLOPE_WIDENINGS = (1.75, 2.0, 2.5, 3.0)  # candidates beside the plan's t(0.975, n - 1) / z


def chosen_slope_widening(table: pl.DataFrame) -> float | None:
    """The smallest candidate widening of H3's slope draws whose every false-claim rate has an
    upper 95% bound below 5% in every scenario of `table` (None when none has)."""
    for k in SLOPE_WIDENINGS:
        rows = table.filter((pl.col("hypothesis") == f"H3 slope draws x{k:g}")
                            & pl.col("claim").str.starts_with("false"))
        if rows.height and (rows["upper_95"] < 0.05).all():
            return k
    return None


def _split(key: str) -> tuple[str, str]:
    for kind in (*FALSE_KINDS, "power", "coverage", "bias"):
        if key.endswith(kind):
            return key[: -len(kind)].strip(), kind if kind != "coverage" else key
    return key, key


def _true(scenario: str, what: str, truth: Truth) -> bool:
    if what.endswith(" equivalence"):  # H2's "no change": the truth within the margin
        effect, margin = ((truth.stable_effect, math.log(Options.lr_ratio_margin))
                          if MAX_STABLE in what else (truth.sensitivity_drop, Options.min_gap))
        return abs(effect) < margin
    if what.startswith("H1"):
        return truth.h1
    if what == f"H2 {MAX_STABLE}":
        return truth.stable_effect > math.log(Options.lr_ratio_margin)
    if what == f"H2 {SENSITIVITY}":
        return truth.sensitivity_drop > Options.min_gap
    return not math.isnan(truth.slope) and truth.slope < 0


def markdown(table: pl.DataFrame) -> str:
    """The table as docs/report.md shows it."""
    lines = ["| scenario | hypothesis | claim | n | result | 95% upper bound |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in table.iter_rows(named=True):
        if r["claim"].endswith("coverage"):
            result = f"{r['rate']:.1%} of intervals" if math.isfinite(r["rate"]) else "-"
        elif r["claim"] == "bias":
            result = (f"mean {r['rate']:+.3f} decades (estimate - truth)"
                      if math.isfinite(r["rate"]) else "-")
        elif math.isfinite(r["rate"]):
            result = f"{r['count']} ({r['rate']:.1%})"
        else:
            result = "no claims"
        bound = f"{r['upper_95']:.1%}" if math.isfinite(r["upper_95"]) else ""
        lines.append(f"| {r['scenario']} | {r['hypothesis']} | {r['claim']} | {r['studies']} | "
                     f"{result} | {bound} |")
    return "\n".join(lines)


USAGE = """usage: python -m analysis calibrate [key=value ...]

The analysis plan's error rates, power and interval coverage: the sweep's rules and the
report's verdict code on simulated studies of known truth (docs/report.md). Exit 1 when the
upper 95% bound of some false-claim rate is 5% or more.

keys (defaults shown):
  studies=300  simulated studies per scenario (a false-claim rate of 1.5% needs about 300 for
               its upper 95% bound to fall below 5%)
  seeds=5      seeds per cell (the mini's, fixed in advance; >= 2)
  scenarios=   comma-separated, of: null, same onset, one decade per doubling, half a decade
               per doubling (default: all)
  runs=        a runs folder (e.g. runs/mini) to fit the noise from; default: the noise fitted
               from the earlier mini's published intervals
  onset_sd=0   decades: each seed's onset shifted by N(0, onset_sd) (0.15: the per-seed-onset
               noise model of docs/report.md, amendment 5)
  threshold_widening=  the threshold interval's widening factor (default: the plan's)
  thresholds=false     true: only the threshold interval, for every candidate widening, under
               the default noise, per-seed onsets (onset_sd, default 0.15 here) and, with runs=,
               the noise fitted from it; prints amendment 5's choice of widening
  models=default,onsets,fitted  with thresholds=true: which noise models (fitted needs runs=)
  refine_steps=2       boundary-bisection steps per curve (the mini preset's)
  candidates=false     true: also score candidate widenings of H3's slope draws and of the
               threshold interval on the same studies, and print the smallest that passes"""


@dataclass(frozen=True)
class CalibrateArgs:
    """The calibrate command's key=value words."""

    studies: int = 300
    seeds: int = 5
    scenarios: str = ""
    runs: str = ""
    onset_sd: float = 0.0
    threshold_widening: float = Options.threshold_widening
    thresholds: bool = False
    models: str = "default,onsets,fitted"
    candidates: bool = False
    refine_steps: int = REFINE_STEPS


def cli(argv: list[str]) -> int:
    args = apply_overrides(CalibrateArgs(), split_key_values(argv))
    if args.studies < 1:
        raise UsageError(f"studies must be >= 1, not {args.studies}")
    if not 0 <= args.refine_steps <= 4:
        raise UsageError(f"refine_steps must be 0-4 (bisection steps per curve), not "
                         f"{args.refine_steps}")
    if args.seeds < 2:
        raise UsageError(f"seeds must be >= 2 (a paired test needs two), not {args.seeds}")
    names = tuple(n.strip() for n in args.scenarios.split(",") if n.strip()) or tuple(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    noise = NOISE
    if args.runs:
        from .load import load_runs
        from .study import analyse

        noise = fit_noise(analyse(load_runs(args.runs)).points)
    if not (math.isfinite(args.onset_sd) and args.onset_sd >= 0):
        raise UsageError(f"onset_sd must be a number >= 0 (decades), not {args.onset_sd}")
    if not (math.isfinite(args.threshold_widening) and args.threshold_widening >= 1):
        raise UsageError(f"threshold_widening must be >= 1, not {args.threshold_widening}")
    if args.thresholds:
        return _threshold_cli(args, names, noise if args.runs else None)
    if args.onset_sd:
        noise = replace(noise, onset_sd=args.onset_sd,
                        source=f"{noise.source}; per-seed onsets N(0, {args.onset_sd:g} decades)")
    t0 = time.perf_counter()
    table = calibrate(args.studies, args.seeds, noise, names,
                      Options(threshold_widening=args.threshold_widening),
                      candidates=args.candidates, refine_steps=args.refine_steps)
    print(f"noise: {noise.source} (correlation across LRs {noise.correlation:.2f}); "
          f"{args.refine_steps} boundary-bisection step(s) per curve")
    candidate = pl.col("hypothesis").str.contains(" x")
    print(markdown(table.filter(~candidate)))
    if args.candidates:
        print("\ncandidate widenings, scored on the same studies:")
        print(markdown(table.filter(candidate)))
        k = chosen_slope_widening(table)
        ok = [w for w in WIDENINGS
              if (table.filter(pl.col("hypothesis") == f"threshold x{w:g}")["rate"]
                  .drop_nans() >= COVERAGE_TARGET).all()]
        print(f"H3: smallest slope widening with every false-claim bound < 5%: "
              f"{'x' + format(k, 'g') if k else 'none of ' + str(SLOPE_WIDENINGS)}; threshold: "
              f"smallest widening covering >= {COVERAGE_TARGET:.0%} in every scenario: "
              f"{'x' + format(min(ok), 'g') if ok else 'none'}")
    false = table.filter(pl.col("claim").str.starts_with("false") & ~candidate
                         & pl.col("upper_95").is_not_nan())
    worst = false.sort("upper_95").row(-1, named=True)
    print(f"\nlargest false-claim rate: {false['rate'].max():.1%}; largest upper 95% bound "
          f"{worst['upper_95']:.1%} ({worst['scenario']}, {worst['hypothesis']} "
          f"{worst['claim']}; must be < 5%); {time.perf_counter() - t0:.0f} s")
    return 0 if worst["upper_95"] < 0.05 else 1


def _threshold_cli(args: CalibrateArgs, names: tuple[str, ...], fitted: Noise | None) -> int:
    """Amendment 5's measurement: coverage of every candidate widening under each noise model."""
    t0 = time.perf_counter()
    onset_sd = args.onset_sd or 0.15
    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    if wanted - {"default", "onsets", "fitted"}:
        raise UsageError(f"models: {sorted(wanted - {'default', 'onsets', 'fitted'})[0]!r} is "
                         "not one of default, onsets, fitted")
    models = [NOISE] if "default" in wanted else []
    if "onsets" in wanted:
        models.append(replace(NOISE, onset_sd=onset_sd, source=f"{NOISE.source}; per-seed "
                                                               f"onsets N(0, {onset_sd:g} decades)"))
    if fitted is not None and "fitted" in wanted:
        models.append(fitted)
    if not models:
        raise UsageError("models: none to run (fitted needs runs=)")
    tables = [threshold_coverage(args.studies, args.seeds, m, names) for m in models]
    for table in tables:
        print(f"noise: {table['noise'][0]}")
        print("| scenario | estimator | widening | intervals | coverage | true below / above | "
              "bias (decades) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in table.sort("scenario", "estimator", "widening").iter_rows(named=True):
            print(f"| {r['scenario']} | {r['estimator']} | {r['widening']:g} | {r['intervals']} | "
                  f"{r['coverage']:.1%} | {r['below']:.1%} / {r['above']:.1%} | {r['bias']:+.3f} |")
        print()
    for estimator in ESTIMATORS:
        k = chosen_widening(tables, estimator)
        worst = pl.concat(tables).filter(pl.col("estimator") == estimator)["bias"].abs().max()
        print(f"{estimator}: widening chosen by amendment 5's rule (coverage >= "
              f"{COVERAGE_TARGET:.0%} everywhere): " + (f"{k:g}" if k else "none of the candidates")
              + f"; largest |bias| {worst:.3f} decades")
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0 if chosen_widening(tables) else 1
