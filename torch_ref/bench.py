"""`python -m torch_ref bench-step key=value ...`: seconds per eager PyTorch train step.

The PyTorch side of `python -m qkstudy bench`, which runs it in its own process with
MLX_GPT_BLAS=none (OpenBLAS loaded into the global symbol scope would also capture libtorch's
own sgemm calls and slow PyTorch 2-3x; torch_ref/__init__.py). The model is torch_ref's, the
batch and optimizer settings are the benchmark's; the result is one JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from mlx_gpt.bench import SHAPE_KEYS, random_batch, shape_config
from qkstudy.config import split_key_values
from qkstudy.errors import UsageError

from .model import GPT


def step_time(shape: dict, steps: int) -> dict:
    """Median seconds per eager AdamW step (nanoGPT's decay groups, clipping) after 2 warm-ups."""
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg, args = shape_config(shape)
    model = GPT(args)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    x, y = (torch.from_numpy(a).long() for a in random_batch(cfg, args.vocab_size))

    def step() -> None:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()

    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"step_s": float(np.median(times)), "threads": torch.get_num_threads()}


def cli(argv: list[str]) -> int:
    values = split_key_values(argv)
    want = set(SHAPE_KEYS) | {"steps"}
    if set(values) != want:
        raise UsageError(f"bench-step takes exactly {', '.join(sorted(want))}; got "
                         f"{', '.join(sorted(values)) or 'nothing'}")
    try:
        numbers = {k: int(v) for k, v in values.items()}
    except ValueError:
        raise UsageError("bench-step values must be integers") from None
    if min(numbers.values()) < 1:
        raise UsageError("bench-step values must be >= 1")
    steps = numbers.pop("steps")
    print(json.dumps(step_time(numbers, steps)))
    return 0
