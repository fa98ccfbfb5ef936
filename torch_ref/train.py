"""A PyTorch trainer that writes mlx_gpt's run-log schema: the engine of the spot check.

Same batches (mlx_gpt.batches), same evaluation and probe steps, same metric rows, same
divergence rule and the same summary fields (one mlx_gpt.recorder.Recorder drives both), with
framework "torch" and the device recorded. It starts from weights given as a safetensors file.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR

from mlx_gpt import interrupts, runlog
from mlx_gpt.batches import probe_batch, train_stream, val_batches
from mlx_gpt.config import TrainConfig, model_args
from mlx_gpt.display import Display
from mlx_gpt.errors import UsageError
from mlx_gpt.recorder import Recorder

from . import probes as probe_lib
from .model import GPT, count_params, cross_entropy, objective_terms
from .optim import make_optimizer, update
from .weights import load_torch, save_torch


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda, else mps, else cpu; an unavailable device is a usage error."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available()}
    if name == "auto":
        name = next(d for d in ("cuda", "mps", "cpu") if available[d])
    if name not in available:
        raise UsageError(f"device must be one of auto, cuda, mps, cpu; got {name!r}")
    if not available[name]:
        raise UsageError(f"device {name} is not available to this torch build "
                         f"({torch.__version__})")
    return torch.device(name)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def full_float32() -> None:
    """A float32 reference: no TF32 or reduced-precision matmuls on CUDA."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def train_step(model: GPT, opt: torch.optim.AdamW, schedule: LambdaLR, grad_clip: float,
               x: torch.Tensor, y: torch.Tensor):
    """Forward, backward of the objective (cross-entropy + z-loss term), clip, AdamW (from
    optim.make_optimizer). Returns (cross-entropy, pre-clip grad norm, lr, z-loss term) as 0-d
    tensors, as mlx_gpt's step."""
    model.zero_grad(set_to_none=True)
    total, loss, z = objective_terms(model(x), y, model.args.z_loss)
    total.backward()
    grad_norm, lr = update(opt, schedule, grad_clip)
    return loss.detach(), grad_norm, lr, z.detach()


def train_run(cfg: TrainConfig, run_dir: Path, init_weights: Path, device: torch.device,
              train_tokens: np.ndarray, val_tokens: np.ndarray, meta: dict,
              summary_extra: dict, manifest_extra: dict, verbose: bool = True) -> dict:
    """Train `cfg` from `init_weights` on `device`, logging into `run_dir`. Returns the summary.

    A torch run has no checkpoints: an interrupted one starts again from step 0.
    """
    full_float32()
    steps = cfg.steps
    for folder in ("metrics", "probes"):
        runlog.drop_parts_from(run_dir / folder, 0)
    manifest = runlog.manifest(cfg.data, "torch", describe(device), {
        "torch_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(), **manifest_extra})
    runlog.write_json(run_dir / "manifest.json", manifest)

    model = GPT(model_args(cfg, meta["vocab_size"])).to(device)
    load_torch(model, init_weights)
    opt, schedule = make_optimizer(cfg, dict(model.named_parameters()))

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    val = [(tensor(x), tensor(y)) for x, y in
           val_batches(val_tokens, cfg.data_seed, cfg.eval_batches, cfg.batch_size, cfg.block_size)]
    px, py = (tensor(a) for a in probe_batch(val_tokens, cfg.data_seed, cfg.batch_size,
                                              cfg.block_size))

    @torch.no_grad()
    def evaluate() -> float:
        return torch.stack([cross_entropy(model(x), y) for x, y in val]).mean().item()

    rec = Recorder(cfg, run_dir)
    display = Display(summary_extra["run_id"], steps, cfg.tokens_per_step, 0, verbose)

    def measure(step: int) -> None:
        if rec.eval_due(step):
            rec.record_val(step, evaluate())
        if rec.probe_due(step):
            rec.record_probes(probe_lib.measure(model, px, py, step))

    def read(pending) -> list[tuple[int, float, float, float, float | None]]:
        """One device sync for a whole log interval of (loss, grad norm, lr, z-loss term)."""
        values = torch.stack([v for _, v in pending]).cpu().double().tolist()  # MPS: no float64
        return [(s, a, b, c, z if cfg.z_loss else None)
                for (s, _), (a, b, c, z) in zip(pending, values)]

    pending: list[tuple[int, torch.Tensor]] = []
    batches = train_stream(train_tokens, cfg.data_seed, 0, steps, cfg.batch_size, cfg.block_size)
    # Ctrl-C and SIGTERM stop between steps (a torch run restarts from step 0 anyway)
    with interrupts.Deferred() as guard:
        t_sync = time.perf_counter()
        for step in range(steps):
            guard.check()
            measure(step)
            probing = rec.update_probe_due(step)
            before = probe_lib.snapshot(model) if probing else None
            x, y = next(batches)
            loss, grad_norm, lr, z = train_step(model, opt, schedule, cfg.grad_clip,
                                                tensor(x), tensor(y))
            pending.append((step, torch.stack([loss, grad_norm, lr.to(loss.dtype), z])))
            if probing:
                rec.record_probes(probe_lib.update_stats(step, before, probe_lib.snapshot(model)))
            if not rec.sync_due(step):
                continue
            diverged = rec.sync(read(pending), t_sync, display)
            pending.clear()
            if diverged:  # probe the weights as they are when the run is declared diverged
                rec.record_probes(probe_lib.measure(model, px, py, step + 1))
                break
            if rec.checkpoint_due(step):
                rec.flush()  # parts cover the same step ranges as the MLX run's
            t_sync = time.perf_counter()

    if rec.status == "completed":
        measure(steps)
    digest = save_torch(model, run_dir / "final.safetensors")
    summary = rec.finish({**summary_extra, "final_weights_sha256": digest,
                          "unigram_entropy": meta["unigram_entropy"]}, manifest,
                         count_params(model))
    display.close(rec.closing_line(summary))
    return summary
