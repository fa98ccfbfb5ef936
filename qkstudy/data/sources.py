"""Where a corpus comes from: the embedded generator, local files, the Hugging Face Hub."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import synthetic
from ..errors import UsageError
from .tokenizer import ENDOFTEXT

NAMED_SOURCES = ("synthetic", "tinystories", "fineweb-edu")
TINYSTORIES_REPO = "roneneldan/TinyStories"
TINYSTORIES_FILES = ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt")
FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_FOLDER = "sample/10BT"
FINEWEB_DEFAULT_CAP = 100_000_000
READ_CHARS = 1 << 23


@dataclass
class Corpus:
    name: str  # stem of the default output folder
    description: str
    documents: Iterator[str]
    inputs: list[dict]  # {path or name, bytes, sha256} per input
    val_documents: Iterator[str] | None = None  # an official validation split, if any
    val_rule: str = ""  # says which file is the official validation split


def _scan(path: Path, marker: bytes) -> tuple[dict, bool]:
    """A file's input record (size, sha256) and whether `marker` occurs in it."""
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


def _synthetic(size_mb: float, seed: int) -> Corpus:
    n_chars = int(size_mb * 1_000_000)
    name = f"qkstudy.data.synthetic seed={seed} size_mb={size_mb:g}"
    record = {"name": name, "bytes": 0, "sha256": ""}

    def documents() -> Iterator[str]:
        # the hash of the stories written as a TinyStories-style .txt file
        digest = hashlib.sha256()
        for i, text in enumerate(synthetic.iter_text(n_chars, seed)):
            data = (f"\n{ENDOFTEXT}\n" if i else "").encode() + text.encode()
            digest.update(data)
            record["bytes"] += len(data)
            record["sha256"] = digest.hexdigest()  # of what was read, also when a cap stops early
            yield text

    return Corpus("synthetic", f"generated stories ({name})", documents(), [record])


def _hub(what: str, call):
    """call(huggingface_hub), its errors as one line: cannot <what>."""
    try:
        import huggingface_hub
        return call(huggingface_hub)
    except ImportError:
        raise UsageError("downloading needs huggingface_hub: pip install huggingface_hub") from None
    except Exception as e:  # noqa: BLE001 - network, auth and hub errors all end the same way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"cannot {what}: {first}") from None


def _hf_download(repo: str, filename: str) -> Path:
    return Path(_hub(f"download {filename} from {repo}",
                     lambda hub: hub.hf_hub_download(repo, filename, repo_type="dataset")))


def _fineweb_shards() -> Iterator[Path]:
    names = _hub(f"list {FINEWEB_REPO}/{FINEWEB_FOLDER}", lambda hub: sorted(
        f.path for f in hub.HfApi().list_repo_tree(FINEWEB_REPO, path_in_repo=FINEWEB_FOLDER,
                                                  repo_type="dataset")
        if f.path.endswith(".parquet")))
    for name in names:
        yield _hf_download(FINEWEB_REPO, name)


def resolve_source(source: str, synthetic_mb: float, synthetic_seed: int) -> Corpus:
    inputs: list[dict] = []
    if source == "synthetic":
        return _synthetic(synthetic_mb, synthetic_seed)
    if source == "tinystories":
        train, valid = (_hf_download(TINYSTORIES_REPO, f) for f in TINYSTORIES_FILES)
        return Corpus("tinystories", f"{TINYSTORIES_REPO}: {' + '.join(TINYSTORIES_FILES)}",
                      _file_documents([train], inputs), inputs, _file_documents([valid], inputs),
                      f"the official validation file {TINYSTORIES_FILES[1]} is val")
    if source == "fineweb-edu":
        return Corpus("fineweb-edu", f"{FINEWEB_REPO} {FINEWEB_FOLDER} parquet shards, column "
                      "text", _file_documents(_fineweb_shards(), inputs), inputs)
    path = Path(source).expanduser()
    if not path.exists():
        if path.suffix in (".txt", ".parquet") or os.sep in source:
            raise UsageError(f"no such file or folder: {source}")
        raise UsageError(f"unknown source {source!r}; expected {', '.join(NAMED_SOURCES)}, "
                         f"or a .txt/.parquet file or folder")
    files = _local_files(path)
    stem = path.resolve().stem if path.is_file() else path.resolve().name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    return Corpus(name or "local", f"local {'folder' if path.is_dir() else 'file'} {path}",
                  _file_documents(files, inputs), inputs)
