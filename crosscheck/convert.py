"""Weights between MLX and PyTorch, both directions, through safetensors files.

Parameter names are identical in both models (wte.weight, blocks.0.attn.qkv.weight, ...).
MLX's nn.Linear stores its weight as (out, in) like torch.nn.Linear, and nn.Embedding as
(num, dim) like torch.nn.Embedding: tensors move as they are, checked by name and shape.

Loading accepts safetensors, or a torch file through torch.load(weights_only=True): never an
arbitrary unpickle.
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import numpy as np

# torch first, then mlx_gpt, then mlx: torch_ref/__init__.py and mlx_gpt/__init__.py say why
import torch_ref  # noqa: F401
import mlx_gpt  # noqa: F401
import mlx.core as mx
import torch
from mlx.utils import tree_flatten, tree_unflatten
from safetensors.torch import load_file

from qkstudy.errors import UsageError


def read_tensors(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Named tensors of a .safetensors file, or of a torch file loaded with weights_only=True."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        return load_file(str(path), device=device)
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UsageError(f"{path} holds more than tensors; refusing to unpickle it ({e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"{path} does not hold a flat dict of named tensors")
    return state


def _check_names_and_shapes(path: Path | str, got: dict[str, tuple], want: dict[str, tuple]) -> None:
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    if missing or extra:
        raise UsageError(f"{path} does not match the model: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    wrong = [f"{k} {got[k]} != {want[k]}" for k in want if got[k] != want[k]]
    if wrong:
        raise UsageError(f"{path} has wrong shapes: {'; '.join(wrong[:5])}")


# --- MLX side ----------------------------------------------------------------------------

def save_mlx(model, path: str | Path) -> None:
    """Write an mlx_gpt GPT's parameters as safetensors (MLX layout)."""
    mx.save_safetensors(str(path), dict(tree_flatten(model.parameters())),
                        metadata={"framework": "mlx"})


def load_mlx(model, path: str | Path) -> None:
    """Load a safetensors file in MLX layout (e.g. from save_torch) into an mlx_gpt GPT."""
    arrays = mx.load(str(path))
    want = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
    _check_names_and_shapes(path, {k: tuple(v.shape) for k, v in arrays.items()}, want)
    dtypes = dict(tree_flatten(model.parameters()))
    model.update(tree_unflatten([(k, v.astype(dtypes[k].dtype)) for k, v in arrays.items()]))
    mx.eval(model.parameters())


# --- torch side --------------------------------------------------------------------------

def save_torch(model: torch.nn.Module, path: str | Path) -> str:
    """Write a torch_ref GPT's parameters as safetensors in MLX layout (readable by load_mlx),
    atomically and with a checksum (qkstudy.files.save_tensors). Returns the checksum."""
    from qkstudy import files

    arrays = {name: p.detach().to("cpu").contiguous().numpy()
              for name, p in model.named_parameters()}
    return files.save_tensors(Path(path), arrays, {"framework": "torch"})


def load_torch(model: torch.nn.Module, path: str | Path) -> None:
    """Load a weights file in MLX layout into a torch_ref GPT, checking names and shapes."""
    tensors = read_tensors(path)
    want = {name: tuple(p.shape) for name, p in model.named_parameters()}
    _check_names_and_shapes(path, {k: tuple(v.shape) for k, v in tensors.items()}, want)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].to(dtype=p.dtype, device=p.device))


# --- in memory, still through a file so the exchange format is what gets exercised ------

def mlx_to_torch(mlx_model, torch_model: torch.nn.Module) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.safetensors"
        save_mlx(mlx_model, path)
        load_torch(torch_model, path)


def torch_to_mlx(torch_model: torch.nn.Module, mlx_model) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.safetensors"
        save_torch(torch_model, path)
        load_mlx(mlx_model, path)


def as_numpy(tree) -> dict[str, np.ndarray]:
    """Flat name -> float array of an MLX parameter tree or a torch module (for comparisons)."""
    if isinstance(tree, torch.nn.Module):
        return {k: v.detach().cpu().numpy() for k, v in tree.named_parameters()}
    return {k: np.array(v) for k, v in tree_flatten(tree)}
