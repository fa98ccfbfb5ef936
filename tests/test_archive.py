"""Study archives (qkstudy/archive.py): one compact file per study, the same bytes for the same
runs, a report built from it equal to the report of the runs, restored runs that a sweep skips,
and any damaged or foreign archive refused in one line with nothing written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import polars as pl
import pytest

from qkstudy.__main__ import main
from qkstudy.archive import ARCHIVED, SUFFIX, read_archive
from qkstudy.run_folder import find_runs


def tiny_sweep(data: str, runs: Path) -> list[str]:
    return ["sweep", "preset=demo", f"data={data}", f"runs_dir={runs}", "name=t", "depth=1",
            "d_model=16", "n_heads=2", "block_size=16", "batch_size=2", "max_steps=10",
            "warmup_steps=2", "eval_every=5", "eval_batches=1", "probe_every=5", "log_every=5",
            "ckpt_every=5", "divergence_window=5", "seeds=0,1", "lrs=1e-3,3", "jobs=1",
            "--no-notify"]


@pytest.fixture(scope="module")
def swept(tiny_data, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("archive") / "runs"
    assert main(tiny_sweep(tiny_data, runs)) == 0
    return runs / "t"


def test_an_archive_holds_every_finished_run_without_weights_and_is_reproducible(swept, tmp_path):
    a, b = tmp_path / "a" / f"t{SUFFIX}", tmp_path / "b" / f"t{SUFFIX}"
    assert main(["archive", str(swept), f"out={a}"]) == 0
    assert main(["archive", str(swept), f"out={b}"]) == 0
    assert a.read_bytes() == b.read_bytes()
    name, members = read_archive(a)
    assert name == "t"
    runs = {Path(p).parts[1] for p in members if p.endswith("/" + ARCHIVED)}
    assert runs == {r.path.name for r in find_runs(swept)} and len(runs) == 8
    assert not any(p.endswith((".safetensors", ".log", ".lock")) for p in members)


def test_a_restored_archive_archives_to_the_same_bytes_and_its_runs_are_skipped(
        swept, tiny_data, tmp_path, capsys):
    first = tmp_path / f"t{SUFFIX}"
    assert main(["archive", str(swept), f"out={first}"]) == 0
    elsewhere = tmp_path / "machine2"
    assert main(["archive", f"restore={first}", f"runs_dir={elsewhere}"]) == 0
    again = tmp_path / f"again{SUFFIX}"
    assert main(["archive", str(elsewhere / "t"), f"out={again}"]) == 0
    assert again.read_bytes() == first.read_bytes()
    capsys.readouterr()
    # the sweep on the new machine finds every run finished: nothing is trained again
    assert main(tiny_sweep(tiny_data, elsewhere)) == 0
    restored = find_runs(elsewhere / "t")
    assert len(restored) == 8  # a retrained run would have written its weights again
    assert not any((r.path / "final.safetensors").exists() for r in restored)
    assert main(["status", str(elsewhere / "t")]) == 0
    status = capsys.readouterr().out
    assert "damaged" not in status and "new" not in status.split()


def test_the_report_of_an_archive_equals_the_report_of_its_runs(swept, tmp_path):
    from analysis.__main__ import main as analysis
    path = tmp_path / f"t{SUFFIX}"
    assert main(["archive", str(swept), f"out={path}"]) == 0
    assert analysis(["report", str(swept), f"out={tmp_path / 'from-runs'}"]) == 0
    assert analysis(["report", str(path), f"out={tmp_path / 'from-archive'}"]) == 0
    tables = sorted((tmp_path / "from-runs" / "tables").glob("*.parquet"))
    assert len(tables) > 5
    for table in tables:
        a = pl.read_parquet(table)
        b = pl.read_parquet(tmp_path / "from-archive" / "tables" / table.name)
        if "run_dir" in a.columns:  # where the run was read from: the archive, named
            assert b["run_dir"].str.starts_with(f"{path}:").all()
            a, b = a.drop("run_dir"), b.drop("run_dir")
        assert a.equals(b, null_equal=True), table.name


def _tar(members: dict[str, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("content, message", [
    (b"not an archive", "is not a readable .tar.xz study archive"),
    (_tar({"t/../../evil.json": b"{}"}), "is not part of a study archive"),
    (_tar({"t/run/config.json": None}), "a link or device"),
    (_tar({"t/run/weights.bin": b"x"}), "is not part of a study archive"),
    (_tar({"a/sweep.json": b"{}", "b/sweep.json": b"{}"}), "holds 2 sweep folders"),
])
def test_a_damaged_or_foreign_archive_is_refused_in_one_line_before_anything_is_written(
        tmp_path, capsys, content, message):
    bad = tmp_path / f"bad{SUFFIX}"
    bad.write_bytes(content)
    target = tmp_path / "runs"
    assert main(["archive", f"restore={bad}", f"runs_dir={target}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and "python -m qkstudy archive" in err
    assert not target.exists()
    from analysis.__main__ import main as analysis
    assert analysis(["report", str(bad), f"out={tmp_path / 'rep'}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_a_thinned_archive_keeps_the_tables_and_its_restored_runs_stay_finished(
        swept, tiny_data, tmp_path, monkeypatch, capsys):
    """Metric rows every k-th step plus every evaluation and the last step: the report's
    tables do not change, a restored run is not taken for damaged, and a thinned run's record
    that cannot be read makes it damaged in one line."""
    from analysis.__main__ import main as analysis
    from qkstudy import archive, run_folder
    monkeypatch.setattr(archive, "ROWS", 3)  # 10 steps: k = 4, rows at 0, 4, 5, 8, 10
    path = tmp_path / f"t{SUFFIX}"
    assert main(["archive", str(swept), f"out={path}"]) == 0
    _, members = read_archive(path)
    completed = next(r for r in find_runs(swept) if "lr0.001" in r.path.name)
    steps = [s for p in sorted(members) if completed.path.name in p and "/metrics/" in p
             for s in pl.read_parquet(io.BytesIO(members[p]))["step"].to_list()]
    assert steps == [0, 4, 5, 8, 10]
    assert analysis(["report", str(swept), f"out={tmp_path / 'from-runs'}"]) == 0
    assert analysis(["report", str(path), f"out={tmp_path / 'from-archive'}"]) == 0
    for table in sorted((tmp_path / "from-runs" / "tables").glob("*.parquet")):
        a = pl.read_parquet(table).drop("run_dir", strict=False)
        b = pl.read_parquet(tmp_path / "from-archive" / "tables" / table.name).drop(
            "run_dir", strict=False)
        assert a.equals(b, null_equal=True), table.name

    elsewhere = tmp_path / "machine2"
    assert main(["archive", f"restore={path}", f"runs_dir={elsewhere}"]) == 0
    again = tmp_path / f"again{SUFFIX}"
    assert main(["archive", str(elsewhere / "t"), f"out={again}"]) == 0
    assert again.read_bytes() == path.read_bytes()
    restored = elsewhere / "t" / completed.path.name
    summary = run_folder.RunFolder(restored).finished()
    assert run_folder.finished_problem(restored, summary) is None
    capsys.readouterr()
    assert main(tiny_sweep(tiny_data, elsewhere)) == 0  # nothing retrained
    assert not any((r.path / "final.safetensors").exists() for r in find_runs(elsewhere / "t"))

    # a missing required row, or a record that does not say k, is a damaged run
    (restored / run_folder.ARCHIVED).write_text('{"metrics_every": "four"}')
    why = run_folder.finished_problem(restored, summary)
    assert "archived.json has metrics_every 'four'" in why and "restore the run" in why
    (restored / run_folder.ARCHIVED).write_text('{"metrics_every": 2}')
    assert "metrics/ lacks step 2" in run_folder.finished_problem(restored, summary)
