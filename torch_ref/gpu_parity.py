"""gpu-check's first stage: one short run trained on the CPU in fp32 (the reference) and on the
device in each of its precisions (`python -m qkstudy train`, a process each); every step's
training loss against the reference's, within PARITY_LIMITS; and the device's fp32 run again,
whose final weights must be the same bytes (deterministic=true)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from qkstudy.run_folder import RunFolder
from qkstudy.bench.shapes import preset_base, preset_shape, shape_config
from qkstudy.config import TrainConfig

from .gpu_plan import PARITY_LIMITS, PRECISIONS, ROOT, TINY, Clock, GpuCheckConfig, python_env


def train_words(cfg: TrainConfig) -> list[str]:
    """`python -m qkstudy train` words for the fields of `cfg` that are not the defaults."""
    default = TrainConfig()
    return [f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != getattr(default, f.name)]


def parity_config(check: GpuCheckConfig, data: Path, out: Path) -> TrainConfig:
    shape = TINY if check.quick else preset_shape("demo")
    cfg, _ = shape_config(shape, preset_base("demo"), backend="torch", data=str(data),
                          runs_dir=str(out / "parity-runs"), sweep="parity",
                          max_steps=20 if check.quick else 50,
                          warmup_steps=5 if check.quick else 30)
    return cfg


def losses_of(run_dir: Path) -> dict[int, float]:
    table = RunFolder(run_dir).read_metrics()
    rows = table.select(["step", "train_loss"]).to_pydict() if table is not None else {}
    return {s: v for s, v in zip(rows.get("step", []), rows.get("train_loss", []))
            if v is not None}


def parity(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    base = parity_config(check, data, out)
    settings = [("cpu", "fp32", "")] + [(check.device, p, "") for p in PRECISIONS[check.device]
                                        if (check.device, p) != ("cpu", "fp32")]
    settings.append((check.device, "fp32", " repeat"))
    runs: dict[str, dict] = {}
    for device, precision, repeat in settings:
        label = f"{device} {precision}{repeat}"
        left = clock.left("parity")
        if left < 5:
            skipped.append(f"parity: {label} (skipped for time)")
            continue
        cfg = dataclasses.replace(base, device=device, precision=precision,
                                  sweep=base.sweep + repeat.replace(" ", "-"))
        print(f"parity: training {label} ({cfg.steps} steps) ...", flush=True)
        try:
            done = subprocess.run([sys.executable, "-m", "qkstudy", "train", *train_words(cfg)],
                                  capture_output=True, text=True, env=python_env(check),
                                  cwd=ROOT, timeout=left)
        except subprocess.TimeoutExpired:
            skipped.append(f"parity: {label} (stopped for time)")
            continue
        run_dir = RunFolder.of(cfg).path
        summary = RunFolder(run_dir).summary_record()
        runs[label] = {"run_dir": str(run_dir.relative_to(out)), "returncode": done.returncode,
                       "status": summary.get("status", "failed"),
                       "final_val_loss": summary.get("final_val_loss"),
                       "final_weights_sha256": summary.get("final_weights_sha256"),
                       "losses": {str(k): v for k, v in sorted(losses_of(run_dir).items())}}
        if done.returncode:
            runs[label]["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    reference = runs.get("cpu fp32", {}).get("losses", {})
    deviations = {}
    for label, r in runs.items():
        if label == "cpu fp32" or label.endswith(" repeat") or not reference:
            continue
        per_step = {s: abs(r["losses"][s] - ref) / abs(ref)
                    for s, ref in reference.items() if s in r["losses"] and ref}
        worst = max(per_step, key=per_step.get, default=None)
        deviations[label] = {"per_step": per_step, "max": per_step.get(worst),
                             "max_at_step": int(worst) if worst is not None else None,
                             "steps_compared": len(per_step),
                             "limit": PARITY_LIMITS[label.split()[-1]]}
    return {"reference": "cpu fp32", "steps": base.steps, "config": base.identity(),
            "planned": [f"{d} {p}{r}" for d, p, r in settings], "runs": runs,
            "deviation": deviations}


def parity_text(p: dict) -> list[str]:
    labels = [label for label in p["runs"] if label != "cpu fp32" and label in p["deviation"]]
    ref = p["runs"].get("cpu fp32", {}).get("losses", {})
    lines = [f"1. Parity: {p['steps']} steps of one config, training loss per step against "
             f"{p['reference']} (relative deviation in brackets)", ""]
    if not ref:
        return lines + ["   the reference run did not finish"]
    steps = sorted(int(s) for s in ref)
    shown = sorted({steps[0], *steps[1:3], *steps[::max(1, len(steps) // 6)], steps[-1]})
    lines.append("| step | cpu fp32 | " + " | ".join(labels) + " |")
    lines.append("|" + " --- |" * (2 + len(labels)))
    for s in shown:
        cells = []
        for label in labels:
            loss = p["runs"][label]["losses"].get(str(s))
            dev = p["deviation"].get(label, {}).get("per_step", {}).get(str(s))
            cells.append(f"{loss:.5f} ({dev:.1e})" if loss is not None and dev is not None
                         else "-")
        lines.append(f"| {s} | {ref[str(s)]:.5f} | " + " | ".join(cells) + " |")
    worst = [f"{label}: {d['max']:.1e} at step {d['max_at_step']} (limit {d['limit']:g})"
             if d["max"] is not None else f"{label}: -" for label, d in p["deviation"].items()]
    lines += ["", "   largest relative deviation over all steps: " + "; ".join(worst)]
    for label, r in p["runs"].items():
        if r.get("error"):
            lines.append(f"   {label} failed: {r['error']}")
    return lines


def parity_summary(p: dict) -> list[dict]:
    """A summary row per planned run: ok when it finished and (against the reference) every
    step was compared and within its limit; None when it was not run (time)."""
    rows = []
    for label in p["planned"]:
        r, d = p["runs"].get(label), p["deviation"].get(label)
        if r is None:
            rows.append({"check": f"parity {label}", "ok": None, "figure": "not run (time)"})
        elif r["returncode"] or r["status"] != "completed":
            rows.append({"check": f"parity {label}", "ok": False,
                         "figure": r.get("error") or r["status"]})
        elif label == p["reference"]:
            rows.append({"check": f"parity {label}", "ok": True,
                         "figure": f"the reference, {len(r['losses'])} steps"})
        elif label.endswith(" repeat"):
            first = p["runs"].get(label.removesuffix(" repeat"), {})
            same = bool(r["final_weights_sha256"]) and \
                r["final_weights_sha256"] == first.get("final_weights_sha256")
            rows.append({"check": f"parity {label}", "ok": same,
                         "figure": "final weights bit-identical to the first run's" if same
                         else "final weights differ from the first run's"})
        elif d is None or d["max"] is None or d["steps_compared"] < p["steps"]:
            compared = d["steps_compared"] if d else 0
            rows.append({"check": f"parity {label}", "ok": False,
                         "figure": f"{compared} of {p['steps']} steps compared"})
        else:
            rows.append({"check": f"parity {label}", "ok": d["max"] <= d["limit"],
                         "figure": f"largest deviation {d['max']:.1e} (limit {d['limit']:g})"})
    return rows
