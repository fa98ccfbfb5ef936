"""`python -m qkstudy prepare SOURCE [key=value ...]`: tokenise a corpus into uint16 files.

A prepared folder holds:
  train.bin, val.bin  raw little-endian uint16 token ids (np.memmap-compatible); every
                      document is preceded by the end-of-text id, so a window that starts
                      at a document start is conditioned exactly like one (GPT-2 convention)
  meta.json           tokenizer, vocab_size, eot, token and document counts, the source,
                      every input file with its size and sha256, the split rule, timings

Split rule for single-corpus sources: document i (0-based, in reading order) goes to val
when floor((i+1)*f) > floor(i*f), f = val_fraction; i.e. every (1/f)-th document. It is
deterministic, streams, and spreads val evenly over a corpus that may be ordered.
TinyStories has an official validation file, which is the val split as a whole.

Each split must hold at least MIN_SPLIT_TOKENS = 257 tokens: one block of the default
block size (256) plus the next-token target of its last position.

Output is written to a hidden temporary folder beside the target and renamed into place
at the end, so a failed run leaves nothing behind and an existing prepared folder is
replaced only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import numpy as np

from . import synthetic
from .config import apply_overrides, split_key_values
from .errors import UsageError
from .tokenizer import ENDOFTEXT, Tokenizer, get_tokenizer

DEFAULT_BLOCK_SIZE = 256
MIN_SPLIT_TOKENS = DEFAULT_BLOCK_SIZE + 1
NAMED_SOURCES = ("synthetic", "tinystories", "fineweb-edu")
TINYSTORIES_REPO = "roneneldan/TinyStories"
TINYSTORIES_FILES = ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt")
FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_FOLDER = "sample/10BT"
FINEWEB_DEFAULT_CAP = 100_000_000
BATCH_CHARS = 1 << 22  # ~4 MB of text per encode_batch call: enough work for tiktoken's threads
READ_CHARS = 1 << 23
MAX_SYNTHETIC_MB = 10_000.0  # the generator writes ~10-20 MB/s: this is already minutes
KNOWN_VOCAB = {"gpt2": 50257, "bytes": 257}


@dataclass(frozen=True)
class PrepareConfig:
    out: str = ""  # "" -> data/<source-name>-<tokenizer>
    tokenizer: str = "gpt2"
    val_fraction: float = 0.01  # of documents; ignored where the source has its own val split
    max_tokens: int | None = None  # cap on tokens read; 0 = none; None = source default
    size_mb: float = 20.0  # synthetic: millions of characters of generated text
    seed: int = 0  # synthetic: generator seed

    def validate(self) -> PrepareConfig:
        if self.tokenizer not in ("gpt2", "bytes"):
            raise UsageError(f"tokenizer must be gpt2 or bytes; got {self.tokenizer!r}")
        if not 0 < self.val_fraction <= 0.5:
            raise UsageError(f"val_fraction must be in (0, 0.5]; got {self.val_fraction}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise UsageError(f"max_tokens must be >= 0 (0 = no cap); got {self.max_tokens}")
        if not 0 < self.size_mb <= MAX_SYNTHETIC_MB:
            raise UsageError(f"size_mb must be > 0 and at most {MAX_SYNTHETIC_MB:g} "
                             f"({MAX_SYNTHETIC_MB / 1000:g} GB of text); got {self.size_mb}")
        return self


@dataclass
class Corpus:
    """Documents from a source. `inputs` fills in as files are opened (downloads are lazy)."""

    name: str  # stem of the default output folder
    description: str
    documents: Iterator[str]
    inputs: list[dict]  # {path or name, bytes, sha256} per input
    val_documents: Iterator[str] | None = None  # an official validation split, if any
    val_rule: str = ""  # says which file is the official validation split


# ---------------------------------------------------------------- reading local files


def _scan(path: Path, marker: bytes) -> tuple[dict, bool]:
    """One pass over a file: its input record (size, sha256) and whether `marker` occurs."""
    digest, size, found, tail = hashlib.sha256(), 0, False, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
            size += len(chunk)
            found = found or marker in tail + chunk
            tail = chunk[-len(marker):]
    return {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}, found


def _txt_documents(path: Path, inputs: list[dict]) -> Iterator[str]:
    """Documents split on <|endoftext|> if the file has it (TinyStories), else on blank lines."""
    record, has_marker = _scan(path, ENDOFTEXT.encode())
    inputs.append(record)
    split = (lambda text: text.split(ENDOFTEXT)) if has_marker else re.compile(r"\n\s*\n").split
    carry = ""
    try:
        with open(path, encoding="utf-8") as f:
            while chunk := f.read(READ_CHARS):
                # The last piece may continue in the next chunk: hold it back.
                *pieces, carry = split(carry + chunk)
                yield from (doc for p in pieces if (doc := p.strip()))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start} of a chunk)") from None
    if doc := carry.strip():
        yield doc


def _parquet_documents(path: Path, inputs: list[dict]) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a non-parquet file
        raise UsageError(f"{path} is not a readable parquet file ({type(e).__name__})") from None
    columns = parquet.schema_arrow.names
    if "text" not in columns:
        raise UsageError(f"{path} has no 'text' column (columns: {', '.join(columns) or 'none'})")
    inputs.append(_scan(path, b"")[0])
    for batch in parquet.iter_batches(columns=["text"], batch_size=4096):
        yield from (doc for text in batch.column(0).to_pylist() if text and (doc := text.strip()))


def _file_documents(paths: Iterable[Path], inputs: list[dict]) -> Iterator[str]:
    for path in paths:
        reader = _txt_documents if path.suffix == ".txt" else _parquet_documents
        yield from reader(path, inputs)


def _local_files(path: Path) -> list[Path]:
    """The .txt / .parquet files a path names: itself, or those under a folder (sorted)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.suffix in (".txt", ".parquet") and p.is_file())
        if not files:
            raise UsageError(f"folder {path} has no .txt or .parquet files")
        return files
    if path.suffix not in (".txt", ".parquet"):
        raise UsageError(f"{path}: unsupported file type {path.suffix or '(none)'}; "
                         f"expected .txt or .parquet")
    return [path]


# ---------------------------------------------------------------- sources


def _synthetic(cfg: PrepareConfig) -> Corpus:
    n_chars = int(cfg.size_mb * 1_000_000)
    name = f"qkstudy.synthetic seed={cfg.seed} size_mb={cfg.size_mb:g}"
    record = {"name": name, "bytes": 0, "sha256": ""}

    def documents() -> Iterator[str]:
        # The hash is that of the stories written as a TinyStories-style .txt file.
        digest = hashlib.sha256()
        for i, text in enumerate(synthetic.iter_text(n_chars, cfg.seed)):
            data = (f"\n{ENDOFTEXT}\n" if i else "").encode() + text.encode()
            digest.update(data)
            record["bytes"] += len(data)
            record["sha256"] = digest.hexdigest()  # of what was read, also when a cap stops early
            yield text

    return Corpus("synthetic", f"generated stories ({name})", documents(), [record])


def _hf_download(repo: str, filename: str) -> Path:
    """One file from a Hugging Face dataset repo; cached, and resumed if interrupted."""
    try:
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(repo, filename, repo_type="dataset"))
    except ImportError:
        raise UsageError("downloading needs huggingface_hub: pip install huggingface_hub") from None
    except Exception as e:  # noqa: BLE001 - network, auth and hub errors all end the same way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"cannot download {filename} from {repo}: {first}") from None


def _tinystories() -> Corpus:
    train, valid = (_hf_download(TINYSTORIES_REPO, f) for f in TINYSTORIES_FILES)
    inputs: list[dict] = []
    return Corpus("tinystories", f"{TINYSTORIES_REPO}: {' + '.join(TINYSTORIES_FILES)}",
                  _file_documents([train], inputs), inputs, _file_documents([valid], inputs),
                  f"the official validation file {TINYSTORIES_FILES[1]} is val")


def _fineweb_shards() -> Iterator[Path]:
    """The sample/10BT parquet shards in name order, each downloaded only when reached."""
    try:
        from huggingface_hub import HfApi
        api = HfApi()
        tree = api.list_repo_tree(FINEWEB_REPO, path_in_repo=FINEWEB_FOLDER, repo_type="dataset")
        names = sorted(f.path for f in tree if f.path.endswith(".parquet"))
    except ImportError:
        raise UsageError("downloading needs huggingface_hub: pip install huggingface_hub") from None
    except Exception as e:  # noqa: BLE001 - network, auth and hub errors all end the same way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"cannot list {FINEWEB_REPO}/{FINEWEB_FOLDER}: {first}") from None
    for name in names:
        yield _hf_download(FINEWEB_REPO, name)


def _fineweb() -> Corpus:
    inputs: list[dict] = []
    return Corpus("fineweb-edu", f"{FINEWEB_REPO} {FINEWEB_FOLDER} parquet shards, column text",
                  _file_documents(_fineweb_shards(), inputs), inputs)


def resolve_source(source: str, cfg: PrepareConfig) -> Corpus:
    """A named source (synthetic, tinystories, fineweb-edu) or a local file or folder."""
    if source == "synthetic":
        return _synthetic(cfg)
    if source == "tinystories":
        return _tinystories()
    if source == "fineweb-edu":
        return _fineweb()
    path = Path(source).expanduser()
    if not path.exists():
        if path.suffix in (".txt", ".parquet") or os.sep in source:
            raise UsageError(f"no such file or folder: {source}")
        raise UsageError(f"unknown source {source!r}; expected {', '.join(NAMED_SOURCES)}, "
                         f"or a .txt/.parquet file or folder")
    files = _local_files(path)
    stem = path.resolve().stem if path.is_file() else path.resolve().name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    inputs: list[dict] = []
    return Corpus(name or "local", f"local {'folder' if path.is_dir() else 'file'} {path}",
                  _file_documents(files, inputs), inputs)


# ---------------------------------------------------------------- tokenising and writing


class _Split:
    """One output file of uint16 ids, appended batch by batch."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.tokens = 0
        self.documents = 0
        self.max_id = -1

    def write(self, docs: list[list[int]], eot: int) -> None:
        if not docs:
            return
        ids = np.empty(sum(len(d) for d in docs) + len(docs), dtype="<u2")
        pos = 0
        for doc in docs:
            ids[pos] = eot
            ids[pos + 1:pos + 1 + len(doc)] = doc
            pos += 1 + len(doc)
        self.file.write(ids.tobytes())
        self.max_id = max(self.max_id, int(ids.max()))
        self.tokens += len(ids)
        self.documents += len(docs)


def _take(documents: Iterator[str], max_chars: int) -> list[str]:
    """Documents from the iterator until they hold `max_chars` characters (at least one)."""
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc)
        if chars >= max_chars:
            break
    return batch


@dataclass
class _Timer:
    text_bytes: int = 0
    seconds: float = 0.0


def _is_val(index: int, val_fraction: float) -> bool:
    """The split rule: every (1/f)-th document, evenly spread, deterministic, streamable."""
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)


def _tokenize(documents: Iterable[str], tok: Tokenizer, timer: _Timer, cap: int,
              train: _Split, val: _Split | None, val_fraction: float) -> None:
    """Encode documents in batches, route each to train or val, stop at `cap` tokens (0: none)."""
    documents, index, total = iter(documents), 0, 0
    while True:
        # A batch holds no more characters than tokens still allowed (GPT-2 gives ~1 token per
        # 4 characters), so reading stops about one document past the cap and a fineweb shard
        # beyond it is never downloaded.
        batch = _take(documents, min(BATCH_CHARS, cap - total) if cap else BATCH_CHARS)
        if not batch:
            return
        start = time.perf_counter()
        encoded = tok.encode_batch(batch)
        timer.seconds += time.perf_counter() - start
        timer.text_bytes += sum(len(d.encode()) for d in batch)
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
    """A temporary folder beside `out`, renamed to `out` on success, removed on failure."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output path {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").exists():
        # Never replace a folder that was not written by prepare: it could be anything.
        raise UsageError(f"output folder {out} exists and is not a prepared data folder")
    missing = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # os.mkdir honours the umask (mkdtemp would leave the published folder 0700).
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed run that had our pid
        os.mkdir(tmp)
    except OSError as e:
        _remove_empty(missing)
        raise UsageError(f"cannot write output folder {out}: {e.strerror or e}") from None
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(missing)
        raise


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()


def prepare(source: str, cfg: PrepareConfig) -> tuple[Path, dict]:
    """Tokenise `source` into a prepared folder; returns (folder, meta)."""
    cfg = cfg.validate()
    corpus = resolve_source(source, cfg)  # first: a typo in SOURCE should not wait on a tokenizer
    tok = get_tokenizer(cfg.tokenizer)
    assert tok.vocab_size <= 1 << 16, "ids must fit uint16"
    out = Path(cfg.out or f"data/{corpus.name}-{tok.name}")
    cap = cfg.max_tokens if cfg.max_tokens is not None else (
        FINEWEB_DEFAULT_CAP if source == "fineweb-edu" else 0)
    own_val = corpus.val_documents is not None
    split_rule = corpus.val_rule if own_val else (
        f"document i is val when floor((i+1)*{cfg.val_fraction:g}) > floor(i*{cfg.val_fraction:g})")
    start, timer = time.perf_counter(), _Timer()
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
            "max_tokens": cap, "text_bytes": timer.text_bytes,
            "unigram_entropy": round(token_stats(tmp / "train.bin", np.memmap(
                tmp / "train.bin", dtype="<u2", mode="r"))[1], 6),
            "tokenize_mb_per_s": round(timer.text_bytes / 1e6 / max(timer.seconds, 1e-9), 2),
            "prepare_seconds": round(time.perf_counter() - start, 2),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out, meta


# ---------------------------------------------------------------- reading prepared data


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
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UsageError(f"{folder / 'meta.json'} is not valid JSON; prepare it again") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{folder / 'meta.json'} is not a JSON object; prepare the folder "
                         f"again: `{hint}`")
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
    if meta.get("tokenizer") in KNOWN_VOCAB and vocab != KNOWN_VOCAB[meta["tokenizer"]]:
        raise UsageError(f"{folder / 'meta.json'} says vocab_size {vocab} for tokenizer "
                         f"{meta['tokenizer']}, which has {KNOWN_VOCAB[meta['tokenizer']]}; "
                         f"prepare the folder again: `{hint}`")
    for split in ("train", "val"):
        path = folder / f"{split}.bin"
        tokens = np.memmap(path, dtype="<u2", mode="r")
        largest, entropy = token_stats(path, tokens)
        if split == "train":  # computed, not trusted from meta.json (older folders lack it)
            meta["unigram_entropy"] = round(entropy, 6)
        if largest >= vocab:  # an id past the vocabulary would index outside the embedding
            raise UsageError(f"{path} holds token id {largest}, outside the vocabulary of "
                             f"{vocab} in meta.json; prepare the folder again: `{hint}`")
        arrays.append(tokens)
    return arrays[0], arrays[1], meta


_token_stats: dict[tuple, tuple[int, float]] = {}


def token_stats(path: Path, tokens: np.ndarray) -> tuple[int, float]:
    """(largest id, unigram entropy in nats per token) of a token file, from one bincount,
    computed once per file version in this process.

    The unigram entropy is the loss of a model that learned token frequencies and nothing else:
    a stable run whose final loss stays near it is "degraded" (docs/report.md)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _token_stats:
        counts = np.bincount(np.asarray(tokens), minlength=1)
        p = counts[counts > 0] / counts.sum()
        _token_stats[key] = (int(np.flatnonzero(counts)[-1]), float(-(p * np.log(p)).sum()))
    return _token_stats[key]


# ---------------------------------------------------------------- command line

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
        if e.errno == errno.ENOSPC:  # the staging folder is already removed
            raise UsageError(f"disk full while preparing {source}; nothing was kept. Free some "
                             "space and run the same command again") from None
        raise
    m = meta
    print(f"prepared {out}: train {m['train_tokens']:,} tokens ({m['train_documents']:,} docs), "
          f"val {m['val_tokens']:,} tokens ({m['val_documents']:,} docs), {m['tokenizer']}")
    print(f"tokenised {m['text_bytes'] / 1e6:.1f} MB of text at {m['tokenize_mb_per_s']:.1f} MB/s; "
          f"{meta['prepare_seconds']:.1f} s in all")
    return 0
