"""One measurement in a fresh process (`python -m qkstudy.bench.step SPEC_JSON`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

from .. import backends
from ..batches import random_batch
from ..config import TrainConfig
from ..forecast import timed

READY = "ready"
ROOT = Path(__file__).resolve().parents[2]  # this checkout


@dataclasses.dataclass(frozen=True)
class Spec:
    config: dict  # TrainConfig fields (backend, device, precision, compile included)
    vocab: int
    warmup: int = 2
    seconds: float = 3.0
    min_steps: int = 3
    overheads: bool = False  # evaluation and probe cost at the config's intervals
    matmul: bool = False  # the backend's matmul peak on the run's device and precision
    sync: bool = False


def measure(spec: Spec, ready=None) -> dict:
    """The measurement, here; `ready`, called after the warm-up, may return a stop time."""
    cfg = TrainConfig(**spec.config).validate()
    backend = backends.load(cfg.backend)
    x, y = random_batch(cfg, spec.vocab, 0)
    probe = random_batch(cfg, spec.vocab, 1)
    # one validation batch: the evaluation's cost is that batch's times eval_batches
    engine = backend.Engine(cfg, spec.vocab, [probe], probe)
    warmup = [timed(lambda: engine.read([engine.step(x, y)])) for _ in range(spec.warmup)]
    steps = max(spec.min_steps, min(100_000, math.ceil(spec.seconds / max(warmup[-1], 1e-6))))
    stop = ready() if ready is not None else None
    started, start, pending, done = time.time(), time.perf_counter(), [], 0
    while done < steps if stop is None else (done < spec.min_steps or time.time() < stop):
        pending.append(engine.step(x, y))
        done += 1
        if len(pending) == cfg.log_every:
            engine.read(pending)
            pending = []
    if pending:
        engine.read(pending)
    seconds = time.perf_counter() - start
    result = {"tokens_per_s": done * cfg.tokens_per_step / seconds, "steps": done,
              "seconds": seconds, "step_s": seconds / done, "warmup_s": warmup,
              "window": [started, started + seconds],
              "framework": engine.framework, "device": engine.device,
              "engine": engine.manifest_extra, "backend": backend.facts(cfg)}
    if spec.overheads:  # evaluation and probe cost per call and as a share of training
        def probe_call() -> None:  # the trainer's own calls
            before = engine.snapshot()
            engine.probes(0)
            engine.update_stats(0, before)

        engine.evaluate()  # compiles
        eval_s = min(timed(engine.evaluate) for _ in range(2)) * cfg.eval_batches
        probe_call()
        probe_s, step_s = min(timed(probe_call) for _ in range(2)), result["step_s"]
        result["overheads"] = {
            "eval_call_s": eval_s, "eval_overhead": eval_s / (cfg.eval_every * step_s),
            "probe_call_s": probe_s, "probe_overhead": probe_s / (cfg.probe_every * step_s),
            "eval_every": cfg.eval_every, "eval_batches": cfg.eval_batches,
            "probe_every": cfg.probe_every}
    if spec.matmul:
        result["matmul_gflops"] = backend.matmul_gflops(cfg)
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB on Linux
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    result["peak_memory_bytes"] = backend.peak_memory_bytes(cfg)
    return result


class StepFailed(RuntimeError):
    """A measurement process failed or ran out of time."""


def measure_together(spec: Spec, processes: int = 1, env: dict[str, str] | None = None,
                     timeout: float | None = None) -> list[dict]:
    """Results of `processes` fresh processes measuring `spec` at once; StepFailed if any fails."""
    spec = dataclasses.replace(spec, sync=processes > 1)
    deadline = None if timeout is None else time.monotonic() + timeout
    environment = checkout_env(env)
    if processes > 1:
        environment.setdefault(backends.RUNS_PER_DEVICE, str(processes))
    procs, errs = [], []
    try:
        for i in range(processes):
            errs.append(tempfile.TemporaryFile("w+"))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "qkstudy.bench.step", json.dumps(dataclasses.asdict(spec))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errs[-1], text=True,
                env={**environment, backends.DEVICE_SLOT: str(i)}))
        if spec.sync:
            for p, err in zip(procs, errs):
                _wait_for_ready(p, err, deadline)
            # all warmed up: each times from one start (0.5 s on, for a process scheduled late)
            start = time.time() + 0.5
            for p in procs:
                p.stdin.write(f"go {start!r} {start + spec.seconds!r}\n")
                p.stdin.flush()
        results = []
        for p, err in zip(procs, errs):
            try:
                out, _ = p.communicate(timeout=_left(deadline))
            except subprocess.TimeoutExpired:
                raise StepFailed(f"not done within {timeout:.0f} s") from None
            if p.returncode != 0:
                raise StepFailed(_failure(p.returncode, err))
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for err in errs:
            err.close()


def checkout_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ with `extra`, this checkout first on PYTHONPATH wherever the caller runs from."""
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.1, deadline - time.monotonic())


def _wait_for_ready(p: subprocess.Popen, err, deadline: float | None) -> None:
    """Read the process's stdout up to its `ready` line (in a thread, for the deadline)."""
    seen: list[str] = []

    def read() -> None:
        for line in p.stdout:
            if line.strip() == READY:
                seen.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(_left(deadline))
    if not seen:
        if reader.is_alive():
            raise StepFailed("not warmed up in time")
        p.wait()
        raise StepFailed(_failure(p.returncode, err))


def _failure(returncode: int | None, err) -> str:
    err.seek(0)
    lines = [line for line in err.read().strip().splitlines() if line.strip()]
    return f"exit status {returncode}: {lines[-1] if lines else 'no message'}"


def ready(stdin: TextIO | None = None) -> float | None:
    """Say READY, wait for "go START_TIME STOP_TIME" on stdin, sleep until START_TIME and return
    STOP_TIME; None (time by step count) when stdin ends first or the line is short."""
    print(READY, flush=True)
    words = (stdin or sys.stdin).readline().split()
    if len(words) < 3:
        return None
    time.sleep(max(0.0, float(words[1]) - time.time()))
    return float(words[2])


def main(argv: list[str]) -> int:
    spec = Spec(**json.loads(argv[0]))
    result = measure(spec, ready if spec.sync else None)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
