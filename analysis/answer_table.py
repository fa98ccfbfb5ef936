"""The README's answer, from the ladder's analysis (analysis/ladder.py): the measured onsets by
model body and warmup, the rule read off them, and the fitted laws' predictions apart. Every
row comes from the points archived: a new point joins its body's rows when it lands."""

from __future__ import annotations

import math

import polars as pl

from qkstudy.progress import table
from qkstudy.sweep.ladder import KNOWN, SCORED_POINTS, SIZE_TESTS, STUDY_POINT

from .ladder import ci_text
from .prose import span
from .size_law import non_embedding

BASE = (64, 4, 32)  # the ladder's model body: d_model, depth, head dim
BODY = "model body: d_model / depth / head dim"
PARAMS = "parameters outside the embeddings"
MEASURED = [BODY, PARAMS, "warmup steps", "training steps", "LRs run (seeds)",
            "skip below: no difference decided at every LR run up to it, from the smallest",
            "onset: off 0.1 nats worse from LR [95% CI]", "best LR, QK-norm on / off",
            "cost of skipping QK-norm, each arm at its best LR: nats [95% CI]"]
PREDICTED = [BODY, PARAMS, "warmup steps", "training steps", "predicted by",
             "predicted onset [95% interval of the onset measured at the point's seeds]",
             "measured there"]


def body_text(body: tuple[int, int, int]) -> str:
    return "/".join(map(str, body))


def millions(n: float) -> str:
    return f"{n / 1e6:.2f}M"


def _lr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def onset_cell(r: dict) -> str:
    """The onset with its interval, or "< X" / "> X" alone where it lies beyond the LRs read."""
    if r["onset_lr"] is None and r.get("onset_side") and r.get("onset_bound") is not None:
        return f"{'<' if r['onset_side'] == 'below' else '>'} {r['onset_bound']:.3g}"
    return r["onset"]


def onset_short(r: dict) -> str:
    """The onset alone: "0.0438", "< 0.01"."""
    return onset_cell(r).split(" [")[0]


def onset_value(r: dict) -> float | None:
    """The onset, or the LR bound it lies beyond."""
    return r["onset_lr"] if r["onset_lr"] is not None else r.get("onset_bound")


def rows_of(points: pl.DataFrame) -> list[dict]:
    """Each ladder point with its model body, parameters outside the embeddings and LR grid,
    ordered by the body's size, then warmup and training steps."""
    out = []
    for r in points.iter_rows(named=True):
        p = KNOWN[r["point"]]
        out.append({**r, "body": (p.d_model, p.depth, p.head_dim),
                    "params": non_embedding(r["point"]), "grid": (min(p.lrs), max(p.lrs))})
    return sorted(out, key=lambda r: (r["params"], r["body"], r["warmup"], r["steps"]))


def _body_cell(body: tuple[int, int, int]) -> str:
    own = body == (STUDY_POINT.d_model, STUDY_POINT.depth, STUDY_POINT.head_dim)
    return body_text(body) + (" (the study preset's)" if own else "")


def _steps_cell(r: dict) -> str:
    own = (r["warmup"], r["steps"]) == (STUDY_POINT.warmup, STUDY_POINT.steps)
    return f"{r['steps']:,}" + (" (the study preset's schedule)" if own else "")


def _best_cell(r: dict) -> str:
    if r.get("best_lr_on") is None:
        return "-"
    return f"{r['best_lr_on_text']} / {r['best_lr_off_text']}"  # "≤ X": at the smallest LR run


def measured_table(rows: list[dict]) -> str:
    cells = [[_body_cell(r["body"]), millions(r["params"]), f"{r['warmup']:,}", _steps_cell(r),
              f"{r['grid'][0]:g} to {r['grid'][1]:g} ({r['seeds']})",
              _lr(r["no_difference_up_to"]), onset_cell(r), _best_cell(r),
              ci_text(r, "best_gap", "+.3f")] for r in rows]
    return "\n".join(table(MEASURED, cells))


# --- the rule -----------------------------------------------------------------------------------

def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def by_schedule(rows: list[dict]) -> list[tuple[tuple[int, int], list[dict]]]:
    """Per schedule (warmup, steps) measured at two or more bodies, one row per body (a read
    onset before a bound, then more seeds, then the later point), smallest body first; the
    schedules ordered by how far the onset moves across their bodies, most first."""
    chosen: dict[tuple[int, int], dict] = {}
    for r in rows:
        if onset_value(r) is None:
            continue
        key = (r["warmup"], r["steps"], *r["body"])
        rank = (r["onset_lr"] is not None, r["seeds"], list(KNOWN).index(r["point"]))
        if key not in chosen or rank > chosen[key]["rank"]:
            chosen[key] = {**r, "rank": rank}
    groups: dict[tuple[int, int], list[dict]] = {}
    for key, r in chosen.items():
        groups.setdefault(key[:2], []).append(r)
    moved = [(s, sorted(g, key=lambda r: (r["params"], r["body"]))) for s, g in groups.items()
             if len(g) > 1]

    def spread(group: list[dict]) -> float:
        values = [math.log10(onset_value(r)) for r in group]
        return max(values) - min(values)
    return sorted(moved, key=lambda sg: -spread(sg[1]))


def _best_lr_words(on: str, off: str) -> str:
    """Where each arm's best LR lies when one is a bound ("≤"/"≥": at the grid's end); "" when
    both are measured."""
    if on == off == "≤":
        return "the smallest LR run (where both did best: their best LRs may lie lower)"
    if {on, off} & {"≤", "≥"}:
        return "its best LR within the LRs run (one lay at an end of them: the best may lie beyond)"
    return ""


def _cost_words(r: dict) -> str:
    gap = ci_text(r, "best_gap", "+.3f")
    if gap == "-":
        return ""
    at = _best_lr_words(r["best_lr_on_text"][0], r["best_lr_off_text"][0])
    if r["best_gap_lo"] > 0:
        return f", where skipping QK-norm cost {gap} nats " + (
            f"with each arm at {at}" if at else "even with each arm at its best LR")
    return (f", where with each arm at {at or 'its best LR'} skipping QK-norm changed the loss "
            f"by {gap} nats")


def size_sentence(rows: list[dict]) -> str:
    """The onset across the model bodies measured at a shared schedule."""
    groups = by_schedule(rows)
    if not groups:
        return ("Model size: no two model bodies were measured at one schedule, so the table "
                "does not separate size from schedule.")
    parts = []
    for i, ((warmup, steps), group) in enumerate(groups):
        bodies = [f"{onset_short(r)} for {body_text(r['body'])} ({millions(r['params'])}"
                  + ("" if i or j else " parameters outside the embeddings") + ")"
                  for j, r in enumerate(group)]
        parts.append(f"at {warmup:,} warmup steps of {steps:,} it was {_and(bodies)}"
                     + ("" if i else _cost_words(group[-1])))
    parts[0] = parts[0].replace("it was", "the onset was", 1)
    return "Model size first: " + "; ".join(parts) + "."


def warmup_sentence(rows: list[dict]) -> str:
    """The onset against warmup at the ladder's model body, and skipping's cost there."""
    base = [r for r in rows if r["body"] == BASE and r["onset_lr"] is not None]
    warmups = sorted({r["warmup"] for r in base})
    if len(warmups) < 2:
        return f"Warmup: {body_text(BASE)} was not measured at two warmups."
    low = [r["onset_lr"] for r in base if r["warmup"] == warmups[0]]
    high = [r["onset_lr"] for r in base if r["warmup"] == warmups[-1]]
    verb = ("raised" if min(high) > max(low) else "lowered" if max(high) < min(low)
            else "did not consistently move")
    steps = [r["steps"] for r in base]
    out = (f"Then warmup: for {body_text(BASE)} a longer warmup {verb} it, from {span(low)} at "
           f"{warmups[0]:,} warmup steps to {span(high)} at {warmups[-1]:,} (runs of "
           f"{min(steps):,} to {max(steps):,} steps)")
    gaps = [r["best_gap"] for r in base if r.get("best_gap") is not None]
    if gaps:
        out += (f", and with each arm at its best LR skipping QK-norm changed the loss by "
                f"{min(gaps):+.3f} to {max(gaps):+.3f} nats")
    return out + "."


def limits_sentence(rows: list[dict]) -> str:
    """What the table does not show, beside what it does."""
    others = sorted({r["warmup"] for r in rows if r["body"] != BASE})
    at = (f"no body but {body_text(BASE)} at warmups other than "
          f"{_and([f'{w:,}' for w in others])}, " if others else
          f"no body but {body_text(BASE)}, ")
    return (f"It shows these bodies and schedules on this corpus only: no body above "
            f"{millions(max(r['params'] for r in rows))} parameters outside the embeddings, "
            f"{at}and no other corpus, context, batch or optimiser.")


def rule(rows: list[dict]) -> str:
    """The rule in three sentences: size first, then warmup, then what is not shown."""
    return "**The rule, read off the table.** " + " ".join(
        [size_sentence(rows), warmup_sentence(rows), limits_sentence(rows)])


def practitioner(ladder: dict) -> str:
    """The measured table by model body and warmup, and the rule read off it."""
    rows = rows_of(ladder["points"])
    return measured_table(rows) + "\n\n" + rule(rows)


# --- the predictions ---------------------------------------------------------------------------

def _measured_words(score: dict | None, point: str, points: pl.DataFrame) -> str:
    if score is not None:
        return f"{score['measured'].split(' [')[0]}: {score['inside']} the interval"
    return "not complete yet" if point in points["point"].to_list() else "not run yet"


def _prediction_row(p: dict, by: str, score: dict | None, points: pl.DataFrame) -> list[str]:
    q = KNOWN[p["point"]]
    r = {"warmup": q.warmup, "steps": q.steps}
    return [_body_cell((q.d_model, q.depth, q.head_dim)), millions(non_embedding(p["point"])),
            f"{q.warmup:,}", _steps_cell(r), by,
            f"{p['lr']:.3g} [{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]",
            _measured_words(score, p["point"], points)]


def predictions(ladder: dict) -> str:
    """The warmup law's predictions at its scored points (the study preset's schedule and
    body) and the size law's at its test points, each with the 95% interval of the onset a
    point of its seeds would measure, and what was measured there."""
    points, rows = ladder["points"], []
    scored = {p.name for p in SCORED_POINTS}
    scores = {(s["form"], s["point"]): s for s in ladder["scores"].iter_rows(named=True)}
    for fit in ladder["fits"]:
        if fit["form"] == "straight":
            by = f"the warmup law (fitted on the {body_text(BASE)} points)"
            rows += [(p["point"], _prediction_row(p, by, scores.get(("straight", p["point"])),
                                                  points))
                     for p in fit["predictions"] if p["point"] in scored]
    size = {(s["form"], s["point"]): s for s in ladder["size"]["scores"].iter_rows(named=True)}
    for fit in ladder["size"]["fits"]:
        if fit["target"] == "onset" and fit["lr"] is not None:
            by = (f"the size law, {fit['form']} form (fitted on "
                  f"{len(fit['points'].split(', '))} points)")
            rows += [(p["point"], _prediction_row(p, by, size.get((p["form"], p["point"])),
                                                  points)) for p in fit["predictions"]]
    order = {p.name: i for i, p in enumerate(SIZE_TESTS)}
    rows = [r for _, r in sorted(rows, key=lambda nr: order.get(nr[0], -1))]
    return "\n".join(table(PREDICTED, rows))
