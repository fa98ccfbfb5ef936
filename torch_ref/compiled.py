"""The functions a torch step calls, eager or through torch.compile, and the compile settings.

The model is an argument, so every run of a process with one shape (depth, arm, batch) reuses
one compiled graph and a new shape is one more graph. torch runs a function eagerly past
`recompile_limit` graphs (8 by default); a sweep process sees (depths x arms) shapes, a training
and an evaluation graph each, so the limit is raised to GRAPHS, and a process that needs more
says so in one line.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch


GRAPHS = 64  # graphs per function: 32 (depth, arm) shapes, training and evaluation each
FELL_BACK = ("torch.compile: a process of this sweep met more than {limit} shapes and runs the "
             "rest eagerly (same maths, slower); fewer depths or arms a process avoid it")


def objective(model, x: torch.Tensor, y: torch.Tensor, bf16: bool):
    """(cross-entropy + z-loss term, cross-entropy, z-loss term) of one batch (GPT.loss); the
    forward in bfloat16 under bf16, the loss in float32."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    return model.loss(logits.float(), y)


def val_loss(model, x: torch.Tensor, y: torch.Tensor, bf16: bool) -> torch.Tensor:
    return objective(model, x, y, bf16)[1]


class FallbackNotice(logging.Filter):
    """Replaces torch's multi-line warning on reaching the recompile limit with FELL_BACK."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "hit config." not in str(record.msg):
            return True
        limit = record.args[1] if isinstance(record.args, tuple) and len(record.args) > 1 \
            else GRAPHS
        print(FELL_BACK.format(limit=limit), file=sys.stderr, flush=True)
        return False


@functools.cache
def configure(graphs: int = GRAPHS) -> None:
    """Raise torch's per-function graph limit to `graphs` (never lower it) and watch for the
    fall back; once a process."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), graphs))
    # torch 2.x: the limit over all of a function's graphs; kept above the per-function one
    for total in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, total):
            setattr(config, total, max(getattr(config, total), 4 * graphs))
            break
    logging.getLogger("torch._dynamo.convert_frame").addFilter(FallbackNotice())


@functools.cache
def functions(compile_: bool):
    """(objective, val_loss), compiled once a process when `compile_`."""
    if not compile_:
        return objective, val_loss
    configure()
    return torch.compile(objective), torch.compile(val_loss)
