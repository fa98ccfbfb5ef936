"""`python -m torch_ref gpu-check` (`just gpu-check`): backend=torch on one CUDA GPU, in one script.

Three stages, each time-boxed inside `budget` seconds (default 450, under 8 minutes in all;
what does not fit is listed as skipped for time):

1. parity: one short run of the demo preset's model trained with device=cpu (fp32, the
   reference) and on the device in every precision it has (cuda: fp32, tf32, bf16), each by
   `python -m qkstudy train` in its own process; the relative deviation of every step's
   training loss from the reference's;
2. throughput: tokens/s of the run's own engine (qkstudy/bench/step.py, each measurement a fresh
   process) at the demo, mini and study shapes, fp32/tf32/bf16, eager and compiled, one run and
   `parallel` runs at once (each with QKSTUDY_RUNS_PER_DEVICE=K, as a sweep with jobs=K sets it),
   with FLOP/s against the device's measured matmul peak in that precision; the study-shape
   speeds turned into hours per study run, per depth and for the whole study;
3. sweep: `python -m qkstudy sweep preset=demo backend=torch device=...`, its runs' final
   losses and statuses.

It writes to `out` (default: $OUT if set, else gpu-check/): gpu-check.json (every number),
gpu-check.txt (the summary it prints) and gpu-check-runs.tar.gz (the sweep's and the parity
runs' folders and the sweep's log; weight files are left out, their sha256 is in each
summary.json). device=cpu quick=true runs the same stages on the CPU at tiny sizes (one thread
a process) in well under a minute: that is how the test suite checks this script. It needs
torch, numpy, pyarrow and scipy (the sweep's adaptive seeds), no network, no MLX.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import signal
import subprocess
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from qkstudy import runlog
from qkstudy.bench.forecast import study_plan
from qkstudy.bench.step import Spec, StepFailed, measure_together
from qkstudy.cli import keys_usage
from qkstudy.config import TrainConfig, apply_overrides, split_key_values
from qkstudy.data.prepare import PrepareConfig, prepare
from qkstudy.errors import UsageError
from qkstudy.bench.shapes import flops_per_token, preset_base, preset_shape, shape_config
from qkstudy.trainer import run_dir_of

from .engine import RUNS_PER_DEVICE, describe, resolve_device

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"cuda": ("fp32", "tf32", "bf16"), "cpu": ("fp32", "bf16"), "mps": ("fp32",)}
TINY = {"depth": 2, "d_model": 32, "n_heads": 2, "block_size": 32, "batch_size": 4, "vocab": 257}
STAGES = (("parity", 0.12), ("throughput", 0.72), ("sweep", 0.97))  # ends, as budget shares
ARCHIVE = "gpu-check-runs.tar.gz"


@dataclasses.dataclass(frozen=True)
class GpuCheckConfig:
    device: str = "cuda"  # cuda | mps | cpu (cpu: the same stages without a GPU)
    quick: bool = False  # tiny shapes, fp32 eager only, a 4-run sweep: the CPU test
    parallel: int = 2  # K for "K runs at once"; 1 leaves that out
    budget: float = 450.0  # seconds for the whole check
    seconds: float = 2.0  # timed seconds per throughput measurement
    out: str = ""  # "" -> $OUT if set, else gpu-check

    def out_dir(self) -> Path:
        return Path(self.out or os.environ.get("OUT") or "gpu-check")


class Clock:
    """The check's deadlines: each stage ends by its share of the budget (time a stage leaves
    unused goes to the next one)."""

    def __init__(self, budget: float):
        self.start, self.budget = time.monotonic(), budget

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, stage: str) -> float:
        end = dict(STAGES)[stage] * self.budget
        return end - self.elapsed()


def quick_env(check: GpuCheckConfig) -> dict[str, str]:
    """quick=true: one thread per process (a test on a shared CPU: torch's threads, waiting on
    each other on busy cores, can make a tiny step 100x slower)."""
    return {"OMP_NUM_THREADS": "1"} if check.quick else {}


def python_env(check: GpuCheckConfig) -> dict[str, str]:
    """The environment of the processes started here: this checkout importable."""
    return {**os.environ, **quick_env(check), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def train_words(cfg: TrainConfig) -> list[str]:
    """`python -m qkstudy train` words for the fields of `cfg` that are not the defaults."""
    default = TrainConfig()
    return [f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != getattr(default, f.name)]


# --- 1. parity ----------------------------------------------------------------------------------

def parity_config(check: GpuCheckConfig, data: Path, out: Path) -> TrainConfig:
    shape = TINY if check.quick else preset_shape("demo")
    cfg, _ = shape_config(shape, preset_base("demo"), backend="torch", data=str(data),
                          runs_dir=str(out / "parity-runs"), sweep="parity",
                          max_steps=20 if check.quick else 50,
                          warmup_steps=5 if check.quick else 30)
    return cfg


def losses_of(run_dir: Path) -> dict[int, float]:
    table = runlog.read_parts(run_dir / "metrics")
    rows = table.select(["step", "train_loss"]).to_pydict() if table is not None else {}
    return {s: v for s, v in zip(rows.get("step", []), rows.get("train_loss", []))
            if v is not None}


def parity(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    base = parity_config(check, data, out)
    settings = [("cpu", "fp32")] + [(check.device, p) for p in PRECISIONS[check.device]
                                    if (check.device, p) != ("cpu", "fp32")]
    runs: dict[str, dict] = {}
    for device, precision in settings:
        label = f"{device} {precision}"
        left = clock.left("parity")
        if left < 5:
            skipped.append(f"parity: {label} (skipped for time)")
            continue
        cfg = dataclasses.replace(base, device=device, precision=precision)
        print(f"parity: training {label} ({cfg.steps} steps) ...", flush=True)
        try:
            done = subprocess.run([sys.executable, "-m", "qkstudy", "train", *train_words(cfg)],
                                  capture_output=True, text=True, env=python_env(check),
                                  cwd=ROOT, timeout=left)
        except subprocess.TimeoutExpired:
            skipped.append(f"parity: {label} (stopped for time)")
            continue
        run_dir = run_dir_of(cfg)
        summary = runlog.read_json(run_dir / "summary.json") or {}
        runs[label] = {"run_dir": str(run_dir.relative_to(out)), "returncode": done.returncode,
                       "status": summary.get("status", "failed"),
                       "final_val_loss": summary.get("final_val_loss"),
                       "losses": {str(k): v for k, v in sorted(losses_of(run_dir).items())}}
        if done.returncode:
            runs[label]["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    reference = runs.get("cpu fp32", {}).get("losses", {})
    deviations = {}
    for label, r in runs.items():
        if label == "cpu fp32" or not reference:
            continue
        per_step = {s: abs(r["losses"][s] - ref) / abs(ref)
                    for s, ref in reference.items() if s in r["losses"] and ref}
        worst = max(per_step, key=per_step.get, default=None)
        deviations[label] = {"per_step": per_step, "max": per_step.get(worst),
                             "max_at_step": int(worst) if worst is not None else None,
                             "steps_compared": len(per_step)}
    return {"reference": "cpu fp32", "steps": base.steps, "config": base.identity(),
            "runs": runs, "deviation": deviations}


def parity_text(p: dict) -> list[str]:
    labels = [label for label in p["runs"] if label != "cpu fp32"]
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
    worst = [f"{label}: {d['max']:.1e} at step {d['max_at_step']}" if d["max"] is not None
             else f"{label}: -" for label, d in p["deviation"].items()]
    lines += ["", "   largest relative deviation over all steps: " + "; ".join(worst)]
    for label, r in p["runs"].items():
        if r.get("error"):
            lines.append(f"   {label} failed: {r['error']}")
    return lines


# --- 2. throughput ------------------------------------------------------------------------------

def throughput_plan(check: GpuCheckConfig) -> list[dict]:
    """The measurements in the order they are taken, the most telling first: one run eager at
    every shape (the study's first), the study compiled in bf16, K runs at once eager, then the
    rest compiled; whatever the budget does not reach is skipped."""
    precisions = ("fp32",) if check.quick else PRECISIONS[check.device]
    counts = (1, check.parallel) if check.parallel > 1 else (1,)
    if check.quick:
        return [{"shape": "tiny", "precision": p, "compile": False, "processes": n}
                for p in precisions for n in counts]
    plan = []

    def add(shapes, compile_, ns, order=precisions):
        plan.extend({"shape": s, "precision": p, "compile": compile_, "processes": n}
                    for s in shapes for n in ns for p in order)

    add(["study", "mini", "demo"], False, [1])
    add(["study"], True, [1], order=precisions[-1:])  # bf16 on a GPU
    add(["study", "mini", "demo"], False, counts[1:])
    add(["study"], True, [1], order=tuple(reversed(precisions[:-1])))
    add(["study"], True, counts[1:])
    add(["mini", "demo"], True, counts)
    return plan


def throughput(check: GpuCheckConfig, clock: Clock, skipped: list) -> dict:
    shapes = {"tiny": TINY} if check.quick else {n: preset_shape(n) for n in ("demo", "mini",
                                                                                 "study")}
    peaks: dict[str, float] = {}
    rows = []
    seconds = min(check.seconds, 0.5) if check.quick else check.seconds
    for m in throughput_plan(check):
        label = (f"{m['shape']} {m['precision']} {'compiled' if m['compile'] else 'eager'} "
                 f"x{m['processes']}")
        need = 60 if m["compile"] else 12
        left = clock.left("throughput")
        if left < need:
            skipped.append(f"throughput: {label} (skipped for time)")
            rows.append({**m, "status": "skipped for time"})
            continue
        shape = shapes[m["shape"]]
        cfg, args = shape_config(shape, preset_base(m["shape"]), backend="torch",
                                 device=check.device, precision=m["precision"],
                                 compile=m["compile"])
        first = m["processes"] == 1 and m["precision"] not in peaks
        spec = Spec(config=dataclasses.asdict(cfg), vocab=shape["vocab"], warmup=2,
                    seconds=seconds, min_steps=3, matmul=first)
        print(f"throughput: {label} ...", end=" ", flush=True)
        try:
            env = {RUNS_PER_DEVICE: str(m["processes"]), **quick_env(check)}
            results = measure_together(spec, m["processes"], env=env,
                                       timeout=min(left, 240 if m["compile"] else 90))
        except StepFailed as e:
            print(f"failed ({e})", flush=True)
            rows.append({**m, "status": f"failed: {e}"})
            if "not done within" in str(e) or "not warmed up in time" in str(e):
                skipped.append(f"throughput: {label} (stopped for time)")
            continue
        if first and "matmul_gflops" in results[0]:
            peaks[m["precision"]] = results[0]["matmul_gflops"]
        total = sum(r["tokens_per_s"] for r in results)
        fpt = flops_per_token(args)
        row = {**m, "status": "ok", "tokens_per_s": total,
               "per_process": [r["tokens_per_s"] for r in results],
               "steps": [r["steps"] for r in results],
               "warmup_s": [r["warmup_s"] for r in results],
               "peak_memory_bytes": [r["peak_memory_bytes"] for r in results],
               "flops_per_token": fpt, "tflops": total * fpt / 1e12}
        if m["precision"] in peaks:
            row["share_of_matmul_peak"] = row["tflops"] * 1e3 / peaks[m["precision"]]
        rows.append(row)
        print(f"{total:,.0f} tok/s", flush=True)
    return {"matmul_gflops": peaks, "seconds": seconds, "parallel": check.parallel,
            "shapes": shapes, "rows": rows, "where_to_run": where_to_run(rows)}


def where_to_run(rows: list[dict]) -> list[dict]:
    """Hours of the study preset at the study-shape speeds measured here (one run at a time)."""
    plan = study_plan()
    out = []
    for r in rows:
        if r["shape"] != "study" or r["status"] != "ok" or r["processes"] != 1:
            continue
        hours = plan["cost_tokens"] / r["tokens_per_s"] / 3600
        out.append({"precision": r["precision"], "compile": r["compile"],
                    "tokens_per_s": r["tokens_per_s"], "hours_per_run": hours,
                    "gpu_hours_per_depth": hours * plan["runs_per_depth"],
                    "gpu_hours_whole_study": hours * plan["runs_per_depth"] * plan["depths"]})
    return out


def throughput_text(t: dict, device: str) -> list[str]:
    hours = "GPU-hours" if device.startswith(("cuda", "mps")) else "hours"
    k = t["parallel"]
    peaks = ", ".join(f"{p} {g / 1e3:.1f} TFLOP/s" for p, g in t["matmul_gflops"].items())
    lines = [f"2. Throughput on {device} (the run's engine in a fresh process per measurement; "
             f"2 warm-up steps, then ~{t['seconds']:g} s of steps; x{k}: {k} runs at once, "
             f"their total, each with {RUNS_PER_DEVICE}={k})",
             f"   matmul peak measured here: {peaks or '-'}", "",
             "| shape | precision | compiled | runs at once | tokens/s | TFLOP/s | share of matmul "
             "peak | status |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in t["rows"]:
        ok = r["status"] == "ok"
        speed = f"{r['tokens_per_s']:,.0f}" if ok else "-"
        tflops = f"{r['tflops']:.2f}" if ok else "-"
        share = f"{r['share_of_matmul_peak']:.1%}" if "share_of_matmul_peak" in r else "-"
        lines.append(f"| {r['shape']} | {r['precision']} | {'yes' if r['compile'] else 'no'} | "
                     f"{r['processes']} | {speed} | {tflops} | {share} | {r['status']} |")
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


# --- 3. sweep -----------------------------------------------------------------------------------

def sweep_words(check: GpuCheckConfig, data: Path, out: Path) -> list[str]:
    words = ["sweep", "preset=demo", "backend=torch", f"device={check.device}",
             f"runs_dir={out / 'runs'}", f"data={data}", "--no-notify"]
    if check.quick:
        words += ["seeds=0", "lrs=0.01,1", "max_steps=20", "warmup_steps=5", "jobs=1",
                  *(f"{k}={v}" for k, v in TINY.items() if k != "vocab")]
    return words


def sweep(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    words = sweep_words(check, data, out)
    command = ["python", "-m", "qkstudy", *words]
    left = clock.left("sweep")
    if left < 20:
        skipped.append("sweep (skipped for time)")
        return {"command": " ".join(command), "status": "skipped for time", "runs": []}
    print(f"sweep: {' '.join(command)} (up to {left:.0f} s) ...", flush=True)
    status = "completed"
    with open(out / "sweep.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "qkstudy", *words], stdout=log,
                                stderr=subprocess.STDOUT, env=python_env(check), cwd=ROOT,
                                start_new_session=True)
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            # Ctrl-C: every worker checkpoints its run and stops
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            status = "stopped for time"
            skipped.append("sweep: the runs not finished (stopped for time)")
    if status == "completed" and proc.returncode:
        status = f"failed (exit status {proc.returncode}; sweep.log)"
    runs = []
    for summary_path in sorted((out / "runs" / "demo").glob("*/summary.json")):
        s = runlog.read_json(summary_path) or {}
        runs.append({k: s.get(k) for k in ("run_id", "qk_norm", "lr", "seed", "status",
                                           "final_val_loss", "final_train_loss", "steps",
                                           "tokens_per_second", "peak_max_attention_logit")})
    return {"command": " ".join(command), "status": status, "returncode": proc.returncode,
            "runs": runs}


def sweep_text(s: dict) -> list[str]:
    lines = [f"3. Sweep: {s['command']}", f"   {s['status']}; {len(s['runs'])} run(s) finished",
             ""]
    if s["runs"]:
        lines += ["| run | QK-norm | lr | seed | status | final val loss | final train loss | "
                  "steps | tokens/s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in sorted(s["runs"], key=lambda r: (r["seed"], r["lr"], r["qk_norm"])):
            val, train = (f"{v:.4f}" if v is not None else "-"
                          for v in (r["final_val_loss"], r["final_train_loss"]))
            lines.append(f"| {r['run_id']} | {r['qk_norm']} | {r['lr']:g} | {r['seed']} | "
                         f"{r['status']} | {val} | {train} | {r['steps']} | "
                         f"{r['tokens_per_second'] or 0:,.0f} |")
    return lines


def skipped_text(skipped: list[str]) -> str:
    """What the budget did not reach: in full, but throughput's as a count (its table says
    which)."""
    if not skipped:
        return "nothing"
    measurements = [s for s in skipped if s.startswith("throughput: ")]
    rest = [s for s in skipped if s not in measurements]
    if measurements:
        rest.append(f"throughput: {len(measurements)} measurement(s), marked in its table")
    return "; ".join(rest)


# --- the whole check ----------------------------------------------------------------------------

def machine(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count(),
            "device": describe(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_bytes"] = props.total_memory
        info["multiprocessors"] = props.multi_processor_count
    return info


def archive(work: Path, out: Path) -> Path:
    """The sweep's and the parity runs' folders and the sweep's log, without weight files."""
    path = out / ARCHIVE

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.name.endswith((".safetensors", ".lock")) else info

    with tarfile.open(path, "w:gz") as tar:
        for name in ("runs", "parity-runs", "sweep.log"):
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=keep)
    return path


def run(check: GpuCheckConfig) -> tuple[dict, str]:
    clock = Clock(check.budget)
    device = resolve_device(check.device)  # an unavailable device: one line, nothing written
    out = check.out_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e.strerror or e}") from None
    out = out.resolve()
    # the corpus and the run folders: a scratch folder, archived into `out` at the end (so `out`
    # holds three files)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        return _run(check, clock, device, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(check: GpuCheckConfig, clock: Clock, device: torch.device, out: Path, work: Path
         ) -> tuple[dict, str]:
    data = work / "data" / "synthetic-bytes"
    print(f"preparing the synthetic corpus in {data} ...", flush=True)
    prepare("synthetic", PrepareConfig(out=str(data), tokenizer="bytes",
                                       size_mb=0.3 if check.quick else 2.0))
    skipped: list[str] = []
    report: dict = {"machine": machine(device), "config": dataclasses.asdict(check),
                    "out": str(out)}
    text = [f"gpu-check on {report['machine']['device']} (torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs, budget {check.budget:g} s"
            + (", quick" if check.quick else "") + ")", ""]
    for name, stage, render in (
            ("parity", lambda: parity(check, clock, data, work, skipped), parity_text),
            ("throughput", lambda: throughput(check, clock, skipped),
             lambda t: throughput_text(t, report["machine"]["device"])),
            ("sweep", lambda: sweep(check, clock, data, work, skipped), sweep_text)):
        started = clock.elapsed()
        try:
            report[name] = stage()
            report[name]["stage_seconds"] = clock.elapsed() - started
            text += render(report[name]) + [""]
        except Exception as e:  # the other stages and the files still come
            report[name] = {"error": f"{type(e).__name__}: {e}"}
            text += [f"{name}: failed: {type(e).__name__}: {e}", ""]
            print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    report["skipped"] = skipped
    report["elapsed_s"] = clock.elapsed()
    text += ["Skipped for time: " + skipped_text(skipped),
             f"Elapsed: {report['elapsed_s']:.0f} s of a {check.budget:g} s budget."]
    report["archive"] = archive(work, out).name
    return report, "\n".join(text)


USAGE = keys_usage(
    "python -m torch_ref gpu-check [key=value ...]",
    "backend=torch on one GPU in one time-boxed script: CUDA-vs-CPU loss parity, tokens/s at\n"
    "the demo, mini and study shapes (fp32/tf32/bf16, eager and compiled, 1 and K runs at once)\n"
    "and a short demo sweep. Writes gpu-check.json, gpu-check.txt and gpu-check-runs.tar.gz\n"
    "to out (default $OUT, else gpu-check/). device=cpu quick=true: the same on the CPU, tiny.",
    GpuCheckConfig)


def cli(argv: list[str]) -> int:
    check = apply_overrides(GpuCheckConfig(), split_key_values(argv))
    if not (math.isfinite(check.budget) and check.budget > 0):
        raise UsageError(f"budget must be a number of seconds > 0, got {check.budget}")
    if not (math.isfinite(check.seconds) and check.seconds > 0):
        raise UsageError(f"seconds must be a number > 0, got {check.seconds}")
    if check.parallel < 1:
        raise UsageError(f"parallel must be >= 1, got {check.parallel}")
    if check.device not in PRECISIONS:
        raise UsageError(f"device must be one of {', '.join(PRECISIONS)}; got {check.device!r}")
    report, text = run(check)
    out = Path(report["out"])
    runlog.write_json(out / "gpu-check.json", report)
    runlog.write_text(out / "gpu-check.txt", text + "\n")
    print(text)
    print(f"written: {out / 'gpu-check.json'}, {out / 'gpu-check.txt'}, {out / ARCHIVE}",
          file=sys.stderr)
    failed = [k for k in ("parity", "throughput", "sweep") if "error" in report[k]]
    return 1 if failed else 0
