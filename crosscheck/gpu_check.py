"""`python -m crosscheck gpu-check`: backend=torch on one CUDA GPU (docs/performance.md)."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from qkstudy import run_folder
from qkstudy.bench.cli import write_report
from qkstudy.progress import table
from qkstudy.cli import keys_usage
from qkstudy.config import apply_overrides, split_key_values
from qkstudy.data.prepare import PrepareConfig, prepare
from qkstudy.errors import UsageError

from torch_ref.device import describe, resolve_device

from .gpu_stages import (PRECISIONS, Clock, GpuCheckConfig, check_row, parity, parity_row,
                         parity_text, sweep, sweep_summary, sweep_text, throughput,
                         throughput_summary, throughput_text)

ARCHIVE = "gpu-check-runs.tar.gz"
SUMMARIES = {"parity": lambda p: [parity_row(p, label) for label in p["planned"]],
             "throughput": throughput_summary, "sweep": sweep_summary}


def machine(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count(),
            "device": describe(device)}
    if device.type != "cuda":
        return info
    props = torch.cuda.get_device_properties(device)
    return {**info, "gpu_memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count}


def summary(report: dict) -> list[dict]:
    """A row per planned check (gpu_stages.check_row); a stage that crashed is one failed row."""
    rows = []
    for stage, rows_of in SUMMARIES.items():
        result = report.get(stage, {"error": "not run"})
        if "error" in result:
            rows.append(check_row(stage, False, f"crashed: {result['error']}"))
        else:
            rows += rows_of(result)
    return rows


def summary_text(rows: list[dict]) -> list[str]:
    word = {True: "ok", False: "FAILED", None: "not run"}
    failed = [r for r in rows if r["ok"] is not True]
    verdict = ("PASS: every check passed" if not failed else
               f"FAIL: {len(failed)} of {len(rows)} checks did not pass "
               f"({', '.join(r['check'] for r in failed)})")
    return (["Summary", ""] + table(["check", "result", "figure"],
                                    [[r["check"], word[r["ok"]], r["figure"]] for r in rows])
            + ["", verdict])


def run(check: GpuCheckConfig) -> tuple[dict, str]:
    clock = Clock(check.budget)
    device = resolve_device(check.device)  # an unavailable device: one line, nothing written
    out = Path(check.out or os.environ.get("OUT") or "gpu-check")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e.strerror or e}") from None
    out = out.resolve()
    # the corpus and the run folders: a scratch folder, archived into `out` at the end
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
    report["summary"] = summary(report)
    report["passed"] = all(r["ok"] is True for r in report["summary"])
    times = [f"{name} " + (f"{s:.0f} s" if (s := report[name].get("stage_seconds")) is not None
                           else "-") for name in SUMMARIES]
    # what the budget did not reach; throughput's as a count (its table says which)
    measurements = [s for s in skipped if s.startswith("throughput: ")]
    said = [s for s in skipped if s not in measurements] + [
        f"throughput: {len(measurements)} measurement(s), marked in its table"] * bool(measurements)
    text += ["Skipped for time: " + ("; ".join(said) or "nothing"),
             f"Elapsed: {report['elapsed_s']:.0f} s of a {check.budget:g} s budget "
             f"({', '.join(times)}).", ""]
    text += summary_text(report["summary"])
    with tarfile.open(out / ARCHIVE, "w:gz") as tar:  # the run folders without weights
        for name in ("runs", "parity-runs", "sweep.log"):
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=lambda info: None if info.name.endswith(
                    (".safetensors", run_folder.LOCK)) else info)
    report["archive"] = ARCHIVE
    return report, "\n".join(text)


USAGE = keys_usage(
    "python -m crosscheck gpu-check [key=value ...]",
    "backend=torch on one GPU in one time-boxed script: CUDA-vs-CPU loss parity, tokens/s at\n"
    "the study's shape (fp32/tf32/bf16 eager, bf16 without determinism, compiled bf16 one run\n"
    "and K at once) and a 4-run demo sweep with jobs=K; one summary table, exit status 0 only\n"
    "when every check passed. Writes gpu-check.json, gpu-check.txt and gpu-check-runs.tar.gz\n"
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
    write_report(Path(report["out"]), "gpu-check.txt", text, report, ARCHIVE)
    return 0 if report["passed"] else 1
