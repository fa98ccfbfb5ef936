"""Hand-made study tables with known answers, for the analysis tests: rows of (depth, arm, LR,
seed, final loss or None if diverged, init loss), onset sweeps whose gap starts at a chosen LR
per depth, per-arm divergence curves, and the study's tables and verdicts read from them."""

from __future__ import annotations

import polars as pl

from analysis import metrics as M
from analysis import verdicts as V


def points(rows: list[tuple]) -> pl.DataFrame:
    """(depth, qk_norm, lr, seed, final_val_loss or None if diverged, init_loss) rows."""
    return pl.DataFrame(
        [{"depth": d, "qk_norm": q, "arm": q, "lr": lr, "seed": s,
          "status": "diverged" if loss is None else "completed",
          "final_val_loss": loss, "init_loss": init} for d, q, lr, s, loss, init in rows],
        schema={"depth": pl.Int64, "qk_norm": pl.String, "arm": pl.String, "lr": pl.Float64,
                "seed": pl.Int64, "status": pl.String, "final_val_loss": pl.Float64,
                "init_loss": pl.Float64})


def verdicts(table: pl.DataFrame, options: M.Options | None = None) -> pl.DataFrame:
    return V.study_verdicts(table, options or M.Options()).verdicts


GRID = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
NOISE = [0.0, 0.01, -0.01, 0.02, -0.02, 0.005]  # per-seed offsets shared by both arms (paired)
GAP_NOISE = [0.004, -0.003, -0.001, 0.003, -0.004, 0.001]  # per-seed noise of the gap itself


def onset_sweep(first_needed: dict[int, float], seeds: int = 3) -> pl.DataFrame:
    """On arm at 3.0 (+ the seed's offset) everywhere; off equal below `first_needed[depth]`
    and 0.5 worse from it (each seed's gap off by a few thousandths), diverged at the largest
    LR."""
    rows = []
    for depth, start in first_needed.items():
        for lr in GRID:
            for seed in range(seeds):
                on = 3.0 + NOISE[seed]
                rows.append((depth, "rmsnorm", lr, seed, on, 5.5))
                off = None if lr == GRID[-1] else (
                    on + GAP_NOISE[seed] + (0.5 if lr >= start else 0.0))
                rows.append((depth, "none", lr, seed, off, 5.5))
    return points(rows)


def with_gaps(table: pl.DataFrame, lr: float, gaps: list[float], depth: int | None = None
              ) -> pl.DataFrame:
    """Set the off arm's loss at one LR to the on arm's plus gaps[seed]."""
    out = table
    for seed, gap in enumerate(gaps):
        on = table.filter((pl.col("qk_norm") == "rmsnorm") & (pl.col("lr") == lr)
                          & (pl.col("seed") == seed)
                          & ((pl.col("depth") == depth) if depth else True))["final_val_loss"][0]
        hit = ((pl.col("qk_norm") == "none") & (pl.col("lr") == lr) & (pl.col("seed") == seed)
               & ((pl.col("depth") == depth) if depth else True))
        out = out.with_columns(final_val_loss=pl.when(hit).then(pl.lit(on + gap))
                               .otherwise(pl.col("final_val_loss")),
                               status=pl.when(hit).then(pl.lit("completed"))
                               .otherwise(pl.col("status")))
    return out


def verdict_of(table: pl.DataFrame, hypothesis: str, options: M.Options | None = None) -> dict:
    return verdicts(table, options).filter(pl.col("hypothesis") == hypothesis).row(
        0, named=True)


def study_tables(table: pl.DataFrame, options: M.Options | None = None) -> dict:
    """The study's tables by name: verdicts, gaps, best, thresholds, h2, h3."""
    return V.study_verdicts(table, options or M.Options())._asdict()


def gap_table(table: pl.DataFrame) -> pl.DataFrame:
    return study_tables(table)["gaps"]


def thresholds(table: pl.DataFrame) -> pl.DataFrame:
    return study_tables(table)["thresholds"].sort("compared_arm", "depth")


def lr_curves(off_first_bad: list[float], on_first_bad: list[float], depths=(2,),
              grid=GRID) -> pl.DataFrame:
    """Per depth and seed, each arm stable (loss 3 + the seed's offset) below its first
    diverged LR and diverged from it."""
    rows = []
    for depth in depths:
        for seed, (a, b) in enumerate(zip(off_first_bad, on_first_bad)):
            for lr in grid:
                rows.append((depth, "none", lr, seed, None if lr >= a else 3.0 + NOISE[seed], 5.5))
                rows.append((depth, "rmsnorm", lr, seed,
                             None if lr >= b else 3.0 + NOISE[seed], 5.5))
    return points(rows)
