"""Tokenizers, the synthetic corpus, `prepare` on local files, and its error handling."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qkstudy.data import load, sources, synthetic
from qkstudy.__main__ import main
from qkstudy.errors import UsageError
from qkstudy.data.tokenizer import ENDOFTEXT, get_tokenizer, store_verified

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"
VALID_SAMPLE_SHA256 = "5fc1fb0113df62b567fb271806cd645ce8d75f59c58ca0b764c03d3b6ff34ca6"
BYTES = get_tokenizer("bytes")


def stories(n: int, seed: int = 0) -> list[str]:
    return list(itertools.islice(synthetic.iter_stories(seed), n))


def prepare_ok(capsys, *args: str) -> dict:
    assert main(["prepare", *args]) == 0, capsys.readouterr().err
    out = next(a.split("=", 1)[1] for a in args if a.startswith("out="))
    return json.loads((Path(out) / "meta.json").read_text())


def read_split(folder: Path, split: str) -> np.ndarray:
    return np.fromfile(folder / f"{split}.bin", dtype="<u2")


def expected_ids(docs: list[str]) -> list[int]:
    """What a split should hold: eot before every document."""
    return [i for d in docs for i in [BYTES.eot, *d.encode()]]


def decode(ids) -> str:
    """Byte ids as text, each end-of-text id as ENDOFTEXT."""
    out, run = [], bytearray()
    for i in ids:
        if i == BYTES.eot:
            out.append(run.decode("utf-8", errors="replace") + ENDOFTEXT)
            run = bytearray()
        else:
            run.append(int(i))
    return "".join(out) + run.decode("utf-8", errors="replace")


def val_indices(n: int, f: float) -> set[int]:
    return {i for i in range(n) if int((i + 1) * f) > int(i * f)}


# ---------------------------------------------------------------- tokenizers


def test_bytes_round_trip():
    text = "Tom saw a café ☃ and said \"hi\".\n"
    ids = BYTES.encode_batch([text, ""])
    assert ids[1] == [] and all(0 <= i < 256 for i in ids[0]) and len(ids[0]) == len(text.encode())
    assert decode(ids[0] + [BYTES.eot] + ids[0]) == text + ENDOFTEXT + text
    assert (BYTES.vocab_size, BYTES.eot) == (257, 256)


def test_gpt2_hello_world():
    try:
        tok = get_tokenizer("gpt2")
    except UsageError as e:
        pytest.skip(f"GPT-2 ranks unobtainable here: {e}")
    assert tok.encode_batch(["Hello world", " world"]) == [[15496, 995], [995]]
    assert (tok.vocab_size, tok.eot) == (50257, 50256)
    assert tok.encoding.decode([15496, 995, 50256]) == "Hello world" + ENDOFTEXT


def test_tokenizer_file_with_wrong_hash_is_refused(tmp_path):
    blob = b"ranks"
    with pytest.raises(UsageError, match="refusing"):
        store_verified(blob, "0" * 64, tmp_path / "cache" / "key", "test blob")
    assert not (tmp_path / "cache" / "key").exists()
    store_verified(blob, hashlib.sha256(blob).hexdigest(), tmp_path / "cache" / "key", "test blob")
    assert (tmp_path / "cache" / "key").read_bytes() == blob


def test_unknown_tokenizer():
    with pytest.raises(UsageError, match="unknown tokenizer"):
        get_tokenizer("sentencepiece")


# ---------------------------------------------------------------- synthetic corpus


def test_synthetic_is_deterministic_and_prefix_stable():
    assert stories(30, seed=7) == stories(30, seed=7)
    assert stories(30, seed=7) != stories(30, seed=8)
    # Story i does not depend on how many are asked for.
    assert stories(10, seed=7) == stories(30, seed=7)[:10]
    text = synthetic.generate_text(20_000, seed=7)
    assert sum(map(len, text)) >= 20_000 and text == stories(len(text), seed=7)


@pytest.mark.parametrize("seed, sha256", [
    (0, "02208ee7e1bf642ecca47931c5cf543e9131b524d92f68eb49b94e73e20c0e6f"),
    (5, "514eab938013be02eb7a82770538357b10693257c3ca45b5c439adee9a7d4aab")])
def test_synthetic_corpus_is_byte_identical(seed, sha256):
    """The published results were trained on these bytes: the generator must keep them."""
    text = f"\n{ENDOFTEXT}\n".join(synthetic.generate_text(300_000, seed)).encode()
    assert hashlib.sha256(text).hexdigest() == sha256


def test_synthetic_has_variety_and_consistent_names():
    many = stories(2000, seed=1)
    sentences = {s for story in many for s in re.split(r"(?<=[.!?\"])\s+", story)}
    assert len(set(many)) == 2000
    assert len(sentences) > 10_000, len(sentences)
    for story in many[:200]:
        assert "{" not in story and "}" not in story
        hero = re.search(r"named (\w+)|called (\w+)|^(\w+) was a", story)
        assert hero, story[:80]
        name = next(g for g in hero.groups() if g)
        assert story.count(name) >= 3  # the hero is carried through the plot, not forgotten


# ---------------------------------------------------------------- prepare: local files


def test_prepare_txt_with_endoftext(tmp_path, capsys):
    docs = stories(40)
    src = tmp_path / "corpus.txt"
    src.write_text(f"\n{ENDOFTEXT}\n".join(docs) + f"\n{ENDOFTEXT}\n")
    out = tmp_path / "prepared"
    meta = prepare_ok(capsys, str(src), f"out={out}", "tokenizer=bytes", "val_fraction=0.25")
    assert "prepared" in capsys.readouterr().out

    val_idx = val_indices(len(docs), 0.25)
    assert len(val_idx) == 10
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    assert read_split(out, "train").tolist() == expected_ids(train)
    assert read_split(out, "val").tolist() == expected_ids(val)
    assert decode(read_split(out, "val")) == "".join(ENDOFTEXT + d for d in val)

    assert meta["tokenizer"] == "bytes" and meta["vocab_size"] == 257 and meta["eot"] == 256
    assert (meta["train_documents"], meta["val_documents"]) == (30, 10)
    assert meta["train_tokens"] == len(expected_ids(train))
    assert meta["val_tokens"] == len(expected_ids(val))
    blob = src.read_bytes()
    assert meta["inputs"] == [{"path": str(src), "bytes": len(blob),
                               "sha256": hashlib.sha256(blob).hexdigest()}]
    assert "floor" in meta["split"] and meta["created"]

    train_mm, val_mm, meta2 = load.load_tokens(out)
    assert train_mm.dtype == np.uint16 and len(train_mm) == meta["train_tokens"] and meta2 == {
        **meta, "tokens_sha256": meta2["tokens_sha256"]}  # computed on load
    assert val_mm.tolist() == read_split(out, "val").tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "prepared"]


def test_txt_blank_lines_and_chunk_boundaries(tmp_path, monkeypatch):
    docs = ["First story.\nSecond line of it.", "Another one,  with spaces.", "Third\n  indented."]
    src = tmp_path / "blank.txt"
    src.write_text("\n\n".join(docs) + "\n\n \n\n" + docs[0] + "\n")
    whole = list(sources._txt_documents(src, []))
    assert whole == docs + [docs[0]]
    # A separator cut by a read boundary must still split documents in the same places.
    for size in (1, 3, 7, 16):
        monkeypatch.setattr(sources, "READ_CHARS", size)
        assert list(sources._txt_documents(src, [])) == whole


def test_prepare_parquet_and_folder(tmp_path, capsys):
    docs = stories(30, seed=3)
    folder = tmp_path / "shards"
    folder.mkdir()
    texts = docs[:15] + [None, "   "]  # missing and blank rows are skipped
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), folder / "a.parquet")
    (folder / "b.txt").write_text(f"\n{ENDOFTEXT}\n".join(docs[15:]))
    (folder / "notes.md").write_text("ignored")

    out = tmp_path / "out"
    meta = prepare_ok(capsys, str(folder), f"out={out}", "tokenizer=bytes", "val_fraction=0.2")
    val_idx = val_indices(30, 0.2)
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    assert read_split(out, "train").tolist() == expected_ids(train)
    assert read_split(out, "val").tolist() == expected_ids([docs[i] for i in sorted(val_idx)])
    assert [Path(i["path"]).name for i in meta["inputs"]] == ["a.parquet", "b.txt"]
    shard = (folder / "a.parquet").read_bytes()
    assert meta["inputs"][0]["sha256"] == hashlib.sha256(shard).hexdigest()


def test_prepare_synthetic_and_cap(tmp_path, capsys):
    out = tmp_path / "syn"
    meta = prepare_ok(capsys, "synthetic", f"out={out}", "tokenizer=bytes", "size_mb=0.05",
                      "val_fraction=0.1")
    text = "".join(ENDOFTEXT + s for s in synthetic.generate_text(50_000, seed=0))
    both = decode(read_split(out, "train")) + decode(read_split(out, "val"))
    assert sorted(both.split(ENDOFTEXT)) == sorted(text.split(ENDOFTEXT))
    assert meta["text_bytes"] >= 50_000
    written = f"\n{ENDOFTEXT}\n".join(synthetic.generate_text(50_000, seed=0)).encode()
    assert meta["inputs"][0]["sha256"] == hashlib.sha256(written).hexdigest()

    capped = tmp_path / "capped"
    meta = prepare_ok(capsys, "synthetic", f"out={capped}", "tokenizer=bytes", "size_mb=0.05",
                      "val_fraction=0.5", "max_tokens=3000")
    total = meta["train_tokens"] + meta["val_tokens"]
    assert 3000 <= total < 3000 + 2000  # stops after the document that reaches the cap


def test_existing_prepared_folder_is_replaced_only_on_success(tmp_path, capsys):
    out = tmp_path / "out"
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(stories(20)))
    prepare_ok(capsys, str(src), f"out={out}", "tokenizer=bytes", "val_fraction=0.25")
    before = read_split(out, "train").tolist()

    (tmp_path / "tiny.txt").write_text("too short")
    assert main(["prepare", str(tmp_path / "tiny.txt"), f"out={out}", "tokenizer=bytes"]) == 2
    assert read_split(out, "train").tolist() == before  # the failed run did not touch it

    src.write_text("\n\n".join(stories(20, seed=5)))
    prepare_ok(capsys, str(src), f"out={out}", "tokenizer=bytes", "val_fraction=0.25")
    assert read_split(out, "train").tolist() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out", "tiny.txt"]


# ---------------------------------------------------------------- prepare: bad input


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    (tmp_path / "short.txt").write_text("Once upon a time.\n\nThe end.")
    pq.write_table(pa.table({"body": ["a story"]}), tmp_path / "notext.parquet")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad" * 100)
    (tmp_path / "data.csv").write_text("text\nhello\n")
    big = tmp_path / "big.txt"
    big.write_text("\n\n".join(stories(10)))
    return {
        "missing": ([str(tmp_path / "nope.txt")], "no such file"),
        "empty": ([str(tmp_path / "empty.txt")], "no documents"),
        "short": ([str(tmp_path / "short.txt")], "need at least 257"),
        "unknown source": (["wikipedia"], "unknown source"),
        "no text column": ([str(tmp_path / "notext.parquet")], "no 'text' column"),
        "unwritable": ([str(big), f"out={tmp_path / 'afile' / 'sub'}"], "cannot write output"),
        "not utf-8": ([str(tmp_path / "binary.txt")], "not UTF-8"),
        "csv": ([str(tmp_path / "data.csv")], "unsupported file type"),
        "unknown key": ([str(big), "colour=red"], "unknown key"),
        "bad tokenizer": ([str(big), "tokenizer=bpe"], "tokenizer must be"),
        "bad fraction": ([str(big), "val_fraction=0"], "val_fraction"),
        "not key=value": ([str(big), "out"], "expected key=value"),
        "keys before source": (["tokenizer=bytes", "synthetic"], "SOURCE first"),
    }


def test_bad_inputs_exit_2_with_one_line_and_leave_nothing(tmp_path, capsys):
    for name, (args, message) in bad_inputs(tmp_path).items():
        before = sorted(p.name for p in tmp_path.iterdir())
        keys = {a.split("=")[0] for a in args[1:]}
        args += [] if "out" in keys else [f"out={tmp_path / 'new' / 'prepared'}"]
        args += [] if "tokenizer" in keys else ["tokenizer=bytes"]
        code = main(["prepare", *args])
        err = capsys.readouterr().err
        assert code == 2, name
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (name, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, name  # nothing half-written


def test_refuses_to_replace_a_folder_it_did_not_write(tmp_path, capsys):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "thesis.tex").write_text("precious")
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(stories(10)))
    assert main(["prepare", str(src), f"out={keep}", "tokenizer=bytes"]) == 2
    assert "not a prepared data folder" in capsys.readouterr().err
    assert (keep / "thesis.tex").read_text() == "precious"


def test_load_tokens_errors_name_the_problem(tmp_path):
    with pytest.raises(UsageError, match="prepare synthetic tokenizer=bytes"):
        load.load_tokens(tmp_path / "synthetic-bytes")
    (tmp_path / "x").mkdir()
    with pytest.raises(UsageError, match="has no meta.json"):
        load.load_tokens(tmp_path / "x")
    (tmp_path / "x" / "meta.json").write_text(json.dumps({"train_tokens": 5, "val_tokens": 5}))
    (tmp_path / "x" / "train.bin").write_bytes(b"\0" * 10)
    with pytest.raises(UsageError, match="no val.bin"):
        load.load_tokens(tmp_path / "x")
    (tmp_path / "x" / "val.bin").write_bytes(b"\0" * 8)
    with pytest.raises(UsageError, match="holds 4 tokens but meta.json says 5"):
        load.load_tokens(tmp_path / "x")


# ---------------------------------------------------------------- real TinyStories text


@pytest.mark.skipif(not (SHARED / "valid_sample.txt").exists(), reason="no TinyStories sample")
def test_prepare_tinystories_valid_sample(tmp_path, capsys):
    src = SHARED / "valid_sample.txt"
    out = tmp_path / "ts"
    meta = prepare_ok(capsys, str(src), f"out={out}", "tokenizer=bytes")
    docs = list(sources._txt_documents(src, []))
    assert len(docs) > 1000 and meta["train_documents"] + meta["val_documents"] == len(docs)
    val_idx = val_indices(len(docs), 0.01)
    val = [d for i, d in enumerate(docs) if i in val_idx]
    assert decode(read_split(out, "val")) == "".join(ENDOFTEXT + d for d in val)
    assert meta["inputs"][0]["sha256"] == VALID_SAMPLE_SHA256


# ---------------------------------------------------------------- downloads, served locally


def test_tinystories_uses_the_official_valid_file(tmp_path, monkeypatch, capsys):
    train_docs, valid_docs = stories(12, seed=1), stories(4, seed=2)
    files = {}
    for name, docs in zip(sources.TINYSTORIES_FILES, (train_docs, valid_docs), strict=True):
        files[name] = tmp_path / name
        files[name].write_text(f"\n{ENDOFTEXT}\n".join(docs))
    monkeypatch.setattr(sources, "_hf_download", lambda repo, name: files[name])
    out = tmp_path / "ts"
    meta = prepare_ok(capsys, "tinystories", f"out={out}", "tokenizer=bytes", "val_fraction=0.5")
    assert read_split(out, "train").tolist() == expected_ids(train_docs)  # val_fraction ignored
    assert read_split(out, "val").tolist() == expected_ids(valid_docs)
    assert meta["val_fraction"] is None and sources.TINYSTORIES_FILES[1] in meta["split"]
    assert [Path(i["path"]).name for i in meta["inputs"]] == list(sources.TINYSTORIES_FILES)


def test_fineweb_stops_reading_shards_at_the_cap(tmp_path, monkeypatch, capsys):
    shards = []
    for k in range(3):
        shards.append(tmp_path / f"{k:03d}.parquet")
        pq.write_table(pa.table({"text": stories(10, seed=k)}), shards[-1])
    served = []

    def fake_shards():
        for shard in shards:
            served.append(shard)
            yield shard

    monkeypatch.setattr(sources, "_fineweb_shards", fake_shards)
    out = tmp_path / "fw"
    meta = prepare_ok(capsys, "fineweb-edu", f"out={out}", "tokenizer=bytes", "val_fraction=0.2",
                      "max_tokens=8000")
    assert served == shards[:2]  # the third shard is never fetched
    assert 8000 <= meta["train_tokens"] + meta["val_tokens"] < 8000 + 2000
    assert meta["max_tokens"] == 8000 and len(meta["inputs"]) == 2
