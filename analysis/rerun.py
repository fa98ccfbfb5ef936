"""The study body rerun (docs/report.md, the size ladder: exploratory): the runs that
`w192-d6-s1200-wu480` and `w192-d6-hd64-s1200-wu480` share (the same configuration and fixed
seed, from two commits on two machines), compared by their final validation loss."""

from __future__ import annotations

import polars as pl

from qkstudy.arms import OFF
from qkstudy.progress import table

EARLIER, RERUN = "w192-d6-s1200-wu480", "w192-d6-hd64-s1200-wu480"
KEYS = ["lr", "arm", "seed"]


def rerun_cells(results: list) -> pl.DataFrame | None:
    """Per (LR, arm) the seeds both points ran, each one's mean final loss, the rerun's mean
    difference and the largest difference of one seed, in nats; None until both are read."""
    by = {r.name: r.study.points for r in results if r.study is not None}
    if EARLIER not in by or RERUN not in by:
        return None
    pair = by[EARLIER].select(*KEYS, "final_val_loss").join(
        by[RERUN].select(*KEYS, "final_val_loss"), on=KEYS, suffix="_rerun")
    diff = pl.col("final_val_loss_rerun") - pl.col("final_val_loss")
    return pair.group_by("lr", "arm").agg(
        seeds=pl.len(), earlier=pl.col("final_val_loss").mean(),
        rerun=pl.col("final_val_loss_rerun").mean(), mean_diff=diff.mean(),
        largest=diff.abs().max()).sort("lr", "arm")


def rerun_text(cells: pl.DataFrame | None) -> list[str]:
    """The comparison as a Markdown table, with what it is."""
    if cells is None or cells.is_empty():
        return []
    rows = [[f"{r['lr']:g}", "off" if r["arm"] == OFF else "on", str(r["seeds"]), f"{r['earlier']:.3f} / {r['rerun']:.3f}",
             f"{r['mean_diff']:+.3f}", f"{r['largest']:.3f}"] for r in cells.iter_rows(named=True)]
    return ["", f"The study body rerun (exploratory): the runs of fixed seeds (not added ones) "
                f"that `{EARLIER}` and `{RERUN}` share, the same configuration and seed run "
                "from two commits on two machines.", "",
            *table(["LR", "arm", "seeds", "mean final loss, earlier / rerun",
                    "rerun minus earlier, mean", "largest difference of one seed"], rows)]
