"""A run's rows on disk: immutable Parquet parts, part-<first step>-<last step>.parquet."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .files import atomic


def write_part(folder: Path, rows: list[dict], schema: pa.Schema) -> Path | None:
    if not rows:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in rows]
    path = folder / f"part-{min(steps):08d}-{max(steps):08d}.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic(path, "wb") as f:
        pq.write_table(table, f)
    return path


_PART = re.compile(r"part-(\d+)-(\d+)\.parquet")


def parts(folder: Path) -> list[tuple[int, Path]]:
    """(first step, path) of each part in `folder`, in step order."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _PART.fullmatch(p.name))]
    return sorted(found)


def read_parts(folder: Path) -> pa.Table | None:
    found = parts(folder)
    if not found:
        return None
    return pa.concat_tables((pq.read_table(p) for _, p in found), promote_options="default")


def part_steps(folder: Path) -> tuple[list[int], str | None]:
    """Every row's step in the folder's parts, or why a part cannot be read."""
    steps: list[int] = []
    for _, part in parts(folder):
        try:
            steps += pq.read_table(part, columns=["step"]).column("step").to_pylist()
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            return [], f"{folder.name}/{part.name} is unreadable ({type(e).__name__})"
    return steps, None


def coverage(folder: Path, expected: list[int], once: bool = True) -> str | None:
    """What is off unless the folder's rows hold exactly the steps `expected` (each once, or
    any number of times with once=False), else None."""
    steps, why = part_steps(folder)
    return why or steps_cover(folder.name, steps, expected, once)


def steps_cover(name: str, steps: list[int], expected: list[int], once: bool = True):
    if not once:
        steps = sorted(set(steps))
    if sorted(steps) == expected:
        return None
    missing = sorted(set(expected) - set(steps))
    extra = sorted(set(steps) - set(expected)) or sorted({s for s in steps if steps.count(s) > 1})
    said = ([f"lacks step {missing[0]}"] if missing else []) + (
        [f"has extra rows at step {extra[0]}"] if extra else [])
    return f"{name}/ {' and '.join(said)} ({len(missing)} missing, {len(extra)} extra)"
