"""Tokenizers: GPT-2 BPE (tiktoken, obtainable offline) and raw UTF-8 bytes.

GPT-2 offline: tiktoken downloads its rank file on first use, which fails on a machine that
reaches only the package registries. The `r50k_base` encoding is GPT-2's, and the openai-whisper
sdist on PyPI (MIT) ships the very same rank file as `whisper/assets/gpt2.tiktoken`. So, as a
last resort, we fetch that sdist with pip, check the file's sha256 against the hash tiktoken
pins for r50k_base, and put it where tiktoken's cache looks (`TIKTOKEN_CACHE_DIR`, file name =
sha1 of the blob URL).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from unittest import mock
from typing import TYPE_CHECKING, Protocol

from ..errors import UsageError

if TYPE_CHECKING:
    import tiktoken

ENDOFTEXT = "<|endoftext|>"
# what tiktoken pins for r50k_base
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = "openai-whisper==20250625"
WHISPER_MEMBER = "whisper/assets/gpt2.tiktoken"
GPT2_CHECK = ("Hello world", [15496, 995])


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """256 byte symbols (UTF-8) plus end-of-text = 256. Needs nothing, fits any text."""

    name = "bytes"
    vocab_size = 257
    eot = 256

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if i == self.eot:
                out.append(run.decode("utf-8", errors="replace") + ENDOFTEXT)
                run = bytearray()
            else:
                run.append(int(i))
        return "".join(out) + run.decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE via tiktoken; encode_batch runs tiktoken's threads (it releases the GIL)."""

    name = "gpt2"
    vocab_size = 50257
    eot = 50256

    def __init__(self) -> None:
        self.encoding = _load_gpt2_encoding()
        # More threads than usable cores only adds contention (2 cores: 8 threads ran slower).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.num_threads = max(1, min(8, cores or 1))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=self.num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids])


def get_tokenizer(name: str) -> Tokenizer:
    """'gpt2' (50257 ids, eot 50256) or 'bytes' (257 ids, eot 256)."""
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise UsageError(f"unknown tokenizer {name!r}; expected gpt2 or bytes")


def cache_dir() -> Path:
    """Where tiktoken's rank files live: TIKTOKEN_CACHE_DIR, else a project cache dir (tiktoken's
    own default is a temp dir that the OS may wipe)."""
    env = os.environ.get("TIKTOKEN_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlx_gpt" / "tiktoken"


def _in_cache(where: Path | None):
    """tiktoken pointed at `where` for the duration (it reads the variable on every load)."""
    return mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": str(where)} if where else {})


def _load_gpt2_encoding() -> tiktoken.Encoding:
    try:
        import tiktoken
    except ImportError:
        raise UsageError("tokenizer gpt2 needs tiktoken: pip install tiktoken") from None
    cached = cache_dir() / hashlib.sha1(R50K_URL.encode()).hexdigest()
    # our cache first when it holds the file (no network attempt at all), then tiktoken's own
    # downloads (with the user's cache settings), then ours
    attempts = [("r50k_base", cache_dir())] if cached.exists() else []
    attempts += [("gpt2", None), ("r50k_base", None), ("r50k_base", cache_dir())]
    for name, where in attempts:
        try:
            with _in_cache(where):
                return _checked(tiktoken.get_encoding(name))
        except Exception:  # noqa: BLE001, S112 - no network, no requests, bad cache: next way
            continue
    install_r50k_from_whisper(cached, R50K_SHA256)
    with _in_cache(cache_dir()):
        return _checked(tiktoken.get_encoding("r50k_base"))


def _checked(encoding: tiktoken.Encoding) -> tiktoken.Encoding:
    text, expected = GPT2_CHECK
    got = encoding.encode_ordinary(text)
    if got != expected:
        raise UsageError(f"gpt2 tokenizer self-check failed: {text!r} -> {got}, not {expected}")
    return encoding


def install_r50k_from_whisper(target: Path, sha256: str) -> None:
    """Fetch the openai-whisper sdist with pip, verify its gpt2.tiktoken, store it at `target`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", WHISPER_SDIST, "-d", tmp]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        sdists = sorted(Path(tmp).glob("*.tar.gz"))
        if run.returncode != 0 or not sdists:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"cannot obtain the GPT-2 tokenizer: tiktoken's download failed and "
                             f"`pip download {WHISPER_SDIST}` failed too ({last})")
        with tarfile.open(sdists[0]) as tar:
            found = [m for m in tar.getmembers() if m.name.endswith("/" + WHISPER_MEMBER)]
            member = found[0] if found else None
            if member is None:
                raise UsageError(f"{sdists[0].name} has no {WHISPER_MEMBER}")
            data = tar.extractfile(member).read()
    store_verified(data, sha256, target, f"{WHISPER_MEMBER} from {WHISPER_SDIST}")


def store_verified(data: bytes, sha256: str, target: Path, what: str) -> None:
    """Write `data` to `target` only if its sha256 is the pinned one."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise UsageError(f"{what} has sha256 {actual}, but tiktoken pins {sha256} for r50k_base; "
                         f"refusing to use it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + f".{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, target)  # atomic: a concurrent reader never sees half a file
    except OSError as e:
        raise UsageError(f"cannot write tokenizer cache {target.parent}: {e.strerror}") from None
