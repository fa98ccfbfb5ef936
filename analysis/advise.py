"""`python -m analysis advise lr=... warmup=... steps=... [d_model=] [depth=] [vocab=]`: whether a
run needs QK-norm, read from the table the published archives generate (results/advice.json)."""

from __future__ import annotations

import math
import sys

from qkstudy.config import split_key_values, take
from qkstudy.errors import UsageError

from . import advice_table

USAGE = """usage: python -m analysis advise lr=LR warmup=N steps=N [d_model=N] [depth=N] [vocab=N]

The verdict at peak LR lr with warmup of steps: at a measured condition, its measured cell;
elsewhere the nearest measured conditions (distance weighted by how far each knob moves the
onset) and, inside the measured schedules of the warmup law's model, the law's predicted onset.
"Not needed" only at or below an LR where no difference was decided on the same model body.
Without d_model= and depth= it assumes the ladder's model (d_model 64, depth 4) and says so."""
KEYS = {"lr": float, "warmup": int, "steps": int, "d_model": int, "depth": int, "vocab": int}
LAW_BODY = (64, 4)  # the warmup law's model body: d_model, depth
BYTES = 257


def parse(argv: list[str]) -> dict:
    """The knobs as numbers; a UsageError on the first bad word."""
    pairs = split_key_values(argv)
    unknown = sorted(set(pairs) - set(KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r}; keys: {', '.join(k + '=' for k in KEYS)}")
    for key in ("lr", "warmup", "steps"):
        if key not in pairs:
            raise UsageError(f"give {key}= (e.g. advise lr=3e-3 warmup=100 steps=2000)")
    k = {key: take(pairs, key, hint) for key, hint in KEYS.items() if key in pairs}
    for ok, message in [
            (math.isfinite(k["lr"]) and k["lr"] > 0, f"lr must be above 0; got {k['lr']:g}"),
            (k["warmup"] >= 0, f"warmup must be 0 or more; got {k['warmup']}"),
            (k["steps"] > k["warmup"], f"steps must exceed warmup ({k['warmup']}); got "
                                       f"{k['steps']}"),
            *((k[key] >= 1, f"{key} must be 1 or more; got {k[key]}")
              for key in ("d_model", "depth", "vocab") if key in k)]:
        if not ok:
            raise UsageError(message)
    return k


def body(knobs: dict) -> tuple[int, int]:
    return knobs.get("d_model", LAW_BODY[0]), knobs.get("depth", LAW_BODY[1])


def distance(c: dict, knobs: dict, w: dict) -> float:
    """Decades: each knob's log2 distance times how far a doubling of it moves the onset."""
    d, L = body(knobs)
    size = math.log2(d * d * L / (c["d_model"] ** 2 * c["depth"]))
    return math.hypot(w["warmup"] * math.log2(max(knobs["warmup"], 1) / c["warmup"]),
                      w["steps"] * math.log2(knobs["steps"] / c["steps"]), w["size"] * size)


DECIDED = {"off worse": "off worse decided", "no difference": "no difference decided",
           "on worse": "QK-norm worse decided", "undetermined": "not decided"}


def valley(c: dict) -> float:
    """The LR of the smallest seed-mean gap: the onset is read from there up; below it QK-norm
    learns faster where neither arm is trained, which is not the instability."""
    read = [x for x in c["cells"] if x["decision"] in DECIDED and x["lr"] <= c["read_hi"]]
    return min(read or c["cells"], key=lambda x: x["mean_gap"])["lr"]


def gap_text(cell: dict, low: float | None = None) -> str:
    ci = (f" [{cell['ci_lo']:+.3f}, {cell['ci_hi']:+.3f}]" if cell["ci_lo"] is not None else "")
    slower = ("; below the smallest gap, where QK-norm learns faster (not the instability)"
              if low is not None and cell["lr"] < low and cell["mean_gap"] > 0 else "")
    return (f"LR {cell['lr']:.3g}: off minus on {cell['mean_gap']:+.3f}{ci} nats, "
            f"{DECIDED.get(cell['decision'], cell['decision'])}{slower}")


def cells_text(c: dict, lr: float) -> str:
    return "; ".join(gap_text(x, valley(c)) for x in around(c, lr))


def around(c: dict, lr: float) -> list[dict]:
    """The cell at lr, or the cells either side of it (one at an end of the grid)."""
    cells = c["cells"]
    same = [x for x in cells if math.isclose(x["lr"], lr, rel_tol=1e-3)]
    if same:
        return same
    below, above = [x for x in cells if x["lr"] < lr], [x for x in cells if x["lr"] > lr]
    return below[-1:] + above[:1]


MEASURED = {"off worse": "needed", "no difference": "not needed", "on worse": "not needed"}


def measured_verdict(c: dict, lr: float) -> str:
    """At a measured condition: its cell at lr, or the cells either side."""
    lrs = [x["lr"] for x in c["cells"]]
    if not lrs[0] <= lr <= lrs[-1]:
        if lr > lrs[-1] and c["off_worse_from"] is not None:
            return (f"needed: off worse decided from LR {c['off_worse_from']:.3g} up to the "
                    f"largest LR measured, {lrs[-1]:.3g} ({c['name']})")
        return f"not measured: LR outside the LRs measured at {c['name']} ({lrs[0]:.3g}-{lrs[-1]:.3g})"
    cells = around(c, lr)
    words = {MEASURED.get(x["decision"], "uncertain") for x in cells}
    where = "at this LR" if len(cells) == 1 else "at the LRs either side"
    word = words.pop() if len(words) == 1 else "uncertain"
    return f"{word}: measured {where} at {c['name']}: {cells_text(c, lr)}"


def modelled_verdict(near: dict, lr: float, predicted: dict | None) -> str:
    """Between measured schedules of one model body: "not needed" only at or below the nearest
    condition's tested no-difference LR (and below the law's interval), "needed" above it."""
    a, low = near["no_difference_up_to"], near["cells"][0]["lr"]
    if a is not None and low <= lr <= a and (predicted is None or lr < predicted["ci_lo"]):
        return (f"not needed: at or below LR {a:.3g}, where no difference was decided at every "
                f"measured LR from the smallest ({low:.3g}) up, at {near['name']}")
    if predicted is not None and lr > predicted["ci_hi"]:
        return f"needed: above the predicted onset's interval (upper end {predicted['ci_hi']:.3g})"
    if predicted is not None and lr >= predicted["ci_lo"]:
        return (f"uncertain: inside the predicted onset's interval [{predicted['ci_lo']:.3g}, "
                f"{predicted['ci_hi']:.3g}]")
    bound = f"LR {a:.3g}" if a is not None else "none"
    return (f"uncertain: above the no-difference LR tested at {near['name']} ({bound}); its "
            f"measured onset {near['onset']}")


def span(conditions: list[dict], key: str) -> tuple[int, int]:
    values = [c[key] for c in conditions]
    return min(values), max(values)


def outside(knobs: dict, same: list[dict]) -> str | None:
    """Why the knobs lie outside what was measured on this model body, or None."""
    for key in ("warmup", "steps"):
        lo, hi = span(same, key)
        if not lo <= knobs[key] <= hi:
            return f"{key} {knobs[key]:,} is outside the {key} measured on this model body ({lo:,}-{hi:,})"
    return None


def predict(table: dict, knobs: dict) -> dict:
    """The straight warmup law's onset at the knobs' schedule with the 95% interval of a new
    five-seed point's measured onset (law.predict's, from the table's coefficient draws)."""
    import numpy as np

    from .prediction import new_point_draws, percentile_interval, schedule_x

    law = table["law"]
    w, s = max(knobs["warmup"], 1), knobs["steps"]
    x0 = np.array(schedule_x(w, s))
    center = np.array(law["draws"]) @ x0
    lo, hi = percentile_interval(new_point_draws(
        center, law["lack"], law["unit_var"], law["widening"], law["seeds"], law["df"],
        f"warmup-law/straight/w64-s{s}-wu{w}"))
    v = float(np.array(law["estimate"]) @ x0)
    return {"lr": 10 ** v, "ci_lo": 10 ** lo, "ci_hi": 10 ** hi}


def verdict(knobs: dict, table: dict) -> tuple[str, dict, dict | None]:
    """(verdict, the nearest measured condition, the law's prediction where it covers)."""
    conditions, w, lr = table["conditions"], table["weights"], knobs["lr"]
    same = [c for c in conditions if (c["d_model"], c["depth"]) == body(knobs)]
    near = min(same or conditions, key=lambda c: distance(c, knobs, w))
    if not same:
        bodies = sorted({(c["d_model"], c["depth"]) for c in conditions})
        return (f"not measured: no condition at d_model {body(knobs)[0]}, depth {body(knobs)[1]} "
                f"(measured: {', '.join(f'{d}/{L}' for d, L in bodies)} as d_model/depth)"), near, None
    exact = [c for c in same if (c["warmup"], c["steps"]) == (knobs["warmup"], knobs["steps"])]
    if exact:
        return measured_verdict(exact[0], lr), exact[0], None
    why = outside(knobs, same)
    if why:
        return f"not measured: {why}", near, None
    predicted = predict(table, knobs) if body(knobs) == LAW_BODY else None
    return modelled_verdict(near, lr, predicted), near, predicted


def assumed(knobs: dict) -> str:
    """The model body, saying which part was assumed (the ladder's model) when not given."""
    d, L = body(knobs)
    guessed = [k for k in ("d_model", "depth") if k not in knobs]
    note = (f" (assumed {' and '.join(guessed)}: the ladder's model; give "
            f"{' and '.join(k + '=' for k in guessed)} for yours)" if guessed else "")
    return f"d_model {d}, depth {L}{note}"


def warnings(knobs: dict, conditions: list[dict], near: dict) -> list[str]:
    """A line per knob outside every measured condition, and the LR outside the nearest's."""
    out = []
    for key in ("warmup", "steps", "d_model", "depth"):
        if key in knobs:
            lo, hi = span(conditions, key)
            if not lo <= knobs[key] <= hi:
                out.append(f"warning: {key} {knobs[key]:,} is outside every measured condition "
                           f"({lo:,}-{hi:,})")
    if knobs.get("vocab", BYTES) != BYTES:
        out.append(f"warning: vocabulary {knobs['vocab']:,} is not bytes ({BYTES}): every "
                   "condition was measured on byte text (the margin is 0.1 nats per byte)")
    lrs = [x["lr"] for x in near["cells"]]
    if not lrs[0] <= knobs["lr"] <= lrs[-1]:
        out.append(f"warning: LR {knobs['lr']:.3g} is outside the LRs measured at {near['name']} "
                   f"({lrs[0]:.3g}-{lrs[-1]:.3g})")
    return out


def advise(knobs: dict, table: dict) -> list[str]:
    """The verdict, the measured cells nearest the LR, the law's prediction (where it covers),
    the nearest condition and the warnings, as lines."""
    said, near, predicted = verdict(knobs, table)
    if said.startswith("not needed") and knobs.get("vocab", BYTES) != BYTES:
        said = f"uncertain: {said.removeprefix('not needed: ')}, on byte text, not your vocabulary"
    lr, warmup, steps = knobs["lr"], knobs["warmup"], knobs["steps"]
    lines = [f"LR {lr:.3g}, warmup {warmup:,} of {steps:,} steps, {assumed(knobs)}: {said}"]
    if predicted is not None:
        lines.append(f"predicted onset (the straight warmup law at d_model 64, depth 4, at this "
                     f"schedule): LR {predicted['lr']:.3g} [{predicted['ci_lo']:.3g}, "
                     f"{predicted['ci_hi']:.3g}] (95% interval of a measured onset)")
    a, b = (f"LR {near[k]:.3g}" if near[k] is not None else "no LR"
            for k in ("no_difference_up_to", "off_worse_from"))
    lines += [
        f"nearest measured condition ({distance(near, knobs, table['weights']):.2f} decades of "
        f"onset away): {near['name']} (d_model {near['d_model']}, depth {near['depth']}, head_dim "
        f"{near['head_dim']}, warmup {near['warmup']:,} of {near['steps']:,} steps): no difference "
        f"decided from its smallest LR up to {a}; off worse decided from {b}; measured onset "
        f"{near['onset']}",
        *([] if said.split(": ")[1].startswith("measured") else
          [f"  measured there: {cells_text(near, lr)}"]),
        *warnings(knobs, table["conditions"], near)]
    return lines


def cli(argv: list[str]) -> int:
    knobs = parse(argv)
    print("\n".join(advise(knobs, advice_table.read())))
    return 0


if __name__ == "__main__":  # python -m analysis.advise ... is python -m analysis advise ...
    from qkstudy import interrupts

    from .__main__ import main

    interrupts.main_process(lambda: main(["advise", *sys.argv[1:]]))
