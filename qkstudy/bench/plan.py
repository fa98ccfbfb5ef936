"""What `python -m qkstudy bench` measures: its keys, the variants per shape, and the checks."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import platform
import sys
from pathlib import Path

from ..errors import UsageError
from .shapes import preset_shape

BACKENDS = ("mlx", "torch")
LABEL = {"mlx": "MLX", "torch": "PyTorch"}
BUILDS = ("plain", "native")  # MLX_GPT_CPU_JIT: MLX's own CPU kernel build, and -march=native
BUILD_LABEL = {"plain": "plain", "native": "tuned"}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    shapes: str = "demo,mini,study"  # preset shapes measured with every backend; none
    backends: str = "mlx,torch"
    rounds: int = 3  # every measurement once per round; medians and ranges over rounds
    warmup: int = 2  # untimed steps per measurement (compilation, first allocations)
    seconds: float = 3.0  # timed steps per measurement: enough for about this long ...
    min_steps: int = 3  # ... and at least this many
    cpu_shapes: str = "demo,mini"  # also K processes at once and MLX's two CPU builds; none
    parallel: int = 2  # K; 1 leaves that comparison out
    builds: bool = True  # MLX's plain against its tuned CPU build (Linux x86-64 only)
    probes: bool = True  # evaluation and probe cost (round 1)
    quick: bool = False  # the demo shape, one round, one second a measurement: a smoke test
    out: str = "reports"

    def resolved(self) -> BenchConfig:
        if not self.quick:
            return self
        return dataclasses.replace(self, shapes="demo", cpu_shapes="demo", rounds=1,
                                   seconds=min(self.seconds, 1.0))


@dataclasses.dataclass(frozen=True)
class Variant:
    """One engine setting: backend, MLX CPU build, processes at once."""

    backend: str
    build: str | None  # mlx: plain | native; torch: None
    processes: int

    @property
    def key(self) -> str:
        return "-".join([self.backend, *([self.build] if self.build else []),
                         str(self.processes)])

    @property
    def engine(self) -> str:
        return LABEL[self.backend] + (f" {BUILD_LABEL[self.build]}" if self.build else "")

    def env(self) -> dict[str, str]:
        return {"MLX_GPT_CPU_JIT": self.build} if self.build else {}


def tuned_build_supported() -> bool:
    """Where MLX builds its CPU kernels with g++ (mlx_gpt/cpu_jit.py's supported())."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def names_of(text: str, key: str, known: tuple[str, ...] | None = None) -> list[str]:
    """Comma-separated names; `none` is the empty list."""
    if text.strip() == "none":
        return []
    names = [s.strip() for s in text.split(",")]
    if not all(names):
        raise UsageError(f"{key} has an empty name ({text!r})")
    if len(set(names)) != len(names):
        raise UsageError(f"{key} names one twice ({text!r})")
    for name in names:
        if known is not None and name not in known:
            raise UsageError(f"unknown {key[:-1]} {name!r} in {key}; known: {', '.join(known)}")
    return names


@dataclasses.dataclass(frozen=True)
class Plan:
    shapes: list[str]  # every shape measured, in order
    cpu_shapes: list[str]
    backends: list[str]
    builds: list[str]

    def variants(self, name: str, parallel: int) -> list[Variant]:
        """The engines measured at shape `name`, in round order: by process count, backend, build."""
        extra = name in self.cpu_shapes
        counts = (1, parallel) if extra and parallel > 1 else (1,)
        out = []
        for n in counts:
            for backend in self.backends:
                builds = (self.builds if extra else ["plain"]) if backend == "mlx" else [None]
                out += [Variant(backend, build, n) for build in builds]
        return out


def validate(bench: BenchConfig) -> Plan:
    """Every check that can fail, before anything is measured."""
    for ok, message in [
            (bench.rounds >= 1, f"rounds must be >= 1, got {bench.rounds}"),
            (bench.warmup >= 1, f"warmup must be >= 1 (it also sizes the timed steps), got "
                                f"{bench.warmup}"),
            (math.isfinite(bench.seconds) and bench.seconds > 0,
             f"seconds must be a number > 0, got {bench.seconds}"),
            (bench.min_steps >= 1, f"min_steps must be >= 1, got {bench.min_steps}"),
            (bench.parallel >= 1, f"parallel must be >= 1 (1 leaves the comparison out), got "
                                  f"{bench.parallel}")]:
        if not ok:
            raise UsageError(message)
    shapes = names_of(bench.shapes, "shapes")
    cpu_shapes = names_of(bench.cpu_shapes, "cpu_shapes")
    for name in shapes + cpu_shapes:
        preset_shape(name)  # the shapes are the presets: UsageError naming them
    if not shapes and not cpu_shapes:
        raise UsageError("nothing to measure: shapes and cpu_shapes are both none")
    backends = names_of(bench.backends, "backends", BACKENDS)
    if not backends:
        raise UsageError("backends needs at least one of mlx, torch")
    missing = [b for b in backends if importlib.util.find_spec(b) is None]
    if missing == backends:
        raise UsageError(f"{' and '.join(missing)} not installed: nothing to measure with; "
                         + " or ".join(f"pip install -e '.[{b}]'" for b in missing))
    for b in missing:
        print(f"warning: {b} is not installed here; measuring "
              f"{', '.join(x for x in backends if x not in missing)} only", file=sys.stderr)
    out = Path(bench.out)
    try:  # the report's folder, made and written to once before anything is measured
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".bench-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    builds = list(BUILDS) if bench.builds and tuned_build_supported() else ["plain"]
    return Plan(shapes + [s for s in cpu_shapes if s not in shapes], cpu_shapes,
                [b for b in backends if b not in missing], builds)
