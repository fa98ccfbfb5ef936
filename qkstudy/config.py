"""Run configuration: one frozen dataclass, parsed from key=value."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import platform
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import numpy as np

from .errors import UsageError
from .files import load_object
from .variants import CHOICES

FLOAT32_MAX = float(np.finfo(np.float32).max)
# Wortsman et al. 2023 (sec. 3.2.2): independent weight decay of 1e-4
INDEPENDENT_WD_DEFAULT = 1e-4
# keys a config.json may hold besides TrainConfig's fields; reading it ignores them
CONFIG_FILE_EXTRAS = ("run_id", "framework", "kernels")
BACKENDS = ("mlx", "torch")
# config.json keys that do not place a run in the study: runs differing only in them are twins
FOLDER_KEYS = ("run_id", "framework", "runs_dir", "sweep", "refine")
ENGINE_KEYS = ("backend", "device", "precision", "compile", "deterministic")


def framework_label(framework: str, precision: object = None) -> str:
    return framework + (f"-{precision}" if precision not in (None, "fp32") else "")

NORM_EPS = 1e-5  # every LayerNorm and QK-norm of both models

AUTO_BACKEND_ENV = "QKSTUDY_BACKEND"
TORCH_OPTIONS = {"device": "auto", "precision": "fp32", "compile": False, "deterministic": True}


def auto_backend(torch_options: bool = False) -> tuple[str, str]:
    """(the engine backend=auto picks here, why); QKSTUDY_BACKEND=mlx|torch forces one."""
    forced = os.environ.get(AUTO_BACKEND_ENV, "")
    if forced:
        if forced not in BACKENDS:
            raise UsageError(f"{AUTO_BACKEND_ENV}={forced!r} is not one of {', '.join(BACKENDS)}")
        return forced, f"{AUTO_BACKEND_ENV}={forced}"
    installed = {b: importlib.util.find_spec(b) is not None for b in BACKENDS}
    if torch_options:
        return "torch", "a PyTorch option (device, precision, compile, deterministic) is set"
    if sys.platform == "darwin" and platform.machine() == "arm64" and installed["mlx"]:
        return "mlx", "Apple Silicon: MLX on its GPU"
    if installed["torch"]:
        return "torch", ("not Apple Silicon: PyTorch, on a CUDA GPU when one is visible, else on "
                         "the CPU, where it is the faster engine (docs/performance.md)")
    if installed["mlx"]:
        return "mlx", "PyTorch is not installed"
    return "torch", "neither MLX nor PyTorch is installed"

# the least value of each setting (grad_clip=0 disables clipping)
AT_LEAST = {"depth": 1, "d_model": 1, "n_heads": 1, "block_size": 2, "batch_size": 1,
            "warmup_steps": 0, "weight_decay": 0, "grad_clip": 0, "budget_tokens": 0,
            "divergence_window": 1, "eval_batches": 1, "eval_every": 1, "probe_every": 1,
            "log_every": 1, "ckpt_every": 1, "seed": 0, "data_seed": 0}


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


QKNorm = Literal[CHOICES]  # qkstudy/variants.py's rows


@dataclass(frozen=True)
class TrainConfig:
    # data: a folder written by `python -m qkstudy prepare`
    data: str = "data/synthetic-bytes"
    # model (plain nanoGPT)
    depth: int = 4
    d_model: int = 128
    n_heads: int = 4
    block_size: int = 128
    bias: bool = False
    qk_norm: QKNorm = "none"  # the study's independent variable
    # rival logit controls, each off (0) by default, so the core study stays QK-norm alone:
    # attention logits (after the 1/sqrt(head_dim) scale) become C*tanh(logit/C) (Gemma 2)
    attn_softcap: float = 0.0
    # the objective adds W * mean(logsumexp(output logits)^2) (PaLM); logged losses stay the CE
    z_loss: float = 0.0
    # the engine: auto (MLX on Apple Silicon, else PyTorch; a run records the one it got), mlx
    # (mlx_gpt/) or torch (torch_ref/). device, precision and compile are torch's:
    # auto picks cuda, else mps, else cpu; tf32 and bf16 (autocast, float32 master weights) are
    # CUDA's faster matmuls; compile wraps the step in torch.compile (same maths)
    backend: Literal["auto", "mlx", "torch"] = "auto"
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    compile: bool = False
    # torch: deterministic algorithms and cuBLAS's fixed workspace, CUDA's repeatable kernels
    # (false lets CUDA pick faster non-deterministic ones; docs/torch_ref.md#determinism)
    deterministic: bool = True
    # the initial weights' scheme (qkstudy/parameters.py, the same in both backends), named in
    # every run's identity
    init: Literal["numpy"] = "numpy"
    # optimisation: AdamW, warmup + cosine, clipping; standard parametrisation
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    independent_wd: bool = False  # Wortsman et al. 2023: decay not scaled by lr
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    batch_size: int = 16
    max_steps: int = 1000
    budget_tokens: int = 0  # > 0 overrides max_steps: steps = budget_tokens // (batch * block)
    # seeds: model init and batch order are separate so one data_seed pairs every arm and lr
    seed: int = 0
    data_seed: int = 0
    # evaluation, probes, divergence
    eval_every: int = 200
    eval_batches: int = 8
    probe_every: int = 200
    # diverged: loss or grad norm non-finite, or after warmup the median training loss of the
    # last divergence_window steps is above init_loss + divergence_margin (a sustained excursion)
    divergence_margin: float = 1.0
    divergence_window: int = 50
    spike_margin: float = 1.0  # a loss spike: train loss > its running minimum + spike_margin
    # logging and checkpoints (steps)
    log_every: int = 10
    ckpt_every: int = 500
    # where the run folder goes: <runs_dir>/<sweep>/<run_id>
    runs_dir: str = "runs"
    sweep: str = "adhoc"

    def __post_init__(self) -> None:  # a run id names its engine, never "auto"
        if self.backend == "auto":
            object.__setattr__(self, "backend", auto_backend(any(
                getattr(self, k) != v for k, v in TORCH_OPTIONS.items()))[0])

    @property
    def steps(self) -> int:
        if self.budget_tokens > 0:
            return max(1, self.budget_tokens // (self.batch_size * self.block_size))
        return self.max_steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> TrainConfig:
        for name, low in AT_LEAST.items():
            value = getattr(self, name)
            _need(value >= low, f"{name} must be >= {low}, got {value}")
        _need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _need(self.d_model % self.n_heads == 0,
              f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        _need(self.steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        _need(0 <= self.min_lr_ratio <= 1,
              f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _need(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
        _need(self.eps > 0 and float(np.float32(self.eps)) > 0,
              f"eps must be > 0 in float32, got {self.eps}")
        _need(not self.independent_wd or self.weight_decay < 1e-2,
              f"independent_wd=true needs weight_decay < 1e-2 (got {self.weight_decay:g}: the "
              f"decay is not scaled by the LR, so it would shrink weights by that share every "
              f"step); leave weight_decay out for the default {INDEPENDENT_WD_DEFAULT:g}")
        for name in ("divergence_margin", "spike_margin"):
            _need(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("attn_softcap", "z_loss"):
            value = getattr(self, name)
            _need(math.isfinite(value) and value >= 0,
                  f"{name} must be a finite number >= 0 (0 is off), got {value}")
        _need(self.ckpt_every % self.log_every == 0,
              f"ckpt_every={self.ckpt_every} must be a multiple of log_every={self.log_every}")
        _need("/" not in self.sweep and self.sweep not in ("", ".", ".."),
              f"sweep must be a plain folder name, got {self.sweep!r}")
        _need(self.backend == "torch" or all(getattr(self, k) == v for k, v in TORCH_OPTIONS.items()),
              "device, precision, compile and deterministic are options of backend=torch; MLX "
              "picks its own device and computes in float32")
        hints = typing.get_type_hints(type(self))
        for f in fields(self):  # the step computes in float32
            value = getattr(self, f.name)
            if hints[f.name] in (float, int) and not (
                    isinstance(value, (int, float)) and abs(value) <= FLOAT32_MAX):
                raise UsageError(f"{f.name} must be a finite number of at most "
                                 f"{FLOAT32_MAX:.3g} in size, got {value}")
        return self

    # keys left out of the run id: where a run is written and how its step is executed, not
    # what it computes
    NOT_IN_RUN_ID = ("runs_dir", "sweep", "compile", "deterministic")
    # keys added later, left out of the identity at the value earlier runs had
    LEGACY = {"attn_softcap": 0.0, "z_loss": 0.0, "backend": "mlx", "precision": "fp32"}

    def identity(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in self.NOT_IN_RUN_ID
                and not (k in self.LEGACY and v == self.LEGACY[k])
                and not (k == "device" and self.backend == "mlx")}

    @property
    def run_id(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True)
        tag = f"d{self.depth}-{'qk' + self.qk_norm if self.qk_norm != 'none' else 'noqk'}"
        tag += f"-softcap{short_number(self.attn_softcap)}" if self.attn_softcap else ""
        tag += f"-zloss{short_number(self.z_loss)}" if self.z_loss else ""
        tag += f"-torch{'' if self.precision == 'fp32' else '-' + self.precision}" if (
            self.backend == "torch") else ""
        return f"{tag}-lr{self.lr:.3g}-s{self.seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    depth: int = 4
    d_model: int = 128
    n_heads: int = 4
    block_size: int = 128
    bias: bool = False
    qk_norm: str = "none"  # none or a qkstudy/variants.py entry
    attn_softcap: float = 0.0  # > 0: scaled attention logits become C*tanh(logit/C)
    z_loss: float = 0.0  # > 0: GPT.loss adds z_loss * mean(logsumexp(logits)^2)

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // 64) * 64  # a multiple of 64 keeps the head matmul aligned


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    return ModelArgs(vocab_size, **{f.name: getattr(cfg, f.name) for f in fields(ModelArgs)[1:]})


def short_number(x: float) -> str:
    """50 -> '50', 2.5 -> '2.5', 3e-05 -> '3e-5': 6 significant digits, no exponent padding."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    exponent = math.floor(math.log10(abs(x)))
    if -3 <= exponent < 5:
        return f"{x:.6g}"
    return f"{float(f'{x / 10 ** exponent:.6g}'):g}e{exponent}"


def _coerce(name: str, hint: Any, text: str) -> Any:
    origin = get_origin(hint)
    if origin is Literal:
        _need(text in get_args(hint), f"{name} must be one of {', '.join(get_args(hint))}; "
                                      f"got {text!r}")
        return text
    if origin in (typing.Union, types.UnionType):
        return _coerce(name, next(a for a in get_args(hint) if a is not type(None)), text)
    if hint is bool:
        low = text.lower()
        _need(low in ("1", "true", "yes", "on", "0", "false", "no", "off"),
              f"{name} must be true or false; got {text!r}")
        return low in ("1", "true", "yes", "on")
    if hint is int:
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            raise UsageError(f"{name} must be an integer; got {text!r}") from None
        _need(math.isfinite(value) and float(value) == int(value),
              f"{name} must be an integer; got {text!r}")
        return int(value)
    if hint is float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{name} must be a number; got {text!r}") from None
        return value  # finiteness and range: each config's validate()
    return text


def split_flags(argv: list[str], known: Sequence[str], shown: str = "") -> tuple[list[str],
                                                                               dict[str, str]]:
    """(the other words, {flag: its value after '=', or ''}); UsageError for an unknown flag."""
    flags = {}
    for word in argv:
        name, _, value = word.partition("=")
        if word.startswith("--") and name not in known:
            raise UsageError(f"unknown flag {word}; flags: {shown or ', '.join(known)}")
        if word.startswith("--"):
            flags[name] = value
    return [w for w in argv if not w.startswith("--")], flags


def split_key_values(words: list[str]) -> dict[str, str]:
    """Every command's key=value parser: ['lr=1e-3'] -> {'lr': '1e-3'}."""
    out: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {word!r}")
        key = key.strip().replace("-", "_")
        if key in out:
            raise UsageError(f"{key} is given twice ({key}={out[key]} and {key}={value.strip()})")
        out[key] = value.strip()
    return out


def take(pairs: dict[str, str], key: str, hint: Any, default: Any = None) -> Any:
    return _coerce(key, hint, pairs.pop(key)) if key in pairs else default


def apply_overrides(base: Any, overrides: dict[str, str]) -> Any:
    hints = typing.get_type_hints(type(base))
    names = {f.name for f in fields(base)}
    changes = {}
    for key, text in overrides.items():
        if key not in names:
            raise UsageError(f"unknown key {key!r}; known keys: {', '.join(sorted(names))}")
        changes[key] = _coerce(key, hints[key], text)
    if changes.get("independent_wd") and "weight_decay" not in changes and hasattr(
            base, "weight_decay"):
        changes["weight_decay"] = INDEPENDENT_WD_DEFAULT
    return dataclasses.replace(base, **changes)


def parse_train_config(words: list[str], base: TrainConfig | None = None) -> TrainConfig:
    return apply_overrides(base or TrainConfig(), split_key_values(words)).validate()


def _value_ok(hint: Any, value: Any) -> bool:
    if get_origin(hint) is Literal:
        return value in get_args(hint)
    if hint is bool or hint is str:
        return isinstance(value, hint)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def load_config(path: str) -> TrainConfig:
    raw, why = load_object(Path(path))
    if why:
        raise UsageError(f"{path} {why}")
    hints = typing.get_type_hints(TrainConfig)
    if "backend" not in raw:  # written before the backends: an MLX run
        raw = {k: v for k, v in raw.items() if k != "device"}
    if raw.get("backend") == "auto":
        raise UsageError(f"{path}: backend is 'auto', but a run records the engine it trained on "
                         "(mlx or torch): set the one it used")
    raw = {**TrainConfig.LEGACY, **raw}
    unknown = sorted(raw.keys() - hints.keys() - set(CONFIG_FILE_EXTRAS))
    if unknown:
        raise UsageError(f"{path} has unknown keys {', '.join(unknown)} (written by another "
                         "version of this tool?)")
    wrong = [k for k in hints.keys() & raw.keys() if not _value_ok(hints[k], raw[k])]
    if wrong:
        raise UsageError(f"{path}: {wrong[0]}={raw[wrong[0]]!r} is not a valid value")
    cfg = TrainConfig(**{k: raw[k] for k in hints.keys() & raw.keys()})
    try:
        return cfg.validate()
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None
