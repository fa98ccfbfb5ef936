"""The size ladder's registrations in docs/report.md, each written before the results it is
scored on exist: the size law's predictions for the test points (once every size point is
archived) and the early warning's prediction for each test point (once that point's off-arm
seeds 0 and 1 have run at every grid LR, read from its archive in results/ladder or, while its
other runs still train, results/ladder-partial). `python -m analysis.published --register`
fills each registration block that is still blank and never rewrites a filled one; the
published test holds every filled block equal to what the committed archives give."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import polars as pl

from qkstudy.progress import table
from qkstudy.sweep.ladder import SIZE_POINTS, SIZE_TESTS

from .blocks import block_text, replace_block
from .load import lr_key
from .study import ReportOptions
from .size_law import warning_ready, warning_reading
from .size_report import fit_text

BLANK = "not registered yet"
SIZE_BLOCK = "size-law-predictions"
# The test points' grids as the plan fixed them (commit 6e1678d), before the registration's rule
PLANNED = {"w256-d6-hd64-s1200-wu480": (0.001, 0.003, 0.01, 0.03),
           "w192-d6-hd64-s4800-wu1000": (0.003, 0.01, 0.03)}
BODY = "w192-d6-hd64-s1200-wu480"  # the size point of the test points' body


def warning_block_name(point: str) -> str:
    return f"early-warning-{point}"


def half_decade_below(lr: float) -> float:
    """The grid's next LR down: 0.003 -> 0.001, 0.01 -> 0.003."""
    return lr_key(lr / 3 if f"{lr:.0e}".startswith("3") else lr * 0.3)


def registered_grid(name: str, predictions: list[dict], body_best_on: float) -> tuple[float, ...]:
    """The plan's rule at registration: the planned grid gains the half-decade below its lowest
    LR where QK-norm's best LR at the body is at or below that LR, and loses its top LR where
    both forms' 95% intervals for the onset end below the LR under it."""
    lrs = list(PLANNED[name])
    if lr_key(body_best_on) <= lrs[0]:
        lrs.insert(0, half_decade_below(lrs[0]))
    ends = [q["ci_hi"] for q in predictions if q["point"] == name and q["form"].endswith("(onset)")]
    if len(lrs) > 2 and ends and all(e < lrs[-2] for e in ends):
        lrs.pop()
    return tuple(lrs)


def size_points_done(ladder: dict) -> bool:
    points = ladder["points"]
    done = set(points.filter(pl.col("complete"))["point"]) if points.height else set()
    return all(p.name in done for p in SIZE_POINTS)


def _body_best_on(ladder: dict) -> float:
    return ladder["points"].filter(pl.col("point") == BODY)["best_lr_on"].item()


def registered_grids(ladder: dict) -> dict[str, tuple[float, ...]]:
    """Each test point's grid by the plan's rule, from the size law's predictions and QK-norm's
    best LR at the body (every size point archived)."""
    predictions = [p for f in ladder["size"]["fits"] for p in f["predictions"]]
    return {p.name: registered_grid(p.name, predictions, _body_best_on(ladder)) for p in SIZE_TESTS}


def size_law_block(ladder: dict) -> str | None:
    """Both forms' predictions (onset and ratio) at the test points, the fits they come from
    and the test grids; None until every size point is archived complete."""
    if not size_points_done(ladder):
        return None
    fits = ladder["size"]["fits"]
    rows = [[f"`{p['point']}`", p["form"], f"{p['lr']:.3g} [{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]"]
            for f in fits for p in f["predictions"]]
    grids = "; ".join(f"`{name}` {', '.join(f'{lr:g}' for lr in lrs)}"
                      for name, lrs in registered_grids(ladder).items())
    return "\n".join(["Size law: " + " ".join(fit_text(f) for f in fits), "",
                      *table(["test point", "form (what it predicts)",
                              "predicted [95% interval of a new five-seed point]"], rows), "",
                      f"The test grids by the plan's rule (QK-norm's best LR at `{BODY}`: "
                      f"{_body_best_on(ladder):g}): {grids}."])


def warning_block(r) -> str | None:
    """The test point's off-arm logit at the warmup's end by LR (median of seeds 0 and 1) and
    the onset the early warning reads from it; None until those runs have all trained."""
    if not warning_ready(r):
        return None
    logits, v, side = warning_reading(r)
    by_lr = ", ".join(f"{lr:g}: {10 ** x:,.0f}" if math.isfinite(x) else f"{lr:g}: diverged"
                      for lr, x in logits.items())
    said = {"below": "below ", "above": "above "}.get(side, "")
    return (f"`{r.name}`: the off arm's max attention logit at the warmup's end (median of seeds "
            f"0 and 1), by LR: {by_lr}; the early warning's onset: {said}{10 ** v:.3g}.")


def test_point_archive(root: Path, name: str) -> Path | None:
    """The test point's archive: the complete one, else the partial one, else None."""
    for folder in ("ladder", "ladder-partial"):
        path = root / "results" / folder / f"{name}.tar.xz"
        if path.is_file():
            return path
    return None


def registrations(root: Path, ladder: dict) -> dict[str, str | None]:
    """Every registration block's content by name (None where not yet ready)."""
    from .ladder import TooFewRuns, load_point, point_dirs

    out = {SIZE_BLOCK: size_law_block(ladder)}
    for p in SIZE_TESTS:
        out[warning_block_name(p.name)] = None
        path = test_point_archive(root, p.name)
        if path is None:
            continue
        with contextlib.ExitStack() as stack:
            folder, = point_dirs(path, stack)
            with contextlib.suppress(TooFewRuns):  # too early to read: not ready
                out[warning_block_name(p.name)] = warning_block(load_point(folder,
                                                                           ReportOptions()))
    return out


def register(text: str, made: dict[str, str | None]) -> tuple[str, list[str]]:
    """The page with each blank registration block that is ready filled in, and the names
    filled; a filled block is left as it stands."""
    filled = []
    for name, content in made.items():
        if content is not None and block_text(text, name) == BLANK:
            text = replace_block(text, name, content)
            filled.append(name)
    return text, filled
