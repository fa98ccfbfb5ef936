"""`python -m qkstudy archive`: finished runs as a reproducible .tar.xz (docs/outputs.md)."""

from __future__ import annotations

import io
import json
import lzma
import math
import tarfile
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from . import files
from .config import split_key_values
from .errors import UsageError
from .run_folder import (ARCHIVED, CONFIG, MANIFEST, METRICS, PART, PLAN, PROBES, SUMMARY,
                         find_runs, part_steps)

ROWS = 60  # metric rows an archived run keeps besides its evaluations: every k-th step
SWEEP_FILES = (PLAN,)
RUN_FILES = (CONFIG, SUMMARY, MANIFEST, ARCHIVED)
MAX_MEMBER_BYTES = 64 << 20  # no file the tool writes into these folders comes near this
MAX_TOTAL_BYTES = 1 << 30
SUFFIX = ".tar.xz"

USAGE = """usage: python -m qkstudy archive SWEEP_DIR [out=FILE.tar.xz]
       python -m qkstudy archive restore=FILE.tar.xz [runs_dir=runs]

The first form writes the sweep folder's finished runs (configs, summaries, manifests, metrics
and probes; no weights or checkpoints) to one .tar.xz (default results/<name of SWEEP_DIR>.tar.xz),
byte-identical for the same runs. The second unpacks an archive into runs_dir/<its sweep>,
leaving every run folder already there as it is; a sweep there then skips the archived runs.
`just report FILE.tar.xz` builds the report from an archive directly."""


def _members(sweep_dir: Path) -> list[tuple[str, bytes]]:
    name = sweep_dir.name
    out = [(f"{name}/{f}", (sweep_dir / f).read_bytes()) for f in SWEEP_FILES
           if (sweep_dir / f).is_file()]
    for run in find_runs(sweep_dir):
        try:
            done = run.finished()
        except UsageError as e:
            raise UsageError(f"cannot archive {sweep_dir}: {e}") from None
        if not done:
            continue
        rel = run.path.relative_to(sweep_dir).as_posix()
        if "/" in rel:
            raise UsageError(f"cannot archive {sweep_dir}: run folder {rel} is not directly in it")
        for f in (CONFIG, SUMMARY, MANIFEST):
            if (run.path / f).is_file():
                out.append((f"{name}/{rel}/{f}", (run.path / f).read_bytes()))
        last = max(part_steps(run.path / METRICS)[0])
        record = {"left_out": sorted(p.name for p in run.path.glob("*.safetensors"))}
        if (run.path / ARCHIVED).is_file():  # restored from an archive, checked by finished()
            record = json.loads((run.path / ARCHIVED).read_bytes())
        every = record.get("metrics_every") or max(1, math.ceil(last / ROWS))
        for folder in (METRICS, PROBES):
            for part in sorted((run.path / folder).glob("part-*.parquet")):
                rows = (every, last) if folder == METRICS else None
                out.append((f"{name}/{rel}/{folder}/{part.name}", _plain_parquet(part, rows)))
        record["metrics_every"] = every
        out.append((f"{name}/{rel}/{ARCHIVED}",
                    json.dumps(record, sort_keys=True).encode() + b"\n"))
    return sorted(out)


def _plain_parquet(path: Path, thin: tuple[int, int] | None = None) -> bytes:
    """A part uncompressed (xz over the archive does better), `thin` = (k, last step)."""
    table = pq.read_table(path)
    if thin is not None:
        every, last = thin
        step = table.column("step").to_numpy()
        evaluated = table.column("val_loss").is_valid().to_numpy(zero_copy_only=False)
        table = table.filter(pa.array((step % every == 0) | evaluated | (step == last)))
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="NONE")
    return buffer.getvalue()


def write_archive(sweep_dir: Path, out: Path) -> int:
    if not (sweep_dir / PLAN).is_file() and not find_runs(sweep_dir):
        raise UsageError(f"{sweep_dir} holds no {PLAN} and no run folder: give a sweep folder "
                         "(runs/<name>)")
    members = _members(sweep_dir)
    buffer = io.BytesIO()
    with lzma.open(buffer, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in members:
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    out.parent.mkdir(parents=True, exist_ok=True)
    with files.atomic(out, "wb") as f:
        f.write(buffer.getvalue())
    return sum(1 for p, _ in members if p.endswith("/" + ARCHIVED))


def _allowed(parts: tuple[str, ...]) -> bool:
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return False
    if len(parts) == 2:
        return parts[1] in SWEEP_FILES
    if len(parts) == 3:
        return parts[2] in RUN_FILES
    return len(parts) == 4 and parts[2] in (METRICS, PROBES) and bool(PART.fullmatch(parts[3]))


def read_archive(path: Path) -> tuple[str, dict[str, bytes]]:
    """(the sweep's folder name, {relative path: bytes}) of a checked archive."""
    repair = (f"fetch it again or rebuild it from its runs (python -m qkstudy archive "
              f"runs/<sweep> out={path})")
    try:
        with tarfile.open(path, mode="r:xz") as tar:
            out: dict[str, bytes] = {}
            total = 0
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isdir():
                    continue
                if not member.isfile() or not _allowed(parts):
                    raise UsageError(f"{path}: member {member.name!r} is not part of a study "
                                     f"archive ({'a link or device' if not member.isfile() else 'unexpected path'}); "
                                     f"{repair}")
                if member.size > MAX_MEMBER_BYTES or total + member.size > MAX_TOTAL_BYTES:
                    raise UsageError(f"{path}: member {member.name!r} is {member.size:,} bytes, "
                                     f"more than a study archive holds; {repair}")
                total += member.size
                out[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    except FileNotFoundError:
        raise UsageError(f"archive {path} does not exist") from None
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        if isinstance(e, OSError) and files.io_failure(e):
            raise
        raise UsageError(f"{path} is not a readable .tar.xz study archive ({type(e).__name__}: "
                         f"{e}); {repair}") from None
    names = {PurePosixPath(p).parts[0] for p in out}
    if len(names) != 1:
        raise UsageError(f"{path} holds {len(names)} sweep folders ({', '.join(sorted(names)) or 'none'}), "
                         f"not one; {repair}")
    return names.pop(), out


def extract(path: Path, runs_dir: Path) -> tuple[Path, int, int]:
    """Unpack into runs_dir/<sweep>, keeping run folders there: (folder, restored, present)."""
    name, members = read_archive(path)
    sweep_dir = runs_dir / name
    runs = {PurePosixPath(p).parts[1] for p in members if len(PurePosixPath(p).parts) > 2}
    present = {r for r in runs if (sweep_dir / r).exists()}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    for p, data in members.items():
        parts = PurePosixPath(p).parts
        if len(parts) == 2 and (sweep_dir / parts[1]).exists():
            continue  # a plan of the runs there is theirs
        if len(parts) > 2 and parts[1] in present:
            continue
        target = runs_dir.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with files.atomic(target, "wb") as f:
            f.write(data)
    return sweep_dir, len(runs) - len(present), len(present)


def cli(argv: list[str]) -> int:
    words = [a for a in argv if "=" in a]
    given = [a for a in argv if "=" not in a]
    pairs = split_key_values(words)
    unknown = set(pairs) - {"out", "restore", "runs_dir"}
    if unknown:
        raise UsageError(f"unknown key {sorted(unknown)[0]!r}; keys: out=, restore=, runs_dir=")
    if "restore" in pairs:
        if given or "out" in pairs:
            raise UsageError("restore= takes no SWEEP_DIR and no out=: python -m qkstudy archive "
                             "restore=FILE.tar.xz [runs_dir=runs]")
        sweep_dir, restored, kept = extract(Path(pairs["restore"]), Path(pairs.get("runs_dir",
                                                                                    "runs")))
        print(f"restored {restored} runs into {sweep_dir}"
              + (f" ({kept} already there, kept as they were)" if kept else ""))
        return 0
    if len(given) != 1 or "runs_dir" in pairs:
        raise UsageError("give one sweep folder: python -m qkstudy archive runs/<sweep> "
                         "[out=FILE.tar.xz]")
    sweep_dir = Path(given[0])
    if not sweep_dir.is_dir():
        raise UsageError(f"sweep folder {sweep_dir} does not exist")
    out = Path(pairs.get("out") or Path("results") / f"{sweep_dir.resolve().name}{SUFFIX}")
    if not out.name.endswith(SUFFIX):
        raise UsageError(f"out= must name a {SUFFIX} file, not {out}")
    n = write_archive(sweep_dir, out)
    print(f"archived {n} finished runs of {sweep_dir} in {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0
