"""Simulated studies of known truth for the calibrations: the mini's design swept by the sweep's
own rules, its runs drawn from a noise model of real sweeps, under scenarios of planted onsets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl
from scipy import stats
from scipy.optimize import brentq

from qkstudy.sweep.adaptive import next_crossing_lr
from qkstudy.sweep.config import MINI
from qkstudy.sweep.refine import next_midpoint
from qkstudy.summaries import scored_loss

from .hypotheses import h1_tests
from .metrics import Options, max_usable_lr_per_seed, paired_gaps, with_losses
from .threshold import threshold_draws

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
DEPTHS = (2, 4, 8)
ARMS = ("none", "rmsnorm")
UNIGRAM = 3.118  # nats: the synthetic byte corpus's unigram entropy
INIT_LOSS = 5.6
PLATEAU = 0.45  # nats: off minus on once well past the onset (0.42-0.58 at LR 0.1-0.3)
# the mini preset's bisections: boundary steps per curve, steps of the seed-mean crossing per
# depth, the stop ratio
REFINE_STEPS, CROSSING_STEPS, REFINE_FACTOR = MINI.refine_steps, MINI.threshold_steps, \
    MINI.refine_factor
SLOPE_TOLERANCE = 1e-9  # decades per doubling: a true slope this close to 0 is 0


@dataclass(frozen=True)
class Noise:
    """What a real sweep's runs scatter by."""

    gap_sd: dict[int, tuple[float, ...]]  # per depth, per grid LR (NaN: no informative cell)
    correlation: float  # of one seed's gap deviations at adjacent half-decade LRs
    boundary: tuple[float, float]  # log10 first diverged LR: mean and SD over seeds
    collapse_lr: float  # from this LR both arms end near the unigram entropy (degraded)
    on_sd: float = 0.02  # seed SD of the on arm's loss (shared by both arms of a seed)
    source: str = ""
    # per real (depth, seed), one drawn per simulated seed: the off arm's first degraded LR in
    # decades above the onset, the on arm's (log10; inf: never before it diverged)
    off_degrade: tuple[float, ...] = ()
    on_degrade: tuple[float, ...] = ()
    boundary_correlation: float = 0.0  # of one seed's two divergence boundaries
    # decades: one seed's onset about its depth's (log10), the off arm's gap moved along log LR
    onset_sd: float = 0.0


# `fit_failures` of results/mini.tar.xz per (depth 2, 4, 8) x seeds 0-4 (Noise's fields)
MINI_OFF_DEGRADE = (0.815, 0.815, 0.815, 1.292, 0.292, 0.66, 1.66, 1.183, 0.66, 0.66, 1.022,
                    1.022, 1.022, 0.5, 1.022)
MINI_ON_DEGRADE = (0.0, math.inf, 0.0, math.inf, 0.0, math.inf, math.inf, math.inf, math.inf,
                   math.inf, -0.261, math.inf, -0.261, math.inf, math.inf)
# The earlier mini's gap intervals (docs/results.md's history): each cell's SD is recovered as
# half-width / t * sqrt(n); at LRs 1 and 3 neither arm learned. The correlation across LRs
# cannot be read off a table: 0.5 is assumed.
PUBLISHED = {  # depth: (mean, lo, hi, n) per grid LR 1e-3 ... 0.3
    2: ((0.021, 0.01, 0.03, 5), (0.024, -0.02, 0.07, 6), (-0.002, -0.10, 0.10, 6),
        (0.191, 0.07, 0.31, 6), (0.462, 0.45, 0.47, 3), (0.575, 0.40, 0.75, 4)),
    4: ((0.018, 0.00, 0.03, 6), (0.023, -0.00, 0.05, 6), (0.056, -0.11, 0.22, 6),
        (0.327, 0.15, 0.50, 5), (0.531, 0.39, 0.67, 4), (0.538, 0.37, 0.71, 3)),
    8: ((0.024, -0.00, 0.05, 6), (0.013, -0.01, 0.03, 6), (0.217, 0.12, 0.31, 4),
        (0.303, 0.17, 0.43, 3), (0.420, 0.21, 0.63, 5), (0.424, 0.26, 0.59, 5)),
}
NOISE = Noise(
    gap_sd={depth: tuple((hi - lo) / 2 / stats.t.ppf(0.975, n - 1) * math.sqrt(n)
                         for _, lo, hi, n in cells) + (math.nan, math.nan)
            for depth, cells in PUBLISHED.items()},
    correlation=0.5, boundary=(math.log10(0.7), 0.13), collapse_lr=1.0,
    source="the earlier mini's gap intervals (docs/results.md's history); correlation across "
           "LRs assumed 0.5; failures short of divergence from the mini",
    off_degrade=MINI_OFF_DEGRADE, on_degrade=MINI_ON_DEGRADE, boundary_correlation=0.65)


def fit_noise(points: pl.DataFrame) -> Noise:
    """The noise of a real sweep: per depth and grid LR the gap's seed SD (shrunk towards the
    LR's SD pooled over depths with 4 degrees of freedom), the correlation of seeds' gap
    deviations at adjacent LRs, the divergence boundary and where every on-arm run failed."""
    options = Options()
    cells = h1_tests(points, options)[0]
    gaps = paired_gaps(points, options)
    informative = cells.filter(pl.col("informative") & (pl.col("pairs") >= 2))
    var = {(d, lr): s ** 2 for d, lr, s in informative.select("depth", "lr", "gap_sd").iter_rows()}
    dof = {(d, lr): n - 1 for d, lr, n in informative.select("depth", "lr", "pairs").iter_rows()}
    prior = {lr: np.mean([var[(d, lr)] for d in DEPTHS if (d, lr) in var]) for lr in LRS
             if any((d, lr) in var for d in DEPTHS)}  # the LR's variance pooled over depths
    sd = {depth: tuple(math.sqrt((var[(depth, lr)] * dof[(depth, lr)] + prior[lr] * 4)
                                 / (dof[(depth, lr)] + 4)) if (depth, lr) in var else math.nan
                       for lr in LRS) for depth in DEPTHS}
    r = []
    for depth in DEPTHS:
        ok = informative.filter(pl.col("depth") == depth)["lr"].to_list()
        g = gaps.filter((pl.col("depth") == depth) & pl.col("lr").is_in(LRS))
        wide = g.pivot(on="lr", index="seed", values="gap").drop("seed")
        for a, b in zip(LRS, LRS[1:]):
            if a in ok and b in ok and str(a) in wide.columns and str(b) in wide.columns:
                r += _correlation(wide[str(a)].to_numpy(), wide[str(b)].to_numpy())
    stable = max_usable_lr_per_seed(points, options).drop_nulls("first_divergent_lr")
    first = np.log10(stable["first_divergent_lr"].to_numpy())
    on_failed = cells.filter(~pl.col("informative"))["lr"].to_list()
    collapse = min([lr for lr in LRS if lr in on_failed] or [max(LRS)])
    off_degrade, on_degrade, rho = fit_failures(points, cells, options)
    return Noise(gap_sd=sd, correlation=float(np.clip(np.mean(r), 0, 0.95)) if r else 0.5,
                 boundary=(float(first.mean()), float(first.std(ddof=1)) if first.size > 1
                           else 0.13), collapse_lr=collapse,
                 source=f"fitted from {points.height} runs", off_degrade=off_degrade,
                 on_degrade=on_degrade, boundary_correlation=rho)


def fit_failures(points: pl.DataFrame, cells: pl.DataFrame, options: Options
                 ) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """A real sweep's off_degrade, on_degrade and boundary correlation (Noise's)."""
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
    r = _correlation(*(np.log10(wide[c].to_numpy()) for c in ARMS)) \
        if set(ARMS) <= set(wide.columns) else []
    return tuple(off), tuple(on), float(np.clip(r[0], 0, 0.95)) if r else 0.5


def _correlation(x: np.ndarray, y: np.ndarray) -> list[float]:
    """[Pearson's r] over the pairs where both are finite; [] below 3 pairs or without spread."""
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or x[keep].std() == 0 or y[keep].std() == 0:
        return []
    return [float(np.corrcoef(x[keep], y[keep])[0, 1])]


@dataclass(frozen=True)
class Scenario:
    """A truth: onset LR per depth (None: no effect), low-LR gap, boundary ratio, width."""

    onset: dict[int, float] | None
    low_gap: dict[int, float] = field(default_factory=dict)
    boundary_ratio: float = 1.0
    ramp: float = 0.15
    # a gap (nats) below LR 3e-4 where neither arm is trained and QK-norm learns faster (the
    # ladder's short points), gone by 1e-3; not part of the onset
    undertrain: dict[int, float] = field(default_factory=dict)


UNDERTRAIN_CENTRE, UNDERTRAIN_WIDTH = math.log10(math.sqrt(3e-4 * 1e-3)), 0.08


def undertrain_gap(scenario: Scenario, depth: int, lr: float) -> float:
    z = (math.log10(lr) - UNDERTRAIN_CENTRE) / UNDERTRAIN_WIDTH
    return scenario.undertrain.get(depth, 0.0) / (1 + math.exp(min(z, 700.0)))


SCENARIOS = {
    "null": Scenario(None),
    "same onset": Scenario({2: 0.012, 4: 0.012, 8: 0.012}, low_gap={2: 0.03}),
    "one decade per doubling": Scenario({2: 0.2, 4: 0.02, 8: 0.002}),
    "half a decade per doubling": Scenario({2: 10 ** -1.5, 4: 1e-2, 8: 10 ** -2.5},
                                           boundary_ratio=3.0),
    # the full gap within a tenth of a grid step: the bisection decides where a depth reads it
    "sharp onset": Scenario({2: 0.015, 4: 0.015, 8: 0.015}, ramp=0.005),
}


def true_gap(scenario: Scenario, depth: int, lr: float, margin: float) -> float:
    """Off minus on without noise: a logistic in log LR reaching `margin` at the onset."""
    if scenario.onset is None:
        return 0.0
    onset = math.log10(scenario.onset[depth])
    centre = onset + scenario.ramp * math.log(PLATEAU / margin - 1)
    z = (math.log10(lr) - centre) / scenario.ramp
    ramp = PLATEAU / (1 + math.exp(-z)) if z > -700 else 0.0
    return ramp + (scenario.low_gap.get(depth, 0.0) if math.log10(lr) < onset else 0.0)


# probabilists' Gauss-Hermite nodes and weights: the mean over a normal seed onset shift
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(41)
WEIGHTS = WEIGHTS / WEIGHTS.sum()


def expected_gap(scenario: Scenario, depth: int, lr: float, margin: float, sd: float) -> float:
    """The gap's mean over seeds whose onsets scatter by `sd` decades (true_gap at sd 0)."""
    if not sd:
        return true_gap(scenario, depth, lr, margin)
    return float(sum(w * true_gap(scenario, depth, lr * 10 ** (-sd * z), margin)
                     for z, w in zip(NODES, WEIGHTS)))


def population_onset(scenario: Scenario, depth: int, margin: float, sd: float) -> float:
    """log10 LR where the seeds' mean ramp (the gap without its low-LR part) reaches `margin`:
    the planted onset at sd 0, lower where the ramp is convex there and the seeds scatter."""
    onset = math.log10(scenario.onset[depth])
    if not sd:
        return onset
    ramp = replace(scenario, low_gap={})
    return brentq(lambda x: expected_gap(ramp, depth, 10 ** x, margin, sd) - margin,
                  onset - 2, onset + 2, xtol=1e-6)


LATTICE = np.arange(-3.25, 0.75, 1 / 32)  # log10 LRs where one seed's noise is drawn


@dataclass
class World:
    """One simulated study's random draws, fixed before any run is 'trained'."""

    scenario: Scenario
    noise: Noise
    margin: float
    seeds: int
    gap_noise: dict[tuple[int, str], np.ndarray]  # (depth, arm) -> (seeds, lattice)
    on_offset: dict[int, np.ndarray]  # depth -> (seeds,) shared by both arms and LRs
    on_noise: dict[int, np.ndarray]  # depth -> (seeds, lattice): the collapsed runs' scatter
    boundary: dict[tuple[int, str], np.ndarray]  # (depth, arm) -> (seeds,) log10 first diverged
    # (depth, arm) -> (seeds,) log10 of the first degraded LR (inf: only from collapse_lr)
    degrade: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    # depth -> (seeds,) decades each seed's onset lies from its depth's (empty: none)
    onset_shift: dict[int, np.ndarray] = field(default_factory=dict)
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
        loss = 2.23 + 0.06 * (math.log10(lr) + 2.5) ** 2 + self.on_offset[depth][seed] + \
            self.sd(depth, lr) / math.sqrt(2) * self.gap_noise[(depth, arm)][seed, i]
        if arm == "none":  # the seed's own gap: its depth's moved by the seed's onset shift
            shift = self.onset_shift[depth][seed] if self.onset_shift else 0.0
            loss += true_gap(self.scenario, depth, lr * 10 ** -shift, self.margin) + \
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

    def normal(sd: float) -> np.ndarray:
        return np.zeros(seeds) if noiseless else rng.normal(0, sd, seeds)

    mean, spread = noise.boundary
    ratio = {"none": 0.0, "rmsnorm": math.log10(scenario.boundary_ratio)}
    world = World(
        scenario=scenario, noise=noise, margin=margin, seeds=seeds,
        gap_noise={(dp, arm): process() for dp in depths for arm in ARMS},
        on_offset={dp: normal(noise.on_sd) for dp in depths},
        on_noise={dp: process() for dp in depths},
        boundary={(dp, arm): mean + ratio[arm] + normal(spread) for dp in depths for arm in ARMS},
        depths=depths, lrs=lrs, refine_steps=refine_steps, lattice=lattice)
    rho = noise.boundary_correlation
    if rho > 0 and not noiseless:  # a shared part: b = mean + spread (sqrt(1-rho) z + sqrt(rho) s)
        for dp in depths:
            shared = rng.normal(0, spread, seeds)
            for arm in ARMS:
                own = world.boundary[(dp, arm)] - mean - ratio[arm]
                world.boundary[(dp, arm)] += (math.sqrt(1 - rho) - 1) * own + math.sqrt(rho) * shared
    if noise.off_degrade or noise.on_degrade:
        world.degrade = failure_draws(scenario, noise, seeds, rng, noiseless, depths)
    if noise.onset_sd:  # noiseless: the normal quantiles, so the seeds still differ
        even = stats.norm.ppf((np.arange(seeds) + 0.5) / seeds)
        world.onset_shift = {dp: noise.onset_sd * (even if noiseless else
                                                   rng.standard_normal(seeds)) for dp in depths}
    return world


def failure_draws(scenario: Scenario, noise: Noise, seeds: int, rng: np.random.Generator,
                  noiseless: bool, depths: tuple[int, ...]) -> dict[tuple[int, str], np.ndarray]:
    """Each simulated (depth, arm, seed)'s first degraded LR (log10), from a real sweep's."""
    def pick(values: tuple[float, ...]) -> np.ndarray:
        v = np.asarray(values, float)
        return (np.full(seeds, math.inf) if not values else np.full(seeds, float(np.median(v)))
                if noiseless else rng.choice(v, seeds))

    out = {}
    for dp in depths:
        out[(dp, "rmsnorm")] = pick(noise.on_degrade)
        out[(dp, "none")] = (pick(noise.on_degrade) if scenario.onset is None
                             or not noise.off_degrade
                             else math.log10(scenario.onset[dp]) + pick(noise.off_degrade))
    return out


def sweep(world: World) -> pl.DataFrame:
    """The runs the mini's sweep would train in this world, bisection steps included."""
    runs: dict[tuple[int, str, float, int], tuple[str, float | None]] = {}

    def train(*key) -> tuple[str, float | None]:  # (depth, arm, lr, seed), each run once
        if key not in runs:
            runs[key] = world.run(*key)
        return runs[key]

    for depth in world.depths:
        for seed in range(world.seeds):
            for arm in ARMS:
                results = {lr: train(depth, arm, lr, seed)[0] == "completed" for lr in world.lrs}
                while (lr := next_midpoint(results, world.lrs, world.refine_steps,
                                           REFINE_FACTOR)) is not None:
                    results[lr] = train(depth, arm, lr, seed)[0] == "completed"
        means: dict[float, float] = {}
        lrs = list(world.lrs)
        for step in range(CROSSING_STEPS + 1):
            for lr in lrs:
                pairs = [(train(depth, "none", lr, s), train(depth, "rmsnorm", lr, s))
                         for s in range(world.seeds)]
                diverged = np.array([[st == "diverged" for st, _ in pair] for pair in pairs])
                final = np.array([[math.nan if v is None else v for _, v in pair]
                                  for pair in pairs])
                loss, degraded = scored_loss(final, INIT_LOSS, diverged, UNIGRAM)
                if not (diverged | degraded).all():  # some run learned: the cell counts
                    means[lr] = float(np.mean(loss[:, 0] - loss[:, 1]))
            mid = next_crossing_lr(means, world.margin, REFINE_FACTOR)
            if step == CROSSING_STEPS or mid is None:
                break
            lrs = [mid]
    return pl.DataFrame(
        [{"depth": dp, "arm": arm, "qk_norm": arm, "lr": lr, "seed": s, "status": st,
          "init_loss": INIT_LOSS, "final_val_loss": v, "unigram_entropy": UNIGRAM}
         for (dp, arm, lr, s), (st, v) in runs.items()],
        schema={"depth": pl.Int64, "arm": pl.String, "qk_norm": pl.String, "lr": pl.Float64,
                "seed": pl.Int64, "status": pl.String, "init_loss": pl.Float64,
                "final_val_loss": pl.Float64, "unigram_entropy": pl.Float64})
