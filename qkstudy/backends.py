"""The seam between core and engine: `backend=mlx|torch` names a module (Backend protocol)."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np

from . import denormals, interrupts
from .config import TrainConfig
from .errors import UsageError

# backend -> (its module, what to install when its framework is missing)
BACKENDS = {"mlx": ("mlx_gpt.backend", "MLX is not installed: pip install -e '.[mlx]' (Apple "
                                       "Silicon or Linux); or run with backend=torch"),
            "torch": ("torch_ref.backend", "PyTorch is not installed: pip install -e '.[torch]' "
                                           "(or ./setup.sh torch on a GPU machine)")}

# K when K runs share one device (a sweep's jobs=K): a torch engine then takes 1/K of the CPU's
# threads, or caps its memory at 1/K of the GPU
RUNS_PER_DEVICE = "QKSTUDY_RUNS_PER_DEVICE"
# i of the K processes (0..K-1): a torch engine on N GPUs trains on cuda:(i mod N)
DEVICE_SLOT = "QKSTUDY_DEVICE_SLOT"


class Engine(Protocol):
    """One run's model, optimizer and step: `Engine(cfg, vocab_size, val_batches, probe_batch)`."""

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
    Engine: type  # the train step: Engine(cfg, vocab_size, val, probe) -> an Engine

    def preflight(self, cfg: TrainConfig) -> None: ...  # UsageError when cfg cannot run here
    def device(self, cfg: TrainConfig) -> str: ...  # "cpu", "gpu", "cuda (NVIDIA H200)"
    def facts(self, cfg: TrainConfig) -> dict: ...  # the bench's record: version, device, BLAS
    def matmul_gflops(self, cfg: TrainConfig) -> float: ...  # on the run's device and precision
    def peak_memory_bytes(self, cfg: TrainConfig) -> int | None: ...  # so far in this process
    # (bytes, words) a run may use when not the machine's memory: its share of a GPU, else None
    def memory_limit(self, cfg: TrainConfig, runs: int | None = None) -> tuple[int, str] | None:
        ...


CONTRACT = ("Engine", *(name for name in vars(Backend) if not name.startswith("_")))


def load(backend: str) -> Backend:
    """The backend's module, its contract checked; flush-to-zero set before its threads start."""
    name, hint = BACKENDS[backend]
    denormals.flush()
    try:
        # a signal is held until the import is done: interrupted, a C extension aborts
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


def device_memory(cfg: TrainConfig, runs: int | None = None) -> tuple[int, str] | None:
    """(bytes, words) a run of `cfg` may use on its device (backend.memory_limit), or None when
    that is the machine's memory or the backend is not installed."""
    try:
        return load(cfg.backend).memory_limit(cfg, runs)
    except UsageError:
        return None
