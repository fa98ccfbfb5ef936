"""Calibration of the verdict machinery: the real verdict code (analysis.verdicts) run on
simulated studies whose truth is known, to measure how often a false claim is called supported
and how often a true one is found (docs/report.md shows the table).

A simulated study has the mini's design (depths 2, 4, 8; both arms; 8 half-decade LRs from 1e-3
to 3; n seeds) and its noise: each run's final loss is a U-shaped curve over log LR plus a seed
effect shared by both arms of one seed and LR (the paired design) plus run noise whose size
grows with the LR, as measured in the mini (0.01 nats at 1e-3, about 0.06 at 1). Every run at
LR 3 diverges in both arms; at LR 1 the shallowest depth's runs end degraded (near the unigram
entropy) in both arms. Scenarios:
- null: QK-norm changes nothing (off = on + noise, same statuses). Every "supported" is false.
- same threshold: off is worse by 0.3 nats from LR 0.03 at every depth. H3 is false.
- falling threshold: off is worse from LR 0.1, 0.03 and 0.01 at depths 2, 4, 8. All true.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from qkstudy.config import apply_overrides, split_key_values
from qkstudy.errors import UsageError

from .metrics import Options
from .verdicts import study_verdicts

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
DEPTHS = (2, 4, 8)
UNIGRAM = 3.1  # nats: the synthetic byte corpus's unigram entropy
INIT_LOSS = 5.6
EFFECT = 0.3  # nats: off minus on at and above a planted threshold

SCENARIOS = {
    "null": None,
    "same threshold": {2: 0.03, 4: 0.03, 8: 0.03},
    "falling threshold": {2: 0.1, 4: 0.03, 8: 0.01},
}
# which hypotheses are true in each scenario (a "supported" verdict on a false one is an error)
TRUTH = {"null": {"H1": False, "H2": False, "H3": False},
         "same threshold": {"H1": True, "H2": True, "H3": False},
         "falling threshold": {"H1": True, "H2": True, "H3": True}}


def simulate(scenario: str, seeds: int, rng: np.random.Generator) -> pl.DataFrame:
    """One simulated study's points frame (the columns analysis.metrics reads)."""
    thresholds = SCENARIOS[scenario]
    rows = []
    for depth in DEPTHS:
        for seed in range(seeds):
            for lr in LRS:
                x = np.log10(lr)
                base = 2.35 + 0.08 * (x + 1.5) ** 2
                noise = 0.01 * 10 ** (0.4 * (x + 3))  # 0.01 at 1e-3, ~0.06 at 1
                shared = rng.normal(0, noise)
                for arm in ("none", "rmsnorm"):
                    effect = EFFECT if (arm == "none" and thresholds is not None
                                        and lr >= thresholds[depth]) else 0.0
                    loss = base + effect + shared + rng.normal(0, noise)
                    status = "completed"
                    if lr >= 3.0:
                        status, loss = "diverged", None
                    elif lr >= 1.0 and depth == DEPTHS[0]:
                        loss = UNIGRAM - 0.05 + rng.normal(0, 0.02)  # collapsed, both arms
                    rows.append({"depth": depth, "arm": arm, "qk_norm": arm, "lr": lr,
                                 "seed": seed, "status": status, "init_loss": INIT_LOSS,
                                 "final_val_loss": loss, "unigram_entropy": UNIGRAM})
    return pl.DataFrame(rows)


def supported(verdict: str) -> bool:
    """A verdict that claims support, in whole or in part."""
    return verdict.startswith("supported") or verdict.startswith("partly supported")


def calibrate(studies: int, seed_counts: tuple[int, ...], options: Options | None = None,
              scenarios: tuple[str, ...] = tuple(SCENARIOS), base_seed: int = 0
              ) -> pl.DataFrame:
    """Per (scenario, seeds, hypothesis): the share of simulated studies called supported,
    and whether that is a false-positive rate (the hypothesis is false) or power."""
    rows = []
    for scenario in scenarios:
        for n in seed_counts:
            rng = np.random.default_rng([base_seed, n, list(SCENARIOS).index(scenario)])
            counts = {"H1": 0, "H2": 0, "H3": 0}
            for _ in range(studies):
                table = study_verdicts(simulate(scenario, n, rng), options or Options())[0]
                for r in table.iter_rows(named=True):
                    counts[r["hypothesis"]] += supported(r["verdict"])
            for h, c in counts.items():
                true = TRUTH[scenario][h]
                rows.append({"scenario": scenario, "seeds": n, "hypothesis": h,
                             "truth": "true" if true else "false",
                             "measures": "power" if true else "false-positive rate",
                             "called_supported": c, "studies": studies,
                             "rate": c / studies})
    return pl.DataFrame(rows)


def markdown(table: pl.DataFrame) -> str:
    """The table as docs/report.md shows it."""
    lines = ["| scenario | seeds | hypothesis | truth | called supported | measures |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in table.iter_rows(named=True):
        lines.append(f"| {r['scenario']} | {r['seeds']} | {r['hypothesis']} | {r['truth']} | "
                     f"{r['called_supported']} of {r['studies']} ({r['rate']:.1%}) | "
                     f"{r['measures']} |")
    return "\n".join(lines)


USAGE = """usage: python -m analysis calibrate [key=value ...]

The verdicts' false-positive rate and power: the real verdict code on simulated studies of
known truth (docs/report.md). Exit 1 when a false claim is called supported in more than 5%.

keys (defaults shown):
  studies=200  simulated studies per scenario and seed count
  seeds=3,6    the seed counts to simulate (each >= 2)"""


@dataclass(frozen=True)
class CalibrateArgs:
    """The calibrate command's key=value words."""

    studies: int = 200
    seeds: str = "3,6"


def cli(argv: list[str]) -> int:
    args = apply_overrides(CalibrateArgs(), split_key_values(argv))
    try:
        seed_counts = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        raise UsageError(f"seeds takes integers like 3,6, not {args.seeds!r}") from None
    if args.studies < 1:
        raise UsageError(f"studies must be >= 1, not {args.studies}")
    if min(seed_counts) < 2:
        raise UsageError(f"every seeds value must be >= 2 (a paired test needs two), "
                         f"not {args.seeds!r}")
    t0 = time.perf_counter()
    table = calibrate(args.studies, seed_counts)
    print(markdown(table))
    worst = table.filter(pl.col("truth") == "false")["rate"].max()
    print(f"\nlargest false-positive rate: {worst:.1%} (must be <= 5%); "
          f"{time.perf_counter() - t0:.0f} s")
    return 0 if worst <= 0.05 else 1
