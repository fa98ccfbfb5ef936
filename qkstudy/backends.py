"""The one seam between the core and an engine: how a backend is found and what it must provide.

`backend=mlx|torch` names a module (BACKENDS) whose contract, the `Backend` protocol below, is
checked when it is loaded: the run's Engine (the train step, which the sweep's plan and the
benchmarks time too), a preflight (the checks that need the framework, before anything is
written), where a run trains and the bench step's facts. mlx_gpt/backend.py and
torch_ref/backend.py are the two sides of it.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np

from . import denormals, interrupts
from .config import TrainConfig
from .errors import UsageError

Batch = tuple[np.ndarray, np.ndarray]

# backend -> (its module, what to install when its framework is missing)
BACKENDS = {"mlx": ("mlx_gpt.backend", "MLX is not installed: pip install -e '.[mlx]' (Apple "
                                       "Silicon or Linux); or run with backend=torch"),
            "torch": ("torch_ref.backend", "PyTorch is not installed: pip install -e '.[torch]' "
                                           "(or ./setup.sh torch on a GPU machine)")}


class Engine(Protocol):
    """One run's model, optimizer and step, built as `Engine(cfg, vocab_size, val_batches,
    probe_batch)`; the trainer (qkstudy/trainer.py) drives it."""

    framework: str  # "mlx" | "torch"
    device: str  # described, e.g. "cpu" or "cuda (NVIDIA H200)"
    manifest_extra: dict  # backend facts for manifest.json (threads, precision, BLAS, ...)
    warmup_note: str  # what the first step does (compiling), shown before it
    params: dict[str, int]  # total, embedding, non_embedding

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]: ...
    def state_arrays(self) -> dict[str, np.ndarray]: ...
    def load_state(self, arrays: dict[str, np.ndarray]) -> None: ...
    def step(self, x: np.ndarray, y: np.ndarray) -> Any: ...  # dispatched, not yet read
    def read(self, pending: list[Any]) -> list[tuple[float, float, float, float]]: ...
    def evaluate(self) -> float: ...
    def probes(self, step: int) -> list[dict]: ...
    def snapshot(self) -> Any: ...
    def update_stats(self, step: int, before: Any) -> list[dict]: ...
    def weights(self) -> dict[str, np.ndarray]: ...


class Backend(Protocol):
    """What a backend's module provides."""

    Engine: type  # the train step: Engine(cfg, vocab_size, val, probe) -> an Engine

    def preflight(self, cfg: TrainConfig) -> None:
        """UsageError when `cfg` cannot run here (device, precision, toolchain)."""

    def device(self, cfg: TrainConfig) -> str:
        """Where a run of `cfg` trains, described ("cpu", "gpu", "cuda (NVIDIA H200)")."""

    def facts(self, cfg: TrainConfig) -> dict:
        """The bench's record of the framework: version, device, BLAS or threads."""

    def matmul_gflops(self, cfg: TrainConfig) -> float:
        """The framework's matmul peak on the run's device, in the run's precision."""

    def peak_memory_bytes(self, cfg: TrainConfig) -> int | None:
        """The framework's peak allocation so far in this process (None: not known)."""

    def memory_limit(self, cfg: TrainConfig, runs: int | None = None) -> tuple[int, str] | None:
        """(bytes, the words for them) a run may use on its device when that is not the
        machine's memory (a GPU's share with `runs` processes on the GPUs); None otherwise."""


CONTRACT = ("Engine", "preflight", "device", "facts", "matmul_gflops",
            "peak_memory_bytes", "memory_limit")


def load(backend: str) -> Backend:
    """The backend's module, its contract checked; UsageError saying what to install when its
    framework is missing. Sets flush-to-zero first (qkstudy/denormals.py), before the framework
    starts the threads that inherit it."""
    name, hint = BACKENDS[backend]
    denormals.flush()
    try:
        # a signal while a framework's C extension initialises is held until the import is
        # done: interrupted there, the extension aborts the process
        with interrupts.Deferred():
            module = importlib.import_module(name)
    except ImportError as e:  # the framework itself missing, not a failure inside the engine
        if (e.name or "").split(".")[0] in ("mlx", "torch"):
            raise UsageError(hint) from None
        raise
    missing = [n for n in CONTRACT if not hasattr(module, n)]
    if missing:
        raise TypeError(f"{name} does not provide {', '.join(missing)} (qkstudy/backends.py)")
    return module
