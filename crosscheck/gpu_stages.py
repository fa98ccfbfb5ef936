"""gpu-check's plan and its three stages: parity, throughput, a demo sweep."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from qkstudy import run_folder
from qkstudy.backends import RUNS_PER_DEVICE
from qkstudy.bench.shapes import preset_base, preset_shape, shape_config, study_hours, study_plan
from qkstudy.progress import table
from qkstudy.bench.step import ROOT, Spec, StepFailed, checkout_env, measure_together
from qkstudy.config import TrainConfig
from qkstudy.parameters import flops_per_token
from qkstudy.run_folder import RunFolder
from qkstudy.sweep.plan import command_line
from torch_ref.engine import SYNC_CHECK

PRECISIONS = {"cuda": ("fp32", "tf32", "bf16"), "cpu": ("fp32", "bf16"), "mps": ("fp32",)}
TINY = {"depth": 2, "d_model": 32, "n_heads": 2, "block_size": 32, "batch_size": 4, "vocab": 257}
STAGES = {"parity": 0.25, "throughput": 0.75, "sweep": 0.97}  # ends, as budget shares
# Relative deviation of a step's training loss from the CPU's fp32 run above which parity
# fails: a few times the differences measured on the CPU (docs/torch_ref.md)
PARITY_LIMITS = {"fp32": 0.05, "tf32": 0.1, "bf16": 0.25}
COMPILE_S, EAGER_S = 90, 20  # the least time left for a compiled / eager measurement to start
FINISHED = ("completed", "diverged")  # a diverged run finished: its LR is too high, not broken


@dataclasses.dataclass(frozen=True)
class GpuCheckConfig:
    device: str = "cuda"  # cuda | mps | cpu (cpu: the same stages without a GPU)
    quick: bool = False  # tiny shapes, eager only, a 4-run sweep: the CPU test
    parallel: int = 2  # K: runs at once in the K-process rows and the sweep's jobs
    budget: float = 480.0  # seconds for the whole check (the plan: ~280 on an H200, estimated)
    seconds: float = 2.0  # timed seconds per throughput measurement
    out: str = ""  # "" -> $OUT if set, else gpu-check


class Clock:
    """Each stage ends by its share of the budget (time one leaves unused goes to the next)."""

    def __init__(self, budget: float):
        self.start, self.budget = time.monotonic(), budget

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, stage: str) -> float:
        return STAGES[stage] * self.budget - self.elapsed()


def quick_env(check: GpuCheckConfig) -> dict[str, str]:
    """quick=true: one thread a process (a shared CPU's threads slow a tiny step)."""
    return {"OMP_NUM_THREADS": "1"} if check.quick else {}


def check_row(check: str, ok: bool | None, figure: str) -> dict:  # ok None: not run
    return {"check": check, "ok": ok, "figure": figure}


def train_run(cfg: TrainConfig, check: GpuCheckConfig, out: Path, left: float) -> dict:
    done = subprocess.run(shlex.split(command_line(cfg)), capture_output=True, text=True,
                          env=checkout_env(quick_env(check)), cwd=ROOT, timeout=left)
    folder = RunFolder.of(cfg)
    summary, metrics = folder.summary_record(), folder.read_metrics()
    rows = sorted(metrics.to_pylist() if metrics is not None else [], key=lambda r: r["step"])
    run = {"run_dir": str(folder.path.relative_to(out)), "returncode": done.returncode,
           "status": summary.get("status", "failed"),
           "final_val_loss": summary.get("final_val_loss"),
           "final_weights_sha256": summary.get("final_weights_sha256"),
           "losses": {str(r["step"]): r["train_loss"] for r in rows
                      if r["train_loss"] is not None}}
    if done.returncode:
        run["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    return run


def parity(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    base, _ = shape_config(TINY if check.quick else preset_shape("demo"), preset_base("demo"),
                           backend="torch", data=str(data), runs_dir=str(out / "parity-runs"),
                           sweep="parity", max_steps=20 if check.quick else 50,
                           warmup_steps=5 if check.quick else 30)
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
            runs[label] = train_run(cfg, check, out, left)
        except subprocess.TimeoutExpired:
            skipped.append(f"parity: {label} (stopped for time)")
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

    def cell(label: str, step: str) -> str:
        loss = p["runs"][label]["losses"].get(step)
        dev = p["deviation"].get(label, {}).get("per_step", {}).get(step)
        return f"{loss:.5f} ({dev:.1e})" if loss is not None and dev is not None else "-"

    lines += table(["step", "cpu fp32", *labels], [
        [str(s), f"{ref[str(s)]:.5f}", *(cell(label, str(s)) for label in labels)] for s in shown])
    worst = [f"{label}: {d['max']:.1e} at step {d['max_at_step']} (limit {d['limit']:g})"
             if d["max"] is not None else f"{label}: -" for label, d in p["deviation"].items()]
    lines += ["", "   largest relative deviation over all steps: " + "; ".join(worst)]
    return lines + [f"   {label} failed: {r['error']}" for label, r in p["runs"].items()
                    if r.get("error")]


def parity_row(p: dict, label: str) -> dict:
    """ok when the run finished and every step was within its limit; None when not run."""
    r, d, check = p["runs"].get(label), p["deviation"].get(label), f"parity {label}"
    if r is None:
        return check_row(check, None, "not run (time)")
    if r["returncode"] or r["status"] != "completed":
        return check_row(check, False, r.get("error") or r["status"])
    if label == p["reference"]:
        return check_row(check, True, f"the reference, {len(r['losses'])} steps")
    if label.endswith(" repeat"):
        first = p["runs"].get(label.removesuffix(" repeat"), {})
        same = bool(r["final_weights_sha256"]) and \
            r["final_weights_sha256"] == first.get("final_weights_sha256")
        return check_row(check, same, "final weights bit-identical to the first run's" if same
                         else "final weights differ from the first run's")
    if d is None or d["max"] is None or d["steps_compared"] < p["steps"]:
        return check_row(check, False, f"{d['steps_compared'] if d else 0} of {p['steps']} "
                         "steps compared")
    return check_row(check, d["max"] <= d["limit"],
                     f"largest deviation {d['max']:.1e} (limit {d['limit']:g})")


def throughput_plan(check: GpuCheckConfig) -> list[dict]:
    """The study's shape in every precision, then compiled bf16 one run and K at once."""
    k = check.parallel

    def row(precision: str, compile_: bool = False, processes: int = 1,
            deterministic: bool = True) -> dict:
        return {"shape": "tiny" if check.quick else "study", "precision": precision,
                "compile": compile_, "processes": processes, "deterministic": deterministic}

    if check.quick:
        return [row("fp32")] + ([row("fp32", processes=k)] if k > 1 else [])
    fast = PRECISIONS[check.device][-1]  # bf16 on a GPU
    plan = [row(p) for p in PRECISIONS[check.device]]
    plan += [row(fast, deterministic=False), row(fast, compile_=True)]
    return plan + ([row(fast, compile_=True, processes=k)] if k > 1 else [])


def label(m: dict) -> str:
    """A measurement's name in the tables: "study bf16 compiled x2", "... nondeterministic"."""
    return (f"{m['shape']} {m['precision']} {'compiled' if m['compile'] else 'eager'} "
            f"x{m['processes']}" + ("" if m.get("deterministic", True) else " nondeterministic"))


def measure(check: GpuCheckConfig, m: dict, spec: Spec, left: float, args
            ) -> tuple[dict, float | None]:
    """One measurement's row and matmul peak; a step that makes the host wait fails it."""
    env = {RUNS_PER_DEVICE: str(m["processes"]), SYNC_CHECK: "1", **quick_env(check)}
    results = measure_together(spec, m["processes"], env=env,
                               timeout=min(left, 240 if m["compile"] else 90))
    total, fpt = sum(r["tokens_per_s"] for r in results), flops_per_token(args)
    windows = [r["window"] for r in results]
    # the time all the windows share, over the longest one (1: all K timed at once)
    common = min(end for _, end in windows) - max(start for start, _ in windows)
    row = {**m, "status": "ok", "tokens_per_s": total,
           "per_process": [r["tokens_per_s"] for r in results],
           "steps": [r["steps"] for r in results], "warmup_s": [r["warmup_s"] for r in results],
           "windows": windows,
           "overlap": max(0.0, common) / max(end - start for start, end in windows),
           "peak_memory_bytes": [r["peak_memory_bytes"] for r in results],
           "flops_per_token": fpt, "tflops": total * fpt / 1e12}
    return row, results[0].get("matmul_gflops")


def throughput(check: GpuCheckConfig, clock: Clock, skipped: list) -> dict:
    shapes = {"tiny": TINY} if check.quick else {"study": preset_shape("study")}
    peaks: dict[str, float] = {}
    rows = []
    seconds = min(check.seconds, 0.5) if check.quick else check.seconds
    for m in throughput_plan(check):
        left = clock.left("throughput")
        if left < (COMPILE_S if m["compile"] else EAGER_S):
            skipped.append(f"throughput: {label(m)} (skipped for time)")
            rows.append({**m, "status": "skipped for time"})
            continue
        cfg, args = shape_config(shapes[m["shape"]], preset_base(m["shape"]), backend="torch",
                                 device=check.device, precision=m["precision"],
                                 compile=m["compile"], deterministic=m["deterministic"])
        first = m["processes"] == 1 and m["precision"] not in peaks
        spec = Spec(config=dataclasses.asdict(cfg), vocab=shapes[m["shape"]]["vocab"], warmup=2,
                    seconds=seconds, min_steps=3, matmul=first)
        print(f"throughput: {label(m)} ...", end=" ", flush=True)
        try:
            row, peak = measure(check, m, spec, left, args)
        except StepFailed as e:
            print(f"failed ({e})", flush=True)
            rows.append({**m, "status": f"failed: {e}"})
            continue
        if first and peak is not None:
            peaks[m["precision"]] = peak
        if m["precision"] in peaks:
            row["share_of_matmul_peak"] = row["tflops"] * 1e3 / peaks[m["precision"]]
        rows.append(row)
        print(f"{row['tokens_per_s']:,.0f} tok/s", flush=True)
    return {"matmul_gflops": peaks, "seconds": seconds, "parallel": check.parallel,
            "shapes": shapes, "rows": rows, "where_to_run": where_to_run(rows)}


def where_to_run(rows: list[dict]) -> list[dict]:
    """Hours of the study preset at the study-shape speeds measured here (one run at a time)."""
    return [{"precision": r["precision"], "compile": r["compile"],
             "tokens_per_s": r["tokens_per_s"], **study_hours(r["tokens_per_s"])}
            for r in rows if r["shape"] == "study" and r["status"] == "ok"
            and r["processes"] == 1 and r["deterministic"]]


def throughput_text(t: dict, device: str) -> list[str]:
    hours = "GPU-hours" if device.startswith(("cuda", "mps")) else "hours"
    k = t["parallel"]
    peaks = ", ".join(f"{p} {g / 1e3:.1f} TFLOP/s" for p, g in t["matmul_gflops"].items())
    lines = [f"2. Throughput on {device} (the run's engine in fresh processes; 2 warm-up steps, "
             f"then ~{t['seconds']:g} s of steps; x{k}: {k} runs at once over one window, their "
             f"total, each with {RUNS_PER_DEVICE}={k})",
             f"   matmul peak measured here: {peaks or '-'}", ""]
    rows = []
    for r in t["rows"]:
        ok = r["status"] == "ok"
        rows.append([label(r), f"{r['tokens_per_s']:,.0f}" if ok else "-",
                     f"{r['tflops']:.2f}" if ok else "-",
                     f"{r['share_of_matmul_peak']:.1%}" if "share_of_matmul_peak" in r else "-",
                     f"{r['overlap']:.0%}" if ok and r["processes"] > 1 else "-", r["status"]])
    lines += table(["measurement", "tokens/s", "TFLOP/s", "share of matmul peak",
                    "windows shared", "status"], rows)
    if t["where_to_run"]:
        plan = study_plan()
        lines += ["", f"   the study preset here, one run at a time ({plan['runs_per_depth']} runs "
                      f"a depth, {plan['depths']} depths):", ""] + table(
            ["precision", "compiled", "tokens/s", "hours a run", f"{hours} a depth",
             f"{hours} the whole study"],
            [[w["precision"], "yes" if w["compile"] else "no", f"{w['tokens_per_s']:,.0f}",
              f"{w['hours_per_run']:.2f}", f"{w['hours_per_depth']:.1f}",
              f"{w['hours_whole_study']:.1f}"] for w in t["where_to_run"]])
    return lines


def throughput_summary(t: dict) -> list[dict]:
    return [check_row(f"throughput {label(r)}", ok,
                      f"{r['tokens_per_s']:,.0f} tokens/s" if ok else r["status"])
            for r in t["rows"]
            for ok in [None if r["status"] == "skipped for time" else r["status"] == "ok"]]


def sweep(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    """The demo preset cut to 4 runs (2 LRs x 2 arms, one seed), `parallel` processes."""
    words = ["sweep", "preset=demo", "backend=torch", f"device={check.device}",
             f"runs_dir={out / 'runs'}", f"data={data}", "--no-notify", "seeds=0",
             f"jobs={check.parallel}"]
    words += (["lrs=0.01,1", "max_steps=20", "warmup_steps=5",
               *(f"{k}={v}" for k, v in TINY.items() if k != "vocab")] if check.quick
              else ["lrs=0.001,0.1"])
    command = " ".join(["python", "-m", "qkstudy", *words])
    left = clock.left("sweep")
    if left < 20:
        skipped.append("sweep (skipped for time)")
        return {"command": command, "status": "skipped for time", "runs": [],
                "jobs": check.parallel}
    print(f"sweep: {command} (up to {left:.0f} s) ...", flush=True)
    status = "completed"
    with open(out / "sweep.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "qkstudy", *words], stdout=log,
                                stderr=subprocess.STDOUT, env=checkout_env(quick_env(check)), cwd=ROOT,
                                start_new_session=True)
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every worker checkpoints its run
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            status = "stopped for time"
            skipped.append("sweep: the runs not finished (stopped for time)")
    if status == "completed" and proc.returncode:
        status = f"failed (exit status {proc.returncode}; sweep.log)"
    runs = [{k: s.get(k) for k in ("run_id", "qk_norm", "lr", "seed", "status", "final_val_loss",
                                    "final_train_loss", "steps", "tokens_per_second",
                                    "peak_max_attention_logit")}
            for folder in run_folder.find_runs(out / "runs" / "demo")
            if (s := folder.summary_record())]
    return {"command": command, "status": status, "returncode": proc.returncode,
            "runs": runs, "planned_runs": 4, "jobs": check.parallel}


def sweep_text(s: dict) -> list[str]:
    lines = [f"3. Sweep: {s['command']}", f"   {s['status']}; {len(s['runs'])} run(s) finished", ""]
    if s["runs"]:
        lines += table(
            ["run", "QK-norm", "lr", "seed", "status", "final val loss", "final train loss",
             "steps", "tokens/s"],
            [[r["run_id"], r["qk_norm"], f"{r['lr']:g}", str(r["seed"]), r["status"],
              *(f"{v:.4f}" if v is not None else "-"
                for v in (r["final_val_loss"], r["final_train_loss"])),
              str(r["steps"]), f"{r['tokens_per_second'] or 0:,.0f}"]
             for r in sorted(s["runs"], key=lambda r: (r["seed"], r["lr"], r["qk_norm"]))])
    return lines


def sweep_summary(s: dict) -> list[dict]:
    check = f"sweep jobs={s['jobs']}"
    if s["status"] == "skipped for time":
        return [check_row(check, None, "not run (time)")]
    finished = [r for r in s["runs"] if r["status"] in FINISHED]
    return [check_row(check, s["status"] == "completed" and len(finished) == s["planned_runs"],
                      f"{len(finished)} of {s['planned_runs']} runs finished"
                      + ("" if s["status"] == "completed" else f"; {s['status']}"))]
