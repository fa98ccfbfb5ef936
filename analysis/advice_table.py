"""The table `just advise` reads (results/advice.json): every measured condition's cells (the
seed-mean gap, its interval and decision at each LR), tested rule and onset; the straight
warmup law's coefficient draws; and how far each knob moves the onset (the laws'
coefficients). `python -m analysis.published` writes it from the archives and
tests/test_published.py holds it equal to them, so advise answers without re-analysing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from qkstudy.errors import UsageError

if TYPE_CHECKING:
    import polars as pl

PATH = Path("results/advice.json")
ON = "rmsnorm"
NEW_SEEDS = 5  # the prediction is for a measured onset of five seeds
FLOOR = 0.01  # decades per doubling: no knob counts as moving the onset by nothing
CONDITION_KEYS = {"name": str, "study": str, "d_model": int, "depth": int, "head_dim": int,
                  "steps": int, "warmup": int, "cells": list, "no_difference_up_to": (float, type(None)),
                  "off_worse_from": (float, type(None)), "onset": str, "read_hi": float}
CELL_KEYS = ("lr", "mean_gap", "ci_lo", "ci_hi", "decision", "pairs")


def _round(x, digits: int = 6):
    return None if x is None else float(f"{x:.{digits}g}")


def cells_of(gaps: pl.DataFrame, depth: int) -> list[dict]:
    """One depth's cells against QK-norm on, in LR order."""
    import polars as pl

    rows = gaps.filter((pl.col("compared_arm") == ON) & (pl.col("depth") == depth)).sort("lr")
    return [{"lr": _round(r["lr"]), "mean_gap": _round(r["mean_gap"]), "ci_lo": _round(r["ci_lo"]),
             "ci_hi": _round(r["ci_hi"]), "decision": r["decision"], "pairs": r["pairs"]}
            for r in rows.iter_rows(named=True)]


def condition(name: str, study: str, knobs: dict, rule: dict, cells: list[dict]) -> dict:
    """A measured condition; read_hi: the largest LR its onset is read at (below the first LR
    at which some QK-norm run failed)."""
    return {"name": name, "study": study, **knobs, "cells": cells, "read_hi": _round(rule["read_hi"]),
            "no_difference_up_to": _round(rule["no_difference_up_to"]),
            "off_worse_from": _round(rule["off_worse_from"]), "onset": rule["onset"]}


def weights(ladder: dict) -> dict:
    """Decades per doubling of each knob: the straight warmup law's |b| and |c|, and the size
    law's size term from the onset form that fits best (smallest lack of fit)."""
    straight = next(f for f in ladder["fits"] if f["form"] == "straight")
    est = straight["draws"][0]
    sizes = [f for f in ladder["size"]["fits"] if f["target"] == "onset" and f["lr"]]
    best = min(sizes, key=lambda f: f["lack_of_fit"], default=None)
    size = 0.0 if best is None else float(best["estimate"][3 if best["form"] == "power" else 4])
    return {k: _round(max(abs(v), FLOOR)) for k, v in
            (("warmup", est[1]), ("steps", est[2]), ("size", size))}


def law(ladder: dict) -> dict:
    """The straight warmup law as predict() needs it (coefficient draws to five digits)."""
    from .hypotheses import small_sample_widening

    f = next(f for f in ladder["fits"] if f["form"] == "straight")
    est, boot, lack, unit = f["draws"]
    return {"estimate": [_round(v) for v in est], "lack": _round(lack), "unit_var": _round(unit),
            "df": f["df"], "seeds": NEW_SEEDS, "widening": _round(small_sample_widening(NEW_SEEDS)),
            "draws": [[_round(v, 5) for v in row] for row in boot.tolist()]}


def build(mini, ladder: dict) -> dict:
    """The table from the mini study and `python -m analysis ladder`'s output."""
    import polars as pl

    from qkstudy.sweep.config import MINI
    from qkstudy.sweep.ladder import KNOWN

    conditions = []
    for r in ladder["points"].iter_rows(named=True):
        p = KNOWN[r["point"]]
        knobs = {"d_model": p.d_model, "depth": p.depth, "head_dim": p.head_dim,
                 "steps": p.steps, "warmup": p.warmup}
        conditions.append(condition(r["point"], "ladder", knobs, r, ladder["cells"][r["point"]]))
    t = MINI.train
    for r in mini.thresholds.filter(pl.col("compared_arm") == ON).sort("depth").iter_rows(named=True):
        knobs = {"d_model": t.d_model, "depth": r["depth"], "head_dim": t.d_model // t.n_heads,
                 "steps": t.max_steps, "warmup": t.warmup_steps}
        cells = cells_of(mini.gaps, r["depth"])
        read = [x["lr"] for x in cells if x["decision"] != "uninformative"
                and (r["trained_up_to"] is None or x["lr"] <= r["trained_up_to"])]
        conditions.append(condition(f"mini depth {r['depth']}", "mini", knobs,
                                    {**r, "onset": r["onset"] or r["note"],
                                     "read_hi": max(read, default=cells[-1]["lr"])}, cells))
    return {"margin": 0.1, "conditions": conditions, "law": law(ladder),
            "weights": weights(ladder)}


def text(table: dict) -> str:
    """The table as the file holds it: a condition a line, the law's draws on one."""
    lines = [json.dumps({k: v for k, v in table.items() if k != "conditions"})[:-1]
             + ', "conditions": [']
    lines += [json.dumps(c) + ("," if i < len(table["conditions"]) - 1 else "")
              for i, c in enumerate(table["conditions"])]
    return "\n".join(lines) + "\n]}\n"


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise UsageError(f"{PATH} is damaged ({what}); rebuild it with python -m analysis.published")


def read(path: Path = PATH) -> dict:
    """The table, checked: a missing, unreadable or malformed file is one UsageError line."""
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} is missing (run from the repository's root, or rebuild it with "
                         "python -m analysis.published)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{path} is not readable JSON ({e})") from None
    _check(isinstance(table, dict) and isinstance(table.get("conditions"), list)
           and table["conditions"], "no conditions")
    for c in table["conditions"]:
        _check(isinstance(c, dict) and all(isinstance(c.get(k), t) for k, t in CONDITION_KEYS.items()),
               "a condition lacks a key")
        _check(all(isinstance(x, dict) and set(CELL_KEYS) <= set(x) and isinstance(x["lr"], float)
                   and x["lr"] > 0 for x in c["cells"]), f"a cell of {c['name']}")
    w, law_ = table.get("weights"), table.get("law")
    _check(isinstance(w, dict) and all(isinstance(w.get(k), float) and math.isfinite(w[k])
                                       for k in ("warmup", "steps", "size")), "weights")
    _check(isinstance(law_, dict) and isinstance(law_.get("draws"), list) and law_["draws"]
           and all(isinstance(r, list) and len(r) == 3 for r in law_["draws"])
           and isinstance(law_.get("estimate"), list) and len(law_["estimate"]) == 3
           and all(isinstance(law_.get(k), (int, float)) for k in ("lack", "unit_var", "df",
                                                                    "seeds", "widening")), "law")
    return table
