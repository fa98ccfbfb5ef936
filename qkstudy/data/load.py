"""A prepared data folder read back as untrusted input: each failure one line."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..files import load_object
from .tokenizer import VOCAB_BY_TOKENIZER


def load_tokens(data_dir: str | os.PathLike) -> tuple[np.memmap, np.memmap, dict]:
    """(train, val, meta) of a prepared folder; the token arrays are read-only uint16 memmaps."""
    folder = Path(data_dir)
    match = re.fullmatch(r"(.+)-(gpt2|bytes)", folder.name)
    hint = (f"python -m qkstudy prepare {match.group(1)} tokenizer={match.group(2)}" if match
            else "python -m qkstudy prepare synthetic")
    if not folder.is_dir():
        raise UsageError(f"data folder {folder} does not exist; run `{hint}` first")
    if not (folder / "meta.json").is_file():
        raise UsageError(f"data folder {folder} has no meta.json; run `{hint}` first")
    meta, why = load_object(folder / "meta.json")
    if why:
        raise UsageError(f"{folder / 'meta.json'} {why}; prepare the folder again: `{hint}`")
    arrays = []
    for split in ("train", "val"):
        path, expected = folder / f"{split}.bin", meta.get(f"{split}_tokens")
        if not path.is_file():
            raise UsageError(f"data folder {folder} has no {split}.bin; prepare it again")
        if not isinstance(expected, int) or path.stat().st_size != 2 * expected or expected == 0:
            raise UsageError(f"{path} holds {path.stat().st_size // 2} tokens but meta.json says "
                             f"{expected}; prepare the folder again")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 0 < vocab <= 1 << 16:
        raise UsageError(f"{folder / 'meta.json'} has no valid vocab_size (a JSON object with "
                         f"vocab_size <= 65536 is expected); prepare the folder again: `{hint}`")
    if meta.get("tokenizer") in VOCAB_BY_TOKENIZER and vocab != VOCAB_BY_TOKENIZER[meta["tokenizer"]]:
        raise UsageError(f"{folder / 'meta.json'} says vocab_size {vocab} for tokenizer "
                         f"{meta['tokenizer']}, which has {VOCAB_BY_TOKENIZER[meta['tokenizer']]}; "
                         f"prepare the folder again: `{hint}`")
    digests = []
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        tokens = np.memmap(path, dtype="<u2", mode="r")
        largest, entropy, digest = token_stats(path, tokens)
        digests.append(digest)
        if split == "train":  # computed, not trusted from meta.json
            meta["unigram_entropy"] = round(entropy, 6)
        if largest >= vocab:
            raise UsageError(f"{path} holds token id {largest}, outside the vocabulary of "
                             f"{vocab} in meta.json; prepare the folder again: `{hint}`")
        arrays.append(tokens)
    meta["tokens_sha256"] = hashlib.sha256("".join(digests).encode()).hexdigest()
    return arrays[0], arrays[1], meta


def data_identity(meta: dict) -> dict:
    """What makes a prepared folder the data it is: the tokens' sha256, and words for a change."""
    return {"tokens_sha256": meta["tokens_sha256"], "tokenizer": meta.get("tokenizer"),
            "train_tokens": meta.get("train_tokens"), "val_tokens": meta.get("val_tokens"),
            "source": meta.get("source")}


class DataChanged(UsageError):
    """The prepared data is not what the run was trained on."""


def data_change(recorded: dict, now_: dict) -> str | None:
    """What differs between a run's recorded data identity and the data's now, or None."""
    if recorded.get("tokens_sha256") == now_.get("tokens_sha256"):
        return None
    changed = [f"{key} {recorded.get(key)!r} -> {now_.get(key)!r}" for key in sorted(now_)
               if key != "tokens_sha256" and recorded.get(key) != now_.get(key)]
    return ", ".join(changed) or (f"the tokens' sha256 {str(recorded.get('tokens_sha256'))[:12]}"
                                  f"... -> {str(now_.get('tokens_sha256'))[:12]}...")


_token_stats: dict[tuple, tuple[int, float, str]] = {}


def token_stats(path: Path, tokens: np.ndarray) -> tuple[int, float, str]:
    """(largest id, unigram entropy in nats, sha256) of a token file, once per file version."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _token_stats:
        counts = np.bincount(np.asarray(tokens), minlength=1)
        p = counts[counts > 0] / counts.sum()
        _token_stats[key] = (int(np.flatnonzero(counts)[-1]), float(-(p * np.log(p)).sum()),
                             hashlib.sha256(np.ascontiguousarray(tokens).data).hexdigest())
    return _token_stats[key]
