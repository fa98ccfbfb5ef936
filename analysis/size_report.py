"""The size ladder's Markdown (docs/results.md's ladder block): per point each arm's best LR,
the cost of skipping QK-norm and the off arm's logit at the warmup's end; which knob moves the
onset; the size law's forms, their predictions and scores; the early warning's."""

from __future__ import annotations

import math

import polars as pl

from qkstudy.progress import format_seconds

from .size_law import FORECAST, FORMS, _bounded, ratio_side, warning_reading


def point_extras(r) -> dict:
    """A point's best LRs, best-against-best gap, onset over QK-norm's best LR and the off
    arm's logit at the warmup's end per LR (every seed's median), for its row."""
    logits = warning_reading(r, tuple(range(r.seeds)))[0]
    ratio = _bounded(r) - math.log10(r.best["best_lr_on"])
    side = {None: "-", "below": "< ", "above": "> "}.get(ratio_side(r), "")
    return r.best | {"forecast_took": _took_text(r.name, r.took), "onset_over_best_lr": side if side == "-" else f"{side}{10 ** ratio:.3g}",
                     "off_logit_at_warmup_end": ", ".join(
                         f"{lr:g}: {10 ** v:,.0f}" if math.isfinite(v) else f"{lr:g}: diverged"
                         for lr, v in logits.items())}


def _took_text(name: str, took: float | None) -> str:
    if name not in FORECAST:
        return "-"
    return f"{format_seconds(FORECAST[name])} / {format_seconds(took)}"


def _shift_text(s: dict | None) -> str:
    if s is None:
        return "not measured yet"
    return f"{s['side']}{s['shift']:+.2f} [{s['ci_lo']:+.2f}, {s['ci_hi']:+.2f}]"


def transfer_text(scores: pl.DataFrame) -> str:
    """Which transfers across size better, per form (docs/report.md: the one with the smaller
    absolute errors): the onset's and its ratio's mean absolute error over the test points both
    scored as numbers; a point where either is a bound is left out and named."""
    errors = {(f, p): e for f, p, e in scores.select("form", "point", "error").iter_rows()}
    parts = []
    for form in FORMS:
        points = sorted({p for f, p in errors if f.startswith(form + " ")})
        both = [(p, errors[f"{form} (onset)", p], errors[f"{form} (ratio)", p]) for p in points
                if (f"{form} (onset)", p) in errors and (f"{form} (ratio)", p) in errors]
        bounds = [p for p, o, q in both if o.startswith(("<", ">")) or q.startswith(("<", ">"))]
        used = [(float(o), float(q)) for p, o, q in both if p not in bounds]
        if not used:
            if bounds:
                parts.append(f"{form}: no test point scored both as numbers (left out as a "
                             f"bound: {', '.join(bounds)})")
            continue
        onset, ratio = (sum(abs(v[i]) for v in used) / len(used) for i in (0, 1))
        better = "the ratio" if ratio < onset else "the onset" if onset < ratio else "neither"
        parts.append(f"{form}: the onset {onset:.2f}, its ratio to QK-norm's best LR {ratio:.2f}"
                     f" decades ({len(used)} test point{'s' * (len(used) > 1)}"
                     + (f"; left out as a bound: {', '.join(bounds)}" if bounds else "")
                     + f"), so {better} transfers better")
    return ("Which transfers across size better (the smaller mean absolute error at the test "
            "points): " + "; ".join(parts) + ".") if parts else ""


def fit_text(fit: dict) -> str:
    if fit["lr"] is None:
        return f"{fit['form']} ({fit['target']}): {fit['note']}."
    names = ("a", "b", "c", "g") if fit["form"] == "power" else ("a", "b", "c", "e", "h")
    return (f"{fit['form']} ({fit['target']}), over {len(fit['points'].split(', '))} points: "
            + ", ".join(f"{k} {v:+.3f}" for k, v in zip(names, fit["estimate"]))
            + f"; lack of fit {fit['lack_of_fit']:.3f} decades ({fit['df']} degrees of freedom).")


def size_text(points: pl.DataFrame, size: dict) -> list[str]:
    """The size ladder's Markdown: per point the best LRs and the cost of skipping QK-norm,
    which knob moves the onset, the size law's forms and their predictions."""
    from qkstudy.progress import table

    rows = [[f"`{r['point']}`", f"{r['best_lr_off_text']} / {r['best_lr_on_text']}",
             f"{r['best_loss_off']:.3f} / {r['best_loss_on']:.3f}",
             f"{r['best_gap']:+.3f} [{r['best_gap_lo']:+.3f}, {r['best_gap_hi']:+.3f}]"
             if r["best_gap_lo"] is not None else "-",
             r["onset_over_best_lr"], r["off_logit_at_warmup_end"], r["forecast_took"]]
            for r in points.iter_rows(named=True)]
    lines = ["", *table(["point", "best LR off / on", "best loss off / on",
                         "best-against-best gap, nats [95% CI]", "onset / on's best LR",
                         "off arm's max attention logit at the warmup's end, by LR",
                         "forecast / took"], rows)]
    lines += ["", *table(["what changes (480 warmup steps of 1,200)",
                          "onset shift, decades [95% CI]"],
                         [[k, _shift_text(v)] for k, v in size["shifts"].items()])]
    lines += ["", "Size law: " + " ".join(fit_text(f) for f in size["fits"])]
    preds = [[f"`{p['point']}`", p["form"], f"{p['lr']:.3g} [{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]"]
             for f in size["fits"] for p in f["predictions"]]
    if preds:
        scored = {(s["form"], s["point"]): s for s in size["scores"].iter_rows(named=True)}
        lines += ["", *table(["test point", "form (what it predicts)", "predicted [95% interval]",
                              "measured", "error, decades", "inside?"],
                             [row + [scored.get((row[1], row[0].strip("`")), {}).get(k, "-")
                                     for k in ("measured", "error", "inside")] for row in preds])]
    if transfer := transfer_text(size["scores"]):
        lines += ["", transfer]
    lines += ["", f"Early warning: L = {10 ** size['level']:.0f} refitted from the points it was "
                  "fixed on; at the test points: " + ("; ".join(
                      f"{w['point']} predicted {w['predicted']}, " + (
                          f"error {w['error']}" if w["complete"]
                          else "its runs not finished")
                      for w in size["warning"]) or "not run yet") + "."]
    return lines
