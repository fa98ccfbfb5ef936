"""Tokenizers: raw UTF-8 bytes and GPT-2 BPE (tiktoken; r50k fallback: docs/data.md)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from ..errors import UsageError
from ..files import atomic

if TYPE_CHECKING:
    import tiktoken

ENDOFTEXT = "<|endoftext|>"
# what tiktoken pins for r50k_base
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = "openai-whisper==20250625"
WHISPER_MEMBER = "whisper/assets/gpt2.tiktoken"
GPT2_CHECK = ("Hello world", [15496, 995])


class ByteTokenizer:
    """256 byte symbols (UTF-8) plus end-of-text = 256. Needs nothing, fits any text."""

    name = "bytes"
    vocab_size = 257
    eot = 256

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]


class GPT2Tokenizer:
    """GPT-2 BPE via tiktoken; encode_batch runs tiktoken's threads (it releases the GIL)."""

    name = "gpt2"
    vocab_size = 50257
    eot = 50256

    def __init__(self) -> None:
        self.encoding = _load_gpt2_encoding()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.num_threads = max(1, min(8, cores or 1))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=self.num_threads)


Tokenizer = ByteTokenizer | GPT2Tokenizer
# a prepared corpus's folder ends in -<tokenizer name>: its vocabulary before it is prepared
VOCAB_BY_TOKENIZER = {t.name: t.vocab_size for t in (ByteTokenizer, GPT2Tokenizer)}


def get_tokenizer(name: str) -> Tokenizer:
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise UsageError(f"unknown tokenizer {name!r}; expected gpt2 or bytes")


def cache_dir() -> Path:
    """TIKTOKEN_CACHE_DIR, else a cache dir the OS does not wipe (tiktoken's default may be)."""
    env = os.environ.get("TIKTOKEN_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlx_gpt" / "tiktoken"


def _in_cache(where: Path | None):
    return mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": str(where)} if where else {})


def _load_gpt2_encoding() -> tiktoken.Encoding:
    try:
        import tiktoken
    except ImportError:
        raise UsageError("tokenizer gpt2 needs tiktoken: pip install tiktoken") from None
    cached = cache_dir() / hashlib.sha1(R50K_URL.encode()).hexdigest()
    # our cache when it holds the file, then tiktoken's downloads, then ours
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
            if not found:
                raise UsageError(f"{sdists[0].name} has no {WHISPER_MEMBER}")
            data = tar.extractfile(found[0]).read()
    store_verified(data, sha256, target, f"{WHISPER_MEMBER} from {WHISPER_SDIST}")


def store_verified(data: bytes, sha256: str, target: Path, what: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise UsageError(f"{what} has sha256 {actual}, but tiktoken pins {sha256} for r50k_base; "
                         f"refusing to use it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic(target, "wb") as f:
            f.write(data)
    except OSError as e:
        raise UsageError(f"cannot write tokenizer cache {target.parent}: {e.strerror}") from None
