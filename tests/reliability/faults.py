"""I/O-error and crash tests at every file operation, in the manner of SQLite's: each command is
run once to count its file operations (fault_injection.py), then again with operation N
failing, for each N, with "No space left on device" (ENOSPC), with an I/O error (EIO) and, for
train and sweep, with a kill -9, a SIGINT (Ctrl-C) and a SIGTERM just before it.

    python -m tests.reliability faults [cases=prepare,train,sweep,report,status,slurm] [every=true]
                                       [sample=K] [kinds=ENOSPC,EIO,KILL,SIGINT,SIGTERM] [work=DIR]
                                       [keep=false]

After each injected error: exit code 2, exactly one `error:` line on stderr and no traceback, no
lock or temporary file left, and every file that existed before byte-identical. After SIGINT or
SIGTERM: exit code 130 or 143 and a line saying it was interrupted, no lock or temporary file
left. After a kill -9: nothing checked but what follows. Then the same command, the fault lifted, must exit 0 and
leave the same result as an undisturbed run: run folders by their rows, probes, config, summary
(timings aside) and final weights; a prepared folder by its token files and meta.json (timings
aside); a report by its tables; a Slurm submission by its task list. Each case starts from a
fresh copy of its world, so the trials are independent.

The writes of one file between its first and its last are alike (a short file, removed or never
renamed into place): with every=false (the default) the middle ones are left out and every
other operation is faulted; every=true faults every operation. sample=K faults every Kth of
those (the first included), for a long command when time is short; the table says how many.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qkstudy.config import split_key_values
from qkstudy.errors import UsageError
from qkstudy.run_folder import run_folders

from .compare import compare_run, one_error_line
from .fault_injection import KINDS, SIGNALS, environment

PY = [sys.executable, "-m"]
TRAIN = ("data=data depth=2 d_model=32 n_heads=2 block_size=32 batch_size=4 max_steps=20 "
         "warmup_steps=5 eval_every=10 eval_batches=2 probe_every=10 log_every=5 ckpt_every=10 "
         "runs_dir=runs").split()
SWEEP = ("preset=mini depth=2 lrs=0.01 seeds=0 arms=none,rmsnorm refine=false max_steps=20 "
         "warmup_steps=5 eval_every=10 probe_every=10 log_every=5 ckpt_every=10 "
         "divergence_window=10 max_seeds=1 threshold_steps=0 data=data runs_dir=runs name=s jobs=1 "
         "--no-notify").split()
PREPARE = "synthetic tokenizer=bytes size_mb=0.1 val_fraction=0.05".split()
# what a failed command may change beside what it was asked to make: logs it appends to, and
# the sweep's plan and this machine's calibrated speeds, rewritten at each start
REWRITTEN = re.compile(r"(^|/)(sweep-[^/]+\.log|sweep\.json|sweep-[^/]+-speeds\.json)$")
LEFTOVER = re.compile(r"(^|/)(\.lock|\.[^/]*\.tmp-\d+|\.fatal-\d+|\.write-test-\d+|"
                      r"\.[^/]*\.old-\d+|\.[^/]*\.tmp)(/|$)")
META_TIMINGS = ("created", "prepare_seconds", "tokenize_mb_per_s")


def files_of(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under root."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if LEFTOVER.search(p.relative_to(root).as_posix()))


def run(world: Path, argv: list[str], fault: str | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *argv], cwd=world, env=environment(fault, world),
                          capture_output=True, text=True, timeout=timeout)


# --- what an undisturbed run and a run after a fault must share ---------------------------------

def same_runs(ref: Path, got: Path) -> list[str]:
    """Every run folder under ref/runs compared with got's (compare_run of the storm test)."""
    out = []
    for sweep in sorted((ref / "runs").iterdir()) if (ref / "runs").is_dir() else []:
        want = {f.name for f in run_folders(sweep)}
        have = {f.name for f in run_folders(got / "runs" / sweep.name)}
        out += [f"run {r} missing" for r in sorted(want - have)]
        out += [f"run {r} extra" for r in sorted(have - want)]
        for name in sorted(want & have):
            out += compare_run(sweep / name, got / "runs" / sweep.name / name)
    return out


def same_data(ref: Path, got: Path) -> list[str]:
    import json

    out = [f"data/{n} differs" for n in ("train.bin", "val.bin")
           if (ref / "data" / n).read_bytes() != (got / "data" / n).read_bytes()]
    metas = [{k: v for k, v in json.loads((w / "data" / "meta.json").read_text()).items()
              if k not in META_TIMINGS} for w in (ref, got)]
    return out + (["data/meta.json differs"] if metas[0] != metas[1] else [])


def same_report(ref: Path, got: Path) -> list[str]:
    want = {k: v for k, v in files_of(ref / "report").items() if k.startswith("tables/")}
    have = {k: v for k, v in files_of(got / "report").items() if k.startswith("tables/")}
    return [] if want == have and want else [f"report tables differ ({len(want)} vs {len(have)})"]


def same_slurm(ref: Path, got: Path) -> list[str]:
    def tasks(world: Path) -> list[str]:
        return [p.read_text().replace(str(world), "W") for p in
                sorted((world / "runs" / "s" / "slurm").glob("*/tasks.txt"))]
    want, have = tasks(ref), tasks(got)
    return [] if want == have and want else ["slurm task lists differ"]


def nothing(ref: Path, got: Path) -> list[str]:
    return []


# --- the cases -----------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    argv: list[str]
    setup: Callable[[Path, Path], None]  # (world, a prepared data folder to copy)
    same: Callable[[Path, Path], list[str]]
    kill: bool = False  # also signals at each operation: kill -9, SIGINT, SIGTERM (train, sweep)


def with_data(world: Path, data: Path) -> None:
    shutil.copytree(data, world / "data")


def with_old_data(world: Path, data: Path) -> None:
    """An earlier prepared folder at the same path (another seed): replaced only when the new
    one is complete."""
    subprocess.run([*PY, "qkstudy", "prepare", *PREPARE, "seed=1", "out=data"], cwd=world,
                   check=True, capture_output=True)


def with_runs(world: Path, data: Path) -> None:
    with_data(world, data)
    subprocess.run([*PY, "qkstudy", "sweep", *SWEEP], cwd=world, check=True, capture_output=True)


def with_runs_and_report(world: Path, data: Path) -> None:
    """Finished runs and an earlier report of them (a report is replaced only when complete)."""
    with_runs(world, data)
    subprocess.run([*PY, "analysis", "report", "runs/s", "out=report"], cwd=world, check=True,
                   capture_output=True)


CASES = {
    "prepare": Case("prepare", ["qkstudy", "prepare", *PREPARE, "out=data"], with_old_data,
                    same_data),
    "train": Case("train", ["qkstudy", "train", *TRAIN], with_data, same_runs, kill=True),
    "sweep": Case("sweep", ["qkstudy", "sweep", *SWEEP], with_data, same_runs, kill=True),
    "report": Case("report", ["analysis", "report", "runs/s", "out=report"],
                   with_runs_and_report, same_report),
    "status": Case("status", ["qkstudy", "status", "runs/s"], with_runs, nothing),
    "slurm": Case("slurm", ["qkstudy", "sweep", *SWEEP, "--slurm"], with_data, same_slurm),
}


# --- the trials ----------------------------------------------------------------------------------

@dataclass
class Tally:
    operations: int = 0  # the command's file operations, counted undisturbed
    chosen: int = 0  # the operations faulted
    faulted: Counter = field(default_factory=Counter)  # kind -> trials
    failures: list[str] = field(default_factory=list)
    tracebacks: int = 0
    lost: int = 0  # trials after which a file that existed before differed or was gone
    ignored: int = 0  # faults the command rode out (exit 0): a cleanup whose failure is ignored
    seconds: float = 0.0


def selected(ops: list[tuple[int, str, str]], every: bool) -> list[int]:
    """The operation numbers to fault: all, or all but the middle writes of each file."""
    if every:
        return [n for n, _, _ in ops]
    writes: dict[str, list[int]] = {}
    for n, op, path in ops:
        if op == "write":
            writes.setdefault(path, []).append(n)
    middle = {n for ns in writes.values() for n in ns[1:-1]}
    return [n for n, _, _ in ops if n not in middle]


@dataclass
class World:
    """A case made ready: its starting state (copied for each trial), the result of the command
    run undisturbed, and the file operations that run made."""

    case: Case
    template: Path
    reference: Path
    ops: list[tuple[int, str, str]]


def make_world(case: Case, work: Path, data: Path) -> World:
    folder = work / case.name
    shutil.rmtree(folder, ignore_errors=True)
    template = folder / "template"
    template.mkdir(parents=True)
    case.setup(template, data)
    reference = folder / "reference"
    shutil.copytree(template, reference, symlinks=True)
    log = folder / "ops.txt"
    out = run(reference, case.argv, f"count:{log}")
    if out.returncode:
        raise RuntimeError(f"{case.name}: the undisturbed command exited {out.returncode}: "
                           f"{out.stderr[-500:]}")
    ops = []
    for line in log.read_text().splitlines() if log.exists() else []:
        n, op, path = line.split(" ", 2)
        ops.append((int(n), op, os.path.relpath(path, reference) if path.startswith("/")
                    else path))
    return World(case, template, reference, ops)


SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


def trial(world: World, n: int, kind: str, tally: Tally) -> list[str]:
    """Fault operation n with `kind` in a fresh copy of the world, then run the command again;
    what went wrong (empty: nothing)."""
    case = world.case
    here = world.template.parent / "trial"
    shutil.rmtree(here, ignore_errors=True)
    shutil.copytree(world.template, here, symlinks=True)
    before = files_of(here)
    out = run(here, case.argv, f"{n}:{kind}")
    tally.faulted[kind] += 1
    problems = []
    tally.tracebacks += "Traceback" in out.stderr + out.stdout
    if kind == "KILL":
        if out.returncode != -9:
            problems.append(f"exit code {out.returncode}, not killed")
    elif kind in SIGNAL_EXIT:
        if out.returncode != SIGNAL_EXIT[kind]:
            problems.append(f"exit code {out.returncode}, not {SIGNAL_EXIT[kind]}")
        elif "interrupted" not in out.stdout + out.stderr or "Traceback" in out.stderr:
            problems.append("no line saying it was interrupted")
        problems += [f"left {p}" for p in leftovers(here) if not REWRITTEN.search(p)]
    elif out.returncode == 0:  # a failure the command ignores by design (a cleanup)
        tally.ignored += 1
    else:
        why = one_error_line(out)
        problems += [why] if why else []
        problems += [f"left {p}" for p in leftovers(here)]
        after = files_of(here)
        changed = [p for p, h in before.items() if after.get(p) != h and not REWRITTEN.search(p)]
        tally.lost += bool(changed)
        problems += [f"{p} changed or gone" for p in changed]
    again = run(here, case.argv)
    tally.tracebacks += "Traceback" in again.stderr + again.stdout
    if again.returncode:
        problems.append(f"the command again exited {again.returncode}: "
                        f"{again.stderr.strip()[-300:]}")
    else:
        problems += case.same(world.reference, here)
        problems += [f"left {p} after the command again" for p in leftovers(here)]
    return problems


def check_case(case: Case, work: Path, data: Path, kinds: list[str], every: bool,
               sample: int = 1, say=print) -> Tally:
    tally = Tally()
    t0 = time.monotonic()
    world = make_world(case, work, data)
    tally.operations = len(world.ops)
    chosen = selected(world.ops, every)[::sample]
    tally.chosen = len(chosen)
    trial_kinds = [k for k in kinds if k not in SIGNALS or case.kill]
    say(f"{case.name}: {len(world.ops)} file operations; faulting {len(chosen)} of them with "
        f"{', '.join(trial_kinds) or 'nothing'}")
    for n in chosen:
        for kind in trial_kinds:
            problems = trial(world, n, kind, tally)
            if problems:
                _, op, path = world.ops[n - 1]
                tally.failures.append(f"{case.name} op {n} ({op} {path}) {kind}: "
                                      + "; ".join(problems))
                say(f"  FAIL {tally.failures[-1]}")
    tally.seconds = time.monotonic() - t0
    say(table({case.name: tally}).splitlines()[-1])
    return tally


def prepared_data(work: Path) -> Path:
    data = work / "data-source" / "data"
    if not (data / "meta.json").exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*PY, "qkstudy", "prepare", *PREPARE, "out=data"], cwd=data.parent,
                       check=True, capture_output=True)
    return data


def table(results: dict[str, Tally]) -> str:
    kinds = [k for k in KINDS if any(t.faulted[k] for t in results.values())]
    lines = [f"{'command':<9}{'operations':>11}{'faulted':>8}" + "".join(f"{k:>8}" for k in kinds)
             + f"{'ignored':>8}{'failed':>8}{'lost':>6}{'tracebacks':>11}{'seconds':>9}"]
    for name, t in results.items():
        lines.append(f"{name:<9}{t.operations:>11}{t.chosen:>8}"
                     + "".join(f"{t.faulted[k]:>8}" for k in kinds)
                     + f"{t.ignored:>8}{len(t.failures):>8}{t.lost:>6}{t.tracebacks:>11}"
                     f"{t.seconds:>9.0f}")
    return "\n".join(lines)


USAGE = "usage: " + __doc__.split("\n\n")[1].strip()


def cli(argv: list[str]) -> int:
    options = split_key_values(argv)
    unknown = set(options) - {"cases", "every", "sample", "kinds", "work", "keep"}
    if unknown:
        raise UsageError(f"unknown key {min(unknown)}; keys: cases every sample kinds work keep")
    sample = options.get("sample", "1")
    if not sample.isdigit() or int(sample) < 1:
        raise UsageError(f"sample must be a whole number >= 1, got {sample!r}")
    names = options.get("cases", ",".join(CASES)).split(",")
    kinds = options.get("kinds", ",".join(KINDS)).split(",")
    if set(names) - set(CASES) or set(kinds) - set(KINDS):
        raise UsageError(f"cases are {', '.join(CASES)}; kinds are {', '.join(KINDS)}")
    work = Path(options["work"]) if "work" in options else Path(
        tempfile.mkdtemp(prefix="qkstudy-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    data = prepared_data(work)
    results = {}
    for name in names:
        results[name] = check_case(CASES[name], work, data, kinds,
                                   options.get("every") == "true", int(sample),
                                   say=lambda line: print(line, flush=True))
    print(table(results))
    failures = [f for t in results.values() for f in t.failures]
    if failures:
        print(f"FAILED: {len(failures)} trials (worlds kept in {work})")
        return 1
    print("every fault: one error line, nothing lost, the same result once lifted")
    if options.get("keep") != "true" and "work" not in options:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return 0
