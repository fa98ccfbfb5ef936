"""Where to run the study: hours per run, per depth and for the whole grid of the study preset,
from the speeds measured here and, for machines not measured here, estimates from FLOPs."""

from __future__ import annotations

from .plan import BACKENDS
from .shapes import flops_per_token, preset_base, preset_shape, shape_config

NIGHT_HOURS = 10

# Machines not measured here, estimated from FLOPs: tokens/s = peak x share / FLOPs per token.
# Peaks are the vendors' dense figures; the shares are this project's assumptions for a model
# this small (its 50k-vocabulary head is most of the FLOPs; elementwise work over the logits
# and per-kernel overhead weigh more than on a large model). `just gpu-check` measures the CUDA
# rows on a real GPU.
ESTIMATES = (
    {"platform": "Apple M2 Max GPU (38-core)", "backend": "mlx", "peak_tflops": 13.6,
     "share": 0.30, "unit": "nights"},
    {"platform": "one H100/H200-class CUDA GPU", "backend": "torch fp32", "peak_tflops": 67.0,
     "share": 0.35, "unit": "GPU-hours"},
    {"platform": "one H100/H200-class CUDA GPU", "backend": "torch tf32", "peak_tflops": 495.0,
     "share": 0.12, "unit": "GPU-hours"},
    {"platform": "one H100/H200-class CUDA GPU", "backend": "torch bf16", "peak_tflops": 989.0,
     "share": 0.07, "unit": "GPU-hours"},
)


def study_plan() -> dict:
    """The study preset's run cost and grid: (train + evaluation) tokens per run at its depth,
    runs per depth (arms x LRs x seeds) and FLOPs per token."""
    from ..sweep.config import PRESETS
    from ..sweep.plan import run_cost_tokens

    study = PRESETS["study"]
    shape = preset_shape("study")
    cfg, args = shape_config(shape, preset_base("study"))
    return {"depth": shape["depth"], "cost_tokens": run_cost_tokens(cfg),
            "budget_tokens": cfg.budget_tokens, "arms": len(study.arms),
            "lrs": len(study.grid_lrs()), "seeds": len(study.seeds),
            "runs_per_depth": len(study.arms) * len(study.grid_lrs()) * len(study.seeds),
            "depths": 3, "flops_per_token": flops_per_token(args)}


def where_to_run(shapes: dict, machine: dict | None = None) -> dict:
    plan = study_plan()
    rows = []
    study = shapes.get("study")
    m = machine or {}
    here = "this machine" + (f": {m['cpus']}-core {m.get('cpu') or 'CPU'}" if m.get("cpus") else "")
    for backend in BACKENDS:
        key = "mlx-plain-1" if backend == "mlx" else "torch-1"
        s = study and study["tokens_per_s"].get(key)
        if s:
            rows.append({"platform": here, "backend": backend,
                         "tokens_per_s": s["median"], "range": [s["min"], s["max"]],
                         "source": f"measured here, median of {s['n']} round(s)",
                         "unit": "nights"})
    for e in ESTIMATES:
        rows.append({"platform": f"{e['platform']}, {e['peak_tflops']:g} TFLOP/s",
                     "backend": e["backend"], "unit": e["unit"],
                     "tokens_per_s": e["peak_tflops"] * 1e12 * e["share"] / plan["flops_per_token"],
                     "source": f"estimate: {e['share']:.0%} of peak assumed"})
    for row in rows:
        hours = plan["cost_tokens"] / row["tokens_per_s"] / 3600
        row["hours_per_run"] = hours
        row["hours_per_depth"] = hours * plan["runs_per_depth"]
        row["hours_whole_study"] = hours * plan["runs_per_depth"] * plan["depths"]
    return {"plan": plan, "rows": rows}
