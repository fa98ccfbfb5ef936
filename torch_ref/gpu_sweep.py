"""gpu-check's third stage: a short demo sweep with jobs=K on the device (`python -m qkstudy
sweep`), its runs' final losses and statuses; and the archive of the check's run folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

from qkstudy import run_folder

from .gpu_plan import ROOT, TINY, Clock, GpuCheckConfig, python_env

ARCHIVE = "gpu-check-runs.tar.gz"
FINISHED = ("completed", "diverged")  # a diverged run finished: its LR is too high, not broken


def sweep_words(check: GpuCheckConfig, data: Path, out: Path) -> list[str]:
    """The demo preset cut to 4 runs (2 LRs x 2 arms, one seed), `parallel` processes."""
    words = ["sweep", "preset=demo", "backend=torch", f"device={check.device}",
             f"runs_dir={out / 'runs'}", f"data={data}", "--no-notify", "seeds=0",
             f"jobs={check.parallel}"]
    if check.quick:
        words += ["lrs=0.01,1", "max_steps=20", "warmup_steps=5",
                  *(f"{k}={v}" for k, v in TINY.items() if k != "vocab")]
    else:
        words += ["lrs=0.001,0.1"]
    return words


def sweep(check: GpuCheckConfig, clock: Clock, data: Path, out: Path, skipped: list) -> dict:
    words = sweep_words(check, data, out)
    command = ["python", "-m", "qkstudy", *words]
    left = clock.left("sweep")
    if left < 20:
        skipped.append("sweep (skipped for time)")
        return {"command": " ".join(command), "status": "skipped for time", "runs": [],
                "jobs": check.parallel}
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
    for folder in run_folder.find_runs(out / "runs" / "demo"):
        s = folder.summary_record()
        if not s:
            continue
        runs.append({k: s.get(k) for k in ("run_id", "qk_norm", "lr", "seed", "status",
                                           "final_val_loss", "final_train_loss", "steps",
                                           "tokens_per_second", "peak_max_attention_logit")})
    return {"command": " ".join(command), "status": status, "returncode": proc.returncode,
            "runs": runs, "planned_runs": 4, "jobs": check.parallel}


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


def sweep_summary(s: dict) -> list[dict]:
    """One summary row: ok when the sweep exited 0 and every planned run finished."""
    if s["status"] == "skipped for time":
        return [{"check": f"sweep jobs={s['jobs']}", "ok": None, "figure": "not run (time)"}]
    finished = [r for r in s["runs"] if r["status"] in FINISHED]
    ok = s["status"] == "completed" and len(finished) == s["planned_runs"]
    figure = (f"{len(finished)} of {s['planned_runs']} runs finished"
              + ("" if s["status"] == "completed" else f"; {s['status']}"))
    return [{"check": f"sweep jobs={s['jobs']}", "ok": ok, "figure": figure}]


def archive(work: Path, out: Path) -> Path:
    """The sweep's and the parity runs' folders and the sweep's log, without weight files."""
    path = out / ARCHIVE

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.name.endswith((".safetensors", run_folder.LOCK)) else info

    with tarfile.open(path, "w:gz") as tar:
        for name in ("runs", "parity-runs", "sweep.log"):
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=keep)
    return path
