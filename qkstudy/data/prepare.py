"""`python -m qkstudy prepare SOURCE [key=value ...]`: train.bin, val.bin, meta.json."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from ..config import apply_overrides, split_key_values
from ..errors import UsageError
from ..files import cannot_write, io_failure, remove_stale, swap_in
from .sources import FINEWEB_DEFAULT_CAP, resolve_source
from .tokenizer import Tokenizer, get_tokenizer
from .load import token_stats

DEFAULT_BLOCK_SIZE = 256
MIN_SPLIT_TOKENS = DEFAULT_BLOCK_SIZE + 1
BATCH_CHARS = 1 << 22  # ~4 MB of text per encode_batch call: enough work for tiktoken's threads
MAX_SYNTHETIC_MB = 10_000.0  # the generator writes ~10-20 MB/s: this is already minutes


@dataclass(frozen=True)
class PrepareConfig:
    out: str = ""  # "" -> data/<source-name>-<tokenizer>
    tokenizer: Literal["gpt2", "bytes"] = "gpt2"
    val_fraction: float = 0.01  # of documents; ignored where the source has its own val split
    max_tokens: int | None = None  # cap on tokens read; 0 = none; None = source default
    size_mb: float = 20.0  # synthetic: millions of characters of generated text
    seed: int = 0  # synthetic: generator seed

    def validate(self) -> PrepareConfig:
        if not 0 < self.val_fraction <= 0.5:
            raise UsageError(f"val_fraction must be in (0, 0.5]; got {self.val_fraction}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise UsageError(f"max_tokens must be >= 0 (0 = no cap); got {self.max_tokens}")
        if not 0 < self.size_mb <= MAX_SYNTHETIC_MB:
            raise UsageError(f"size_mb must be > 0 and at most {MAX_SYNTHETIC_MB:g} "
                             f"({MAX_SYNTHETIC_MB / 1000:g} GB of text); got {self.size_mb}")
        return self


class _Split:
    def __init__(self, file: BinaryIO) -> None:
        self.file, self.tokens, self.documents, self.max_id = file, 0, 0, -1

    def write(self, docs: list[list[int]], eot: int) -> None:
        if not docs:
            return
        ids = np.fromiter(itertools.chain.from_iterable([eot, *doc] for doc in docs), "<u2")
        self.file.write(ids.tobytes())
        self.max_id = max(self.max_id, int(ids.max()))
        self.tokens += len(ids)
        self.documents += len(docs)


def _take(documents: Iterator[str], max_chars: int) -> list[str]:
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc)
        if chars >= max_chars:
            break
    return batch


def _is_val(index: int, val_fraction: float) -> bool:
    """Every (1/f)-th document, evenly spread, deterministic, streamable."""
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)


def _tokenize(documents: Iterable[str], tok: Tokenizer, timer: dict, cap: int,
              train: _Split, val: _Split | None, val_fraction: float) -> None:
    """Encode documents in batches, route each to train or val, stop at `cap` tokens (0: none)."""
    documents, index, total = iter(documents), 0, 0
    while True:
        # no more characters than tokens still allowed: no fineweb shard past the cap is fetched
        batch = _take(documents, min(BATCH_CHARS, cap - total) if cap else BATCH_CHARS)
        if not batch:
            return
        start = time.perf_counter()
        encoded = tok.encode_batch(batch)
        timer["seconds"] += time.perf_counter() - start
        timer["text_bytes"] += sum(len(d.encode()) for d in batch)
        to_train, to_val = [], []
        for ids in encoded:
            is_val = val is not None and _is_val(index, val_fraction)
            (to_val if is_val else to_train).append(ids)
            index += 1
            total += len(ids) + 1
            if cap and total >= cap:
                break
        train.write(to_train, tok.eot)
        if val is not None:
            val.write(to_val, tok.eot)
        if cap and total >= cap:
            return


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    if out.exists() and not out.is_dir():
        raise UsageError(f"output path {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").exists():
        raise UsageError(f"output folder {out} exists and is not a prepared data folder")
    missing = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # os.mkdir honours the umask (mkdtemp would leave the published folder 0700)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        remove_stale(out)
        os.mkdir(tmp)
    except OSError as e:
        _remove_empty(missing)
        raise cannot_write(e, f"output folder {out}") from None
    try:
        yield tmp
        swap_in(tmp, out)  # the earlier folder stays if this fails
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(missing)
        raise


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()


def prepare(source: str, cfg: PrepareConfig) -> tuple[Path, dict]:
    cfg = cfg.validate()
    corpus = resolve_source(source, synthetic_mb=cfg.size_mb, synthetic_seed=cfg.seed)
    tok = get_tokenizer(cfg.tokenizer)
    assert tok.vocab_size <= 1 << 16, "ids must fit uint16"
    out = Path(cfg.out or f"data/{corpus.name}-{tok.name}")
    cap = cfg.max_tokens if cfg.max_tokens is not None else (
        FINEWEB_DEFAULT_CAP if source == "fineweb-edu" else 0)
    own_val = corpus.val_documents is not None
    split_rule = corpus.val_rule if own_val else (
        f"document i is val when floor((i+1)*{cfg.val_fraction:g}) > floor(i*{cfg.val_fraction:g})")
    start, timer = time.perf_counter(), {"text_bytes": 0, "seconds": 0.0}
    with _staging(out) as tmp:
        with open(tmp / "train.bin", "wb") as train_file, open(tmp / "val.bin", "wb") as val_file:
            train, val = _Split(train_file), _Split(val_file)
            _tokenize(corpus.documents, tok, timer, cap, train, None if own_val else val,
                      cfg.val_fraction)
            if own_val:
                _tokenize(corpus.val_documents, tok, timer, 0, val, None, cfg.val_fraction)
        if train.documents + val.documents == 0:
            raise UsageError(f"source {source} has no documents (it is empty or only whitespace)")
        for split_name, split in (("train", train), ("val", val)):
            if split.max_id >= tok.vocab_size:
                raise UsageError(f"tokenizer {tok.name} produced id {split.max_id}, outside its "
                                 f"vocabulary of {tok.vocab_size}")
            if split.tokens < MIN_SPLIT_TOKENS:
                raise UsageError(
                    f"{split_name} split of {source} has {split.tokens} tokens; need at least "
                    f"{MIN_SPLIT_TOKENS} (one {DEFAULT_BLOCK_SIZE}-token block + 1); "
                    f"give more text{'' if own_val else ' or raise val_fraction'}")
        meta = {
            "format": "uint16 little-endian token ids; eot before each document",
            "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot": tok.eot,
            "train_tokens": train.tokens, "val_tokens": val.tokens,
            "train_documents": train.documents, "val_documents": val.documents,
            "source": corpus.description, "inputs": corpus.inputs,
            "split": split_rule, "val_fraction": None if own_val else cfg.val_fraction,
            "max_tokens": cap, "text_bytes": timer["text_bytes"],
            "unigram_entropy": round(token_stats(tmp / "train.bin", np.memmap(
                tmp / "train.bin", dtype="<u2", mode="r"))[1], 6),
            "tokenize_mb_per_s": round(timer["text_bytes"] / 1e6 / max(timer["seconds"], 1e-9), 2),
            "prepare_seconds": round(time.perf_counter() - start, 2),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out, meta


USAGE = """usage: python -m qkstudy prepare SOURCE [key=value ...]

SOURCE: synthetic | tinystories | fineweb-edu | a .txt or .parquet file | a folder of them
keys:   out=data/<source>-<tokenizer>  tokenizer=gpt2|bytes  val_fraction=0.01
        max_tokens=0 (no cap; fineweb-edu: 100000000)  size_mb=20 (synthetic)  seed=0 (synthetic)"""


def cli(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    source, words = argv[0], argv[1:]
    if "=" in source and not Path(source).exists():
        raise UsageError(f"prepare needs SOURCE first, before key=value words; got {source!r}")
    cfg = apply_overrides(PrepareConfig(), split_key_values(words))
    try:
        out, meta = prepare(source, cfg)
    except OSError as e:
        if not io_failure(e):
            raise
        raise cannot_write(e, e.filename or "the data folder",
                           f" (nothing of {source} was kept)") from None
    m = meta
    print(f"prepared {out}: train {m['train_tokens']:,} tokens ({m['train_documents']:,} docs), "
          f"val {m['val_tokens']:,} tokens ({m['val_documents']:,} docs), {m['tokenizer']}")
    print(f"tokenised {m['text_bytes'] / 1e6:.1f} MB of text at {m['tokenize_mb_per_s']:.1f} MB/s; "
          f"{m['prepare_seconds']:.1f} s in all")
    return 0
