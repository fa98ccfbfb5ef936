"""MLX vs PyTorch, numerically: `python -m crosscheck parity` (docs/torch_ref.md)."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# torch first, then mlx_gpt, then mlx: torch_ref/__init__.py and mlx_gpt/__init__.py say why
import torch_ref  # noqa: F401
import mlx_gpt  # noqa: F401
import mlx.core as mx
import torch
from mlx import nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_gpt.engine import Engine as MlxEngine
from mlx_gpt.model import GPT as MlxGPT
from qkstudy.batches import probe_batch, train_batch
from qkstudy.progress import table
from qkstudy.config import TrainConfig
from qkstudy.data import synthetic
from qkstudy.data.tokenizer import ByteTokenizer
from qkstudy.errors import UsageError
from qkstudy.variants import CHOICES
from torch_ref.engine import Engine as TorchEngine
from torch_ref.model import GPT as TorchGPT

LOGITS_RTOL = 1e-5
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
PROBE_RTOL = 1e-4
TRAJECTORY_RTOL = 1e-4
# probes both must report for every layer; any other shared name is compared too
REQUIRED_PROBES = ("max_attention_logit", "attention_entropy_mean")

ARMS = tuple({"qk_norm": q} for q in CHOICES)
# far from the study's cap 50 and weight 1e-4, so that both change these small models' numbers
RIVALS = ({"attn_softcap": 5.0}, {"z_loss": 1e-2})
DEPTHS = (1, 3)
# lr below the loss-spike regime (from 2e-3 a spike amplifies float32 rounding to 1e-2 and more);
# clip 2.0 clips 12 of the 50 steps
BASE = TrainConfig(depth=1, d_model=64, n_heads=4, block_size=64, batch_size=4, lr=1e-3,
                   warmup_steps=10, max_steps=50, weight_decay=0.1, grad_clip=2.0,
                   seed=0, data_seed=0)


@dataclass(frozen=True)
class Deviation:
    case: str
    quantity: str
    where: str
    value: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.value) and self.value <= self.tolerance


def relative(a: np.ndarray | float, b: np.ndarray | float) -> float:
    """max|a - b| / max|b| (b the reference); 0 when both are all zero."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.max(np.abs(b)) if b.size else 0.0
    diff = np.max(np.abs(a - b)) if b.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return float(diff / scale)


def worst(case: str, quantity: str, pairs: Iterable[tuple], tolerance: float) -> Deviation:
    where, value = max(pairs, key=lambda kv: (not math.isfinite(kv[1]), kv[1]))
    return Deviation(case, quantity, where, value, tolerance)


def byte_tokens(n_chars: int = 60_000, seed: int = 0) -> np.ndarray:
    """Synthetic stories as byte tokens, each story preceded by end-of-text (as `prepare`)."""
    ids: list[int] = []
    for story in synthetic.generate_text(n_chars, seed):
        ids += [ByteTokenizer.eot, *story.encode("utf-8")]
    return np.array(ids, dtype=np.uint16)


def perturb(model: MlxGPT, seed: int) -> None:
    """Weights far from init (sharp attention, gains != 1, biases != 0), so nothing is trivial."""
    params = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = []
    for (name, p), key in zip(params, keys):
        noise = mx.random.normal(p.shape, key=key)
        if p.ndim == 2:
            new.append((name, noise / math.sqrt(p.shape[1])))  # unit-variance activations
        else:
            new.append((name, 0.1 * noise if name.endswith(".bias") else 1.0 + 0.2 * noise))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def case_name(cfg: TrainConfig) -> str:
    extras = "".join(f" {k}={getattr(cfg, k):g}" if isinstance(getattr(cfg, k), float)
                     else f" {k}={getattr(cfg, k)}"
                     for k in ("bias", "independent_wd", "attn_softcap", "z_loss")
                     if getattr(cfg, k) != getattr(BASE, k))
    return f"d{cfg.depth} {cfg.qk_norm}{extras}"


def mlx_forward(model: MlxGPT, x: np.ndarray, y: np.ndarray) -> tuple:
    """(logits, [objective, loss, z], gradients) of one batch."""
    def objective(m: MlxGPT, a: mx.array, b: mx.array):
        logits = m(a)
        return (*m.loss(logits, b), logits)

    (*terms, logits), grads = nn.value_and_grad(model, objective)(model, mx.array(x), mx.array(y))
    return np.array(logits), [t.item() for t in terms], {
        k: np.array(v) for k, v in tree_flatten(grads)}


def torch_forward(model: TorchGPT, x: np.ndarray, y: np.ndarray) -> tuple:
    named = dict(model.named_parameters())
    logits = model(torch.from_numpy(x.astype(np.int64)))
    terms = model.loss(logits, torch.from_numpy(y.astype(np.int64)))
    grads = torch.autograd.grad(terms[0], list(named.values()))
    return logits.detach().numpy(), [t.item() for t in terms], {
        k: g.numpy() for k, g in zip(named, grads)}


def engine_step(engine, forward, x: np.ndarray, y: np.ndarray) -> tuple:
    """One training step as training takes it, through the engine's own probes, step and
    update statistics: (logits, terms, gradients, probe rows, the step's (loss, grad norm,
    lr, z), the weights after it)."""
    logits, terms, grads = forward(engine.model, x, y)
    rows = engine.probes(0)
    before = engine.snapshot()
    (read,) = engine.read([engine.step(x, y)])
    rows += engine.update_stats(0, before)
    return logits, terms, grads, rows, read, engine.weights()


def torch_config(cfg: TrainConfig) -> TrainConfig:
    return dataclasses.replace(cfg, backend="torch", device="cpu")


def compare_step(cfg: TrainConfig, tokens: np.ndarray, vocab_size: int) -> list[Deviation]:
    case = case_name(cfg)
    x, y = train_batch(tokens, cfg.data_seed, 0, cfg.batch_size, cfg.block_size)
    probe = probe_batch(tokens, cfg.data_seed, cfg.batch_size, cfg.block_size)
    mlx_side = MlxEngine(cfg, vocab_size, [], probe)
    perturb(mlx_side.model, cfg.seed + 1)
    torch_side = TorchEngine(torch_config(cfg), vocab_size, [], probe)
    torch_side.model.load_state_dict({k: torch.from_numpy(v)
                                      for k, v in mlx_side.weights().items()})
    m_logits, (_, m_loss, m_z), m_grads, m_rows, m_step, m_after = engine_step(
        mlx_side, mlx_forward, x, y)
    t_logits, (_, t_loss, t_z), t_grads, t_rows, t_step, t_after = engine_step(
        torch_side, torch_forward, x, y)
    if t_grads.keys() != m_grads.keys():
        raise AssertionError(f"gradient names differ: {sorted(t_grads.keys() ^ m_grads.keys())}")
    probes = probe_pairs(m_rows, t_rows, cfg.depth)
    unported = sorted({r["name"] for r in m_rows} - {r["name"] for r in t_rows})
    z_term = [Deviation(case, "z-loss term", f"{m_z:.6f}", relative(t_z, m_z), LOSS_RTOL)
              ] if cfg.z_loss else []
    step = zip(("loss", "grad norm", "lr"), t_step, m_step)
    return [
        Deviation(case, "logits", f"{m_logits.shape}", relative(t_logits, m_logits), LOGITS_RTOL),
        Deviation(case, "loss", f"{m_loss:.6f}", relative(t_loss, m_loss), LOSS_RTOL), *z_term,
        worst(case, "gradients", ((k, relative(t_grads[k], m_grads[k])) for k in m_grads),
              GRAD_RTOL),
        worst(case, f"probes ({len(probes)} values)", probes, PROBE_RTOL),
        Deviation(case, "probe names missing in torch_ref", ", ".join(unported) or "-",
                  float(len(unported)), 0.0),
        worst(case, "Engine.step", ((k, relative(t, m)) for k, t, m in step), GRAD_RTOL),
        worst(case, "weights after the step", ((k, relative(t_after[k], m_after[k]))
                                               for k in m_after), GRAD_RTOL),
    ]


def probe_pairs(mlx_rows: list[dict], torch_rows: list[dict], depth: int) -> list[tuple]:
    """(layer/name, relative deviation) of every probe (and head) both frameworks report."""
    def values(rows: list[dict]) -> dict[tuple, float]:
        return {(r["layer"], -1 if r["head"] is None else r["head"], r["name"]): r["value"]
                for r in rows}

    mlx_values, torch_values = values(mlx_rows), values(torch_rows)
    for layer in range(depth):
        for name in REQUIRED_PROBES:
            for engine, got in (("mlx_gpt", mlx_values), ("torch_ref", torch_values)):
                if (layer, -1, name) not in got:
                    raise AssertionError(f"probe {name} of layer {layer} is missing from {engine}")
    return [(f"L{layer}{'' if head < 0 else f' head {head}'} {name}",
             relative(torch_values[(layer, head, name)], mlx_values[(layer, head, name)]))
            for layer, head, name in sorted(mlx_values.keys() & torch_values.keys())]


def trajectory(engine_class, cfg: TrainConfig, tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    batches = [train_batch(tokens, cfg.data_seed, step, cfg.batch_size, cfg.block_size)
               for step in range(cfg.steps)]
    engine = engine_class(cfg, vocab_size, [], batches[0])
    return np.array(engine.read([engine.step(x, y) for x, y in batches]))


def compare_trajectory(cfg: TrainConfig, tokens: np.ndarray, vocab_size: int) -> list[Deviation]:
    a = trajectory(TorchEngine, torch_config(cfg), tokens, vocab_size)
    b = trajectory(MlxEngine, cfg, tokens, vocab_size)
    loss = [(f"step {s}", relative(a[s, 0], b[s, 0])) for s in range(cfg.steps)]
    clipped = int(np.sum(b[:, 1] > cfg.grad_clip)) if cfg.grad_clip > 0 else 0
    return [worst(case_name(cfg), f"{cfg.steps}-step train loss ({clipped} clipped)", loss,
                  TRAJECTORY_RTOL)]


def step_cases() -> list[TrainConfig]:
    return [dataclasses.replace(BASE, depth=d, **change)
            for group in (ARMS, RIVALS) for d in DEPTHS for change in group]


def trajectory_cases() -> list[TrainConfig]:
    """Each arm and rival at depth 3, plus independent decay and biases."""
    deep = dataclasses.replace(BASE, depth=3)
    return [dataclasses.replace(deep, **change) for group in (ARMS, RIVALS) for change in group] + [
        dataclasses.replace(deep, qk_norm="rmsnorm", independent_wd=True, weight_decay=1e-3),
        dataclasses.replace(deep, qk_norm="layernorm", bias=True),
    ]


def run_all() -> list[Deviation]:
    torch.manual_seed(0)
    tokens, vocab = byte_tokens(), ByteTokenizer.vocab_size
    rows: list[Deviation] = []
    biased = dataclasses.replace(BASE, depth=2, qk_norm="layernorm", bias=True)
    for cfg in [*step_cases(), biased]:
        rows += compare_step(cfg.validate(), tokens, vocab)
    for cfg in trajectory_cases():
        rows += compare_trajectory(cfg.validate(), tokens, vocab)
    return rows


def format_table(rows: list[Deviation]) -> str:
    return "\n".join(table(["case", "quantity", "largest at", "rel. deviation", "tolerance",
                             "result"],
                            [[r.case, r.quantity, r.where, f"{r.value:.2e}", f"{r.tolerance:.0e}",
                              "ok" if r.ok else "FAIL"] for r in rows]))


USAGE = """usage: python -m crosscheck parity

Checks in float32 on the CPU that MLX and PyTorch agree on logits, loss,
gradients, every probe, one step of each engine's own Engine.step (its loss, gradient norm,
rate and the weights after it) and a 50-step AdamW trajectory for each arm; prints the largest
deviations and exits non-zero when a tolerance is broken. Takes no arguments."""


def cli(argv: list[str]) -> int:
    if argv:
        raise UsageError(f"parity takes no arguments; got {' '.join(argv)}")
    torch.set_num_threads(1)
    rows = run_all()
    print(format_table(rows))
    broken = [r for r in rows if not r.ok]
    print(f"\nrelative deviation = max|torch - mlx| / max|mlx|; "
          f"{len(rows) - len(broken)}/{len(rows)} within tolerance")
    if broken:
        print(f"{len(broken)} tolerance(s) broken", file=sys.stderr)
        return 1
    return 0
