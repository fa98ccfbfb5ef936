"""gpu-check's second stage: tokens/s of the run's own engine (qkstudy/bench/step.py, each
measurement in fresh processes) by throughput_plan, with FLOP/s against the device's measured
matmul peak in that precision, and the study-shape speeds turned into hours of the study. K runs
at once are K processes lined up by a start barrier and timed until one common stop time, each
with the environment a sweep with jobs=K gives it. On CUDA every timed step runs under torch's
sync debug mode set to error, so a step that makes the host wait fails its row."""

from __future__ import annotations

import dataclasses

from qkstudy.bench.shapes import flops_per_token, preset_base, preset_shape, shape_config
from qkstudy.bench.step import Spec, StepFailed, measure_together
from qkstudy.forecast import study_hours, study_plan
from qkstudy.trainer import RUNS_PER_DEVICE

from .engine import SYNC_CHECK
from .gpu_plan import TINY, Clock, GpuCheckConfig, label, quick_env, throughput_plan

COMPILE_S, EAGER_S = 90, 20  # the least time left for a compiled / eager measurement to start


def throughput(check: GpuCheckConfig, clock: Clock, skipped: list) -> dict:
    shapes = {"tiny": TINY} if check.quick else {"study": preset_shape("study")}
    peaks: dict[str, float] = {}
    rows = []
    seconds = min(check.seconds, 0.5) if check.quick else check.seconds
    for m in throughput_plan(check):
        name = label(m)
        left = clock.left("throughput")
        if left < (COMPILE_S if m["compile"] else EAGER_S):
            skipped.append(f"throughput: {name} (skipped for time)")
            rows.append({**m, "status": "skipped for time"})
            continue
        shape = shapes[m["shape"]]
        cfg, args = shape_config(shape, preset_base(m["shape"]), backend="torch",
                                 device=check.device, precision=m["precision"],
                                 compile=m["compile"], deterministic=m["deterministic"])
        first = m["processes"] == 1 and m["precision"] not in peaks
        spec = Spec(config=dataclasses.asdict(cfg), vocab=shape["vocab"], warmup=2,
                    seconds=seconds, min_steps=3, matmul=first)
        print(f"throughput: {name} ...", end=" ", flush=True)
        try:
            # a step that makes the host wait for the GPU fails the measurement (engine.py)
            env = {RUNS_PER_DEVICE: str(m["processes"]), SYNC_CHECK: "1", **quick_env(check)}
            results = measure_together(spec, m["processes"], env=env,
                                       timeout=min(left, 240 if m["compile"] else 90))
        except StepFailed as e:
            print(f"failed ({e})", flush=True)
            rows.append({**m, "status": f"failed: {e}"})
            continue
        if first and "matmul_gflops" in results[0]:
            peaks[m["precision"]] = results[0]["matmul_gflops"]
        total = sum(r["tokens_per_s"] for r in results)
        fpt = flops_per_token(args)
        windows = [r["window"] for r in results]
        row = {**m, "status": "ok", "tokens_per_s": total,
               "per_process": [r["tokens_per_s"] for r in results],
               "steps": [r["steps"] for r in results],
               "warmup_s": [r["warmup_s"] for r in results],
               "windows": windows,
               # the share of the K windows all K were timing at once (1: the same window)
               "overlap": overlap(windows),
               "peak_memory_bytes": [r["peak_memory_bytes"] for r in results],
               "flops_per_token": fpt, "tflops": total * fpt / 1e12}
        if m["precision"] in peaks:
            row["share_of_matmul_peak"] = row["tflops"] * 1e3 / peaks[m["precision"]]
        rows.append(row)
        print(f"{total:,.0f} tok/s", flush=True)
    return {"matmul_gflops": peaks, "seconds": seconds, "parallel": check.parallel,
            "shapes": shapes, "rows": rows, "where_to_run": where_to_run(rows)}


def overlap(windows: list[list[float]]) -> float:
    """The time all the windows share, over the longest one."""
    common = min(end for _, end in windows) - max(start for start, _ in windows)
    return max(0.0, common) / max(end - start for start, end in windows)


def where_to_run(rows: list[dict]) -> list[dict]:
    """Hours of the study preset at the study-shape speeds measured here (one run at a time)."""
    out = []
    for r in rows:
        if r["shape"] != "study" or r["status"] != "ok" or r["processes"] != 1 \
                or not r["deterministic"]:
            continue
        hours = study_hours(r["tokens_per_s"])
        out.append({"precision": r["precision"], "compile": r["compile"],
                    "tokens_per_s": r["tokens_per_s"], "hours_per_run": hours["hours_per_run"],
                    "gpu_hours_per_depth": hours["hours_per_depth"],
                    "gpu_hours_whole_study": hours["hours_whole_study"]})
    return out


def throughput_text(t: dict, device: str) -> list[str]:
    hours = "GPU-hours" if device.startswith(("cuda", "mps")) else "hours"
    k = t["parallel"]
    peaks = ", ".join(f"{p} {g / 1e3:.1f} TFLOP/s" for p, g in t["matmul_gflops"].items())
    lines = [f"2. Throughput on {device} (the run's engine in fresh processes; 2 warm-up steps, "
             f"then ~{t['seconds']:g} s of steps; x{k}: {k} runs at once over one window, their "
             f"total, each with {RUNS_PER_DEVICE}={k})",
             f"   matmul peak measured here: {peaks or '-'}", "",
             "| measurement | tokens/s | TFLOP/s | share of matmul peak | windows shared | "
             "status |", "| --- | --- | --- | --- | --- | --- |"]
    for r in t["rows"]:
        ok = r["status"] == "ok"
        speed = f"{r['tokens_per_s']:,.0f}" if ok else "-"
        tflops = f"{r['tflops']:.2f}" if ok else "-"
        share = f"{r['share_of_matmul_peak']:.1%}" if "share_of_matmul_peak" in r else "-"
        shared = f"{r['overlap']:.0%}" if ok and r["processes"] > 1 else "-"
        lines.append(f"| {label(r)} | {speed} | {tflops} | {share} | {shared} | {r['status']} |")
    if t["where_to_run"]:
        plan = study_plan()
        lines += ["", f"   the study preset here, one run at a time ({plan['runs_per_depth']} runs "
                      f"a depth, {plan['depths']} depths):", "",
                  f"| precision | compiled | tokens/s | hours a run | {hours} a depth | "
                  f"{hours} the whole study |", "| --- | --- | --- | --- | --- | --- |"]
        for w in t["where_to_run"]:
            lines.append(f"| {w['precision']} | {'yes' if w['compile'] else 'no'} | "
                         f"{w['tokens_per_s']:,.0f} | {w['hours_per_run']:.2f} | "
                         f"{w['gpu_hours_per_depth']:.1f} | {w['gpu_hours_whole_study']:.1f} |")
    return lines


def throughput_summary(t: dict) -> list[dict]:
    """A summary row per planned measurement: ok, failed, or None (skipped for time)."""
    rows = []
    for r in t["rows"]:
        ok = None if r["status"] == "skipped for time" else r["status"] == "ok"
        figure = f"{r['tokens_per_s']:,.0f} tokens/s" if ok else r["status"]
        rows.append({"check": f"throughput {label(r)}", "ok": ok, "figure": figure})
    return rows
