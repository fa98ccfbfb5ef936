"""The run folder has one owner: qkstudy/run_folder.py spells its file names, nothing else does;
its lock leaves nothing behind and a full disk at the lock is one line; its states."""

from __future__ import annotations

import ast
import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qkstudy import locks, run_folder
from qkstudy.errors import UsageError
from qkstudy.files import write_json
from qkstudy.summaries import summary_problem
from qkstudy.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "qkstudy" / "run_folder.py"
# a name anywhere in a string: the files; a whole string joined onto a path (`d / "metrics"`):
# the folders, which are common words elsewhere (a dict key "probes")
FILE_NAMES = ("config.json", "summary.json", "manifest.json", "checkpoint.safetensors",
              "final.safetensors", "traceback.txt", "metrics/", "probes/", "sweep.json",
              "sweep-{host}", "-processes.json", "-speeds.json", "-worker-", "submission.json",
              "tasks.txt", "array.sbatch", "comparison.json")
LOCK = re.compile(r"(?:^|[/\s\"'`])\.lock\b")  # the file, not a call of .lock()
FOLDERS = {"metrics", "probes"}


def source_files() -> list[Path]:
    """Every Python module of the project but the tests and the owner."""
    skip = {"tests", ".venv", "build", "dist"}
    return [p for p in sorted(ROOT.rglob("*.py")) if p != OWNER
            and not skip & set(p.relative_to(ROOT).parts) and ".git" not in p.parts]


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled(path: Path) -> list[str]:
    """'file:line: text' for each string (docstrings aside) that spells a run-folder name."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    joined = {id(node.right) for node in ast.walk(tree)
              if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        text = node.value
        if any(name in text for name in FILE_NAMES) or LOCK.search(text) or (text in FOLDERS and id(node) in joined):
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            out.append(f"{where}:{node.lineno}: {text!r}")
    return out


def test_no_module_but_the_owner_spells_a_run_folder_name():
    found = [line for path in source_files() for line in spelled(path)]
    assert not found, "spell these through qkstudy.run_folder.RunFolder:\n" + "\n".join(found)


def test_the_scan_sees_a_name_and_passes_over_a_docstring(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Reads summary.json."""\n\ndef f(d):\n    """config.json too."""\n'
                      '    return d / "metrics", f"{d}/summary.json", d / ".lock"\n')
    assert [line.split(": ", 1)[1] for line in spelled(module)] == [
        "'metrics'", "'/summary.json'", "'.lock'"]
    module.write_text('x = {"probes": 1}\n')  # the word as a key is not the folder
    assert spelled(module) == []


def test_the_lock_is_exclusive_and_leaves_no_file(tmp_path):
    folder = RunFolder(tmp_path)
    with folder.lock() as held:
        assert held and folder.lock_file.read_text() == f"{os.getpid()}\n"
        with folder.lock() as again:  # a second open file: flock sees another holder
            assert not again
        assert locks.holder(folder.lock_file, locks.flock_holders()) in (os.getpid(), None)
    assert not folder.lock_file.exists()


def test_a_lock_file_left_by_a_killed_process_is_taken_over(tmp_path):
    code = ("import os, signal, sys; from pathlib import Path\n"
            "from qkstudy.run_folder import RunFolder\n"
            "with RunFolder(Path(sys.argv[1])).lock():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={
        **os.environ, "PYTHONPATH": str(ROOT)})
    folder = RunFolder(tmp_path)
    assert done.returncode == -9 and folder.lock_file.exists()
    assert locks.holder(folder.lock_file, locks.flock_holders()) is None
    with folder.lock() as held:
        assert held
    assert not folder.lock_file.exists()


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock(tmp_path, monkeypatch):
    real = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    folder = RunFolder(tmp_path)
    with pytest.raises(UsageError, match="cannot write the run lock .*No space left on device; "
                                         "free some space"):
        with folder.lock():
            pass
    monkeypatch.setattr(os, "write", real)
    assert not folder.lock_file.exists()


def test_a_finished_run_is_checked_against_its_rows(tmp_path):
    folder = RunFolder(tmp_path / "r")
    assert not folder.is_run() and folder.intact_summary() is None
    folder.path.mkdir()
    write_json(folder.config_file, {"run_id": "r"})
    assert folder.is_run() and folder.intact_summary() is None
    folder.write_rows([{"step": 0, "tokens": 0, "lr": 0.1, "train_loss": 1.0}], [])
    write_json(folder.summary_file, {"status": "failed", "run_id": "r"})
    assert folder.intact_summary() is None
    write_json(folder.summary_file, {"status": "completed", "run_id": "r", "steps": 0})
    assert folder.intact_summary()["steps"] == 0
    write_json(folder.summary_file, {"status": "completed", "run_id": "r", "steps": 5})
    with pytest.raises(run_folder.DamagedRun, match="metrics/ ends at step 0"):
        folder.intact_summary()


@pytest.mark.parametrize("summary, why", [
    ({}, "has steps=None, not a step count"), ({"steps": -1}, "has steps=-1, not a step count"),
    ({"steps": 3, "init_loss": "x"}, "has init_loss='x', not a number"),
    ({"steps": 3, "diverged_step": 1.5}, "has diverged_step=1.5, not a step"),
    ({"steps": 3, "tokens_seen": -1}, "has tokens_seen=-1, not a count"),
    ({"steps": 3, "min_val_loss": None}, None),  # null, or missing as in older runs: fine
])
def test_a_finished_summary_is_checked_by_the_kinds_of_its_fields(summary, why):
    assert summary_problem({"status": "completed", **summary}, Path("r")) == why


def test_a_run_is_finished_by_one_rule_read_at_three_depths(tmp_path):
    from qkstudy.run_folder import Outcome

    folder = RunFolder(tmp_path / "r")
    assert folder.outcome() is Outcome.PENDING and folder.finished() is None  # no folder yet
    folder.path.mkdir()
    folder.write_rows([{"step": 0, "tokens": 0, "lr": 0.1, "train_loss": 1.0}], [])
    for status, finished in (("completed", True), ("diverged", True), ("failed", False)):
        write_json(folder.summary_file, {"status": status, "run_id": "r", "steps": 0})
        assert folder.outcome() is Outcome(status) and folder.outcome().finished is finished
        assert (folder.finished() is not None) is finished
        assert (folder.intact_summary() is not None) is finished
    # what the sweep plans by is the status recorded; the checked reads refuse a damaged summary
    write_json(folder.summary_file, {"status": "completed", "run_id": "r", "steps": "x"})
    assert folder.outcome() is Outcome.COMPLETED
    with pytest.raises(run_folder.DamagedRun, match="not a step count"):
        folder.finished()
    for unknown in ({"status": "running"}, {"status": ["completed"]}, {}):
        write_json(folder.summary_file, unknown)
        assert folder.outcome() is Outcome.PENDING
    folder.summary_file.write_text("{not json")
    assert folder.outcome() is Outcome.PENDING


def test_run_folders_are_found_one_way_at_any_depth_or_in_one_sweep(tmp_path):
    from qkstudy.run_folder import SweepFolder, find_runs, run_folders

    sweep = tmp_path / "runs" / "study"
    for name, file in (("a", "config.json"), ("b", "summary.json"), (".damaged/c", "config.json"),
                       ("slurm/001", "tasks.txt"), ("a/metrics", "part-0-0.parquet")):
        (sweep / name).mkdir(parents=True, exist_ok=True)
        (sweep / name / file).write_text("{}")
    (sweep / "d").mkdir()  # an empty folder is no run
    runs = [sweep / "a", sweep / "b"]
    assert [f.path for f in find_runs(tmp_path / "runs")] == runs  # any depth, hidden skipped
    assert [f.path for f in run_folders(sweep)] == runs == [
        f.path for f in find_runs(sweep, nested=False)]
    assert [f.path for f in find_runs(sweep / "a")] == [sweep / "a"]  # a run folder itself
    assert run_folders(tmp_path / "runs") == []  # a tree of sweeps holds no run as a child
    assert SweepFolder(sweep).is_sweep() and not SweepFolder(tmp_path / "runs").is_sweep()
