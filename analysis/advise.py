"""`python -m analysis advise lr=... warmup=... steps=... [d_model=] [depth=] [vocab=]`: whether a
run needs QK-norm, read from the published archives (USAGE)."""

from __future__ import annotations

import math
import tarfile
import tempfile
from pathlib import Path

import polars as pl

from qkstudy.archive import SUFFIX, extract
from qkstudy.config import split_key_values, take
from qkstudy.data.tokenizer import VOCAB_BY_TOKENIZER
from qkstudy.errors import UsageError
from qkstudy.sweep.config import MINI
from qkstudy.sweep.ladder import KNOWN, MARGIN_PER_BYTE, STUDY_POINT, WARMUP_POINTS

USAGE = """usage: python -m analysis advise lr=LR warmup=N steps=N [d_model=N] [depth=N] [vocab=N]

The verdict at peak LR lr with warmup of steps (results/ladder; results/mini.tar.xz with depth=),
the warmup law's predicted onset there, the nearest measured condition (log2 distance in warmup,
steps and the width and depth given) and a warning per knob outside what was measured."""
KEYS = {"lr": float, "warmup": int, "steps": int, "d_model": int, "depth": int, "vocab": int}
LADDER, MINI_ARCHIVE = Path("results/ladder"), Path("results/mini.tar.xz")
# A measured condition is a dict: name, study ("ladder" or "mini"), d_model, depth, steps,
# warmup, lrs (its grid), no_difference_up_to, off_worse_from and onset (its text).


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


def sources(depth: bool) -> tuple[list[Path], Path | None]:
    """The ladder points' archives (not the probe sweeps) and, with depth, the mini's."""
    if not LADDER.is_dir():
        raise UsageError(f"{LADDER} is missing or not a folder (run from the repository's root)")
    found = [p for p in sorted(LADDER.iterdir()) if p.name.removesuffix(SUFFIX) in KNOWN
             and not KNOWN[p.name.removesuffix(SUFFIX)].probe_every]
    for path in found + [MINI_ARCHIVE] * depth:
        if not path.is_file() or not tarfile.is_tarfile(path):
            raise UsageError(f"{path} is not a {SUFFIX} archive (run from the repository's root)")
    if not found:
        raise UsageError(f"{LADDER} holds no ladder point's {SUFFIX} archive")
    return found, MINI_ARCHIVE if depth else None


def mini_conditions(path: Path) -> list[dict]:
    """Each depth of the mini (rmsnorm against off at its one model and schedule)."""
    from .load import load_runs
    from .study import analyse

    with tempfile.TemporaryDirectory(prefix="qkstudy-advise-") as tmp:
        study = analyse(load_runs(extract(path, Path(tmp) / "mini")[0]))
    t = MINI.train
    rows = study.thresholds.filter(pl.col("compared_arm") == "rmsnorm").sort("depth")
    return [{**r, "name": f"mini depth {r['depth']}", "study": "mini", "d_model": t.d_model,
             "steps": t.max_steps, "warmup": t.warmup_steps, "lrs": MINI.lrs,
             "onset": r["onset"] or r["note"]} for r in rows.iter_rows(named=True)]


def measured(ladder: list[Path], mini: Path | None) -> tuple[list[dict], dict]:
    """The measured conditions (the ladder's points in their order, then the mini's depths)
    and the straight warmup law's fit, as `python -m analysis ladder` publishes them."""
    from .ladder import analyse_ladder

    conditions, fit = conditions_of(analyse_ladder(ladder))
    return conditions + (mini_conditions(mini) if mini else []), fit


def conditions_of(out: dict) -> tuple[list[dict], dict]:
    """The ladder's measured conditions and the straight law's fit from its analysis."""
    points: pl.DataFrame = out["points"]
    conditions = [{**r, "name": r["point"], "study": "ladder", "lrs": KNOWN[r["point"]].lrs}
                  for r in points.iter_rows(named=True)]
    return conditions, next(f for f in out["fits"] if f["form"] == "straight")


def distance(c: dict, knobs: dict) -> float:
    """log2 distance in warmup and steps, and in width and depth where given."""
    return math.hypot(*(math.log2(max(knobs[k], 1) / c[k])
                        for k in ("warmup", "steps", "d_model", "depth") if k in knobs))


def verdict(lr: float, near: dict, onset: dict, knobs: dict | None = None) -> str:
    """Not needed only below both the nearest condition's tested no-difference LR and the
    predicted onset's interval at these knobs, with that condition's width and depth where the
    knobs give them; needed above that interval."""
    a, lo, hi = near["no_difference_up_to"], onset["ci_lo"], onset["ci_hi"]
    if a is not None and lr <= a and lr < lo:
        body = [f"{k} {near[k]}" for k in ("d_model", "depth")
                if (knobs or {}).get(k, near[k]) != near[k]]
        below = f"below the tested no-difference LR ({a:.3g} at {near['name']})"
        return (f"uncertain: {below}, measured at {' and '.join(body)}, not yours" if body
                else f"not needed: {below}")
    if lr > hi:
        return f"needed: above the tested onset (the upper end of its interval, {hi:.3g})"
    if lr >= lo:
        return f"uncertain: inside the onset's interval [{lo:.3g}, {hi:.3g}]"
    low = f"{a:.3g}" if a is not None else f"none decided at {near['name']}"
    return (f"uncertain: between the tested no-difference LR ({low}) and the onset's upper end "
            f"({hi:.3g})")


def _outside(key: str, value: float, values: list, what: str, fmt: str = ",") -> list[str]:
    lo, hi = min(values), max(values)
    return [] if lo <= value <= hi else [f"warning: {key} {value:{fmt}} is outside the measured "
                                         f"{lo:{fmt}}-{hi:{fmt}} ({what})"]


def depth_warning(knobs: dict, conditions: list[dict]) -> list[str]:
    """Depths other than the ladder's were measured only in the mini, at its one model and
    schedule: a warning at a depth outside the mini's, or at one not the ladder's elsewhere."""
    mini = [c for c in conditions if c["study"] == "mini"]
    ladder = sorted({c["depth"] for c in conditions if c["study"] == "ladder"})
    at, depth = {k: mini[0][k] for k in ("d_model", "steps", "warmup")}, knobs["depth"]
    if mini[0]["depth"] <= depth <= mini[-1]["depth"] and (
            depth in ladder or all(knobs.get(k, v) == v for k, v in at.items())):
        return []
    return [f"warning: depth {depth}: depths {mini[0]['depth']}-{mini[-1]['depth']} were measured"
            f" only at d_model {at['d_model']}, {at['steps']:,} steps, warmup {at['warmup']} (the"
            f" mini); the ladder's points are depth {', '.join(map(str, ladder))}"]


def body_warning(knobs: dict, conditions: list[dict], law: list[dict], fit: dict) -> list[str]:
    """For a model body other than the law's: what the scored body point measured there."""
    from .ladder import BODY_POINT
    from .law import predict_at

    b = next((c for c in conditions if c["name"] == BODY_POINT), None)
    d, L = law[0]["d_model"], law[0]["depth"]
    if b is None or (knobs.get("d_model", d), knobs.get("depth", L)) == (d, L):
        return []
    p = predict_at(fit, b["warmup"], b["steps"])
    return [f"warning: the warmup law is fitted at d_model {d}, depth {L}; at d_model {b['d_model']}"
            f", depth {b['depth']} ({b['warmup']:,} warmup steps of {b['steps']:,}) the measured "
            f"onset is {b['onset'].split(' [')[0]}, where the law predicts {p['lr']:.3g} "
            f"[{p['ci_lo']:.3g}, {p['ci_hi']:.3g}]"]


def warnings(knobs: dict, conditions: list[dict], near: dict, fit: dict) -> list[str]:
    """A line per knob outside the measured conditions."""
    out = [] if knobs["warmup"] else ["warning: warmup 0 is read as 1 step (the law and the "
                                      "distance are in log2 of the warmup)"]
    law = [c for c in conditions if c["name"] in WARMUP_POINTS]
    for k in ("steps", "warmup"):
        out += _outside(k, knobs[k], [c[k] for c in law],
                        "the ladder's width-64 points: the predicted onset is an extrapolation")
    if "d_model" in knobs:
        out += _outside("d_model", knobs["d_model"], [c["d_model"] for c in conditions
                                                      if c["study"] == "ladder"], "the ladder")
    out += depth_warning(knobs, conditions) if "depth" in knobs else []
    out += body_warning(knobs, conditions, law, fit)
    if knobs.get("vocab", VOCAB_BY_TOKENIZER["bytes"]) != VOCAB_BY_TOKENIZER["bytes"]:
        out.append(f"warning: vocabulary {knobs['vocab']:,} is not bytes ({VOCAB_BY_TOKENIZER['bytes']}):"
                   f" the margin is {MARGIN_PER_BYTE:g} nats per byte of text, so on a BPE "
                   f"vocabulary of about {STUDY_POINT.bytes_per_token:.1f} bytes a token the same "
                   f"effect is about {STUDY_POINT.margin:.2g} nats per token; no BPE run was "
                   "measured")
    return out + _outside("LR", knobs["lr"], near["lrs"], f"the LRs at {near['name']}", ".3g")


def advise(knobs: dict, conditions: list[dict], fit: dict) -> list[str]:
    """The verdict, the predicted onset, the nearest condition and the warnings, as lines."""
    from .law import predict_at

    lr, warmup, steps = knobs["lr"], knobs["warmup"], knobs["steps"]
    onset = predict_at(fit, max(warmup, 1), steps)
    near = min(conditions, key=lambda c: distance(c, knobs))  # ties: the first, a ladder point
    a, b = (f"LR {near[k]:.3g}" if near[k] is not None else None
            for k in ("no_difference_up_to", "off_worse_from"))
    return [
        f"LR {lr:.3g}, warmup {warmup:,} of {steps:,} steps: {verdict(lr, near, onset, knobs)}",
        f"predicted onset (the straight warmup law over the ladder's width-64 points, at this "
        f"schedule): LR {onset['lr']:.3g} [{onset['ci_lo']:.3g}, {onset['ci_hi']:.3g}] (95% "
        "interval of a measured onset)",
        f"nearest measured condition ({distance(near, knobs):.1f} doublings away): "
        f"{near['name']} (d_model {near['d_model']}, depth {near['depth']}, warmup "
        f"{near['warmup']:,} of {near['steps']:,} steps): no difference (within "
        f"{MARGIN_PER_BYTE:g} nats) up to {a or 'no LR'}; measured onset {near['onset']}; "
        f"off worse decided from {b or 'no LR'}",
        *warnings(knobs, conditions, near, fit)]


def cli(argv: list[str]) -> int:
    knobs = parse(argv)
    conditions, fit = measured(*sources("depth" in knobs))
    if fit["lr"] is None:
        raise UsageError(f"the warmup law is not fitted from {LADDER}: {fit['note']}")
    print("\n".join(advise(knobs, conditions, fit)))
    return 0
