"""A stand-in for torch.cuda on a machine without a GPU: the API surface the torch engine uses,
with torch's own argument rules, so every CUDA branch runs in the test suite.

torch's real functions are kept where a CPU build can run them: set_per_process_memory_fraction
is torch's own (its device-index check included: a torch.device("cuda") without an index raises
ValueError), with only the CUDA start-up and the final C call replaced. Device indices go
through torch's own _get_device_index and are checked against the device count, as the CUDA
runtime does ("invalid device ordinal"). `tensors=True` also lets tensors "move" to the fake
GPU: they stay on the CPU, and every host-to-device copy is recorded (from pinned memory or
not, blocking or not), so a whole training step runs and its copies can be inspected.
"""

from __future__ import annotations

import dataclasses
import types

import torch
from torch.cuda._utils import _get_device_index

GB = 10**9


@dataclasses.dataclass
class Copy:
    """One host-to-device copy: its source was pinned, and whether the host waited for it."""

    pinned: bool
    non_blocking: bool


class FakeCuda:
    def __init__(self, monkeypatch, devices: int = 1, total: int = 141 * GB,
                 free: int | None = None, name: str = "NVIDIA H200", tensors: bool = False):
        self.devices, self.name = devices, name
        self.total = [total] * devices
        self.free = [total if free is None else free] * devices
        self.reserved = [0] * devices
        self.current = 0
        self.fractions: dict[int, float] = {}
        self.synchronized = 0
        self.copies: list[Copy] = []
        self.sync_modes: list[str] = []
        cuda = torch.cuda
        for attr, fake in (("is_available", lambda: True), ("device_count", lambda: devices),
                           ("current_device", lambda: self.current),
                           ("set_device", self.set_device), ("mem_get_info", self.mem_get_info),
                           ("memory_reserved", self.memory_reserved),
                           ("synchronize", self.synchronize),
                           ("get_device_name", self.get_device_name),
                           ("get_device_properties", self.get_device_properties),
                           ("max_memory_allocated", lambda device=None: 0),
                           ("set_sync_debug_mode", self.sync_modes.append)):
            monkeypatch.setattr(cuda, attr, fake)
        # torch's own set_per_process_memory_fraction, without starting CUDA
        monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
        monkeypatch.setattr(torch._C, "_cuda_setMemoryFraction", self._set_fraction,
                            raising=False)
        # the engine turns these on; a later test in this process must not inherit them
        self.deterministic: list[bool] = []
        monkeypatch.setattr(torch, "use_deterministic_algorithms", self._deterministic)
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the test's undo
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")  # removes what the engine sets
        if tensors:
            self._fake_tensors(monkeypatch)

    # --- devices ------------------------------------------------------------------------------

    def index(self, device, optional: bool = False) -> int:
        """torch's index rule, then the runtime's range check."""
        if device is None:
            return self.current
        index = _get_device_index(device, optional=optional)
        if not 0 <= index < self.devices:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def set_device(self, device) -> None:
        self.current = self.index(device)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        index = self.index(device, optional=True)
        return self.free[index], self.total[index]

    def memory_reserved(self, device=None) -> int:
        return self.reserved[self.index(device, optional=True)]

    def synchronize(self, device=None) -> None:
        self.index(device, optional=True)
        self.synchronized += 1

    def get_device_name(self, device=None) -> str:
        self.index(device, optional=True)
        return self.name

    def get_device_properties(self, device=None):
        index = self.index(device, optional=True)
        return types.SimpleNamespace(name=self.name, total_memory=self.total[index],
                                     multi_processor_count=132)

    def _set_fraction(self, fraction: float, index: int) -> None:
        self.fractions[self.index(index)] = fraction

    def _deterministic(self, mode: bool, *, warn_only: bool = False) -> None:
        self.deterministic.append(mode)

    # --- tensors on the fake GPU --------------------------------------------------------------

    def _fake_tensors(self, monkeypatch) -> None:
        real_to = torch.Tensor.to

        def pin_memory(tensor, *args, **kwargs):
            pinned = tensor.clone()
            pinned._fake_pinned = True
            return pinned

        def to(tensor, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
                self.index(torch.device(target), optional=True)
                blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
                if tensor.device.type == "cpu" and not getattr(tensor, "_fake_on_gpu", False):
                    self.copies.append(Copy(getattr(tensor, "_fake_pinned", False),
                                            bool(blocking)))
                args = ("cpu", *args[1:]) if args else args
                kwargs = {**kwargs, "device": "cpu"} if "device" in kwargs else kwargs
                moved = real_to(tensor, *args, **kwargs)
                moved._fake_on_gpu = True
                return moved
            return real_to(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "to", to)
