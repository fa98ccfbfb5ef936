"""The storm test: a whole small sweep with jobs=2, once undisturbed and once under random
faults, must end with every run folder and the report's tables identical.

    python -m tests.reliability chaos [faults=30] [seed=N] [work=DIR] [keep=true] [sweep key=value ...]

Faults (kinds drawn in turn, moments at random from a seeded RNG, the seed printed):
  kill9_main    SIGKILL to the main sweep process (its worker goes on alone, an orphan)
  kill9_worker  SIGKILL to a worker sweep process (of this or an earlier invocation)
  sigint        SIGINT to the sweep's process group, as Ctrl-C in a terminal
  sigterm       SIGTERM to the sweep's process group, as systemd or docker stop
  disk_full     the runs folder (a small tmpfs) filled to the last byte for a few seconds
  truncate_part a metrics part of a finished or running run cut short
  stale_lock    a run's .lock left holding the pid of a process that is gone
  full_disk_lock  another invocation (jobs=1) whose first write of a run's lock finds the disk
                full (fault_injection.py): one error line, exit 2, no lock file left
  full_disk_report  once, after the storm: the report of the storm's tree written onto a full
                disk: one error line, exit 2, the earlier report byte-identical

After a fault the harness waits a moment: if the invocation has ended, the same sweep command
is started again; if it is still running, it takes the next fault. After the last fault, once
every process the storm started has ended, the same command runs undisturbed to the end.
Every run folder is then compared with the undisturbed sweep's (metrics and probe rows without
the wall clock, final weights, summary without timings, config), and so are the tables
analysis.report.analyse computes from both trees. Exit 1 on any difference.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


from qkstudy import run_folder
from qkstudy.config import split_key_values
from qkstudy.errors import UsageError

from .compare import compare_trees, full_disk_report, run_folders
from .storm import Storm

KINDS = ("kill9_main", "kill9_worker", "sigint", "sigterm", "disk_full", "truncate_part",
         "stale_lock", "full_disk_lock", "full_disk_report")
# full_disk_report is injected once, after the storm, into the report of the storm's tree
AFTER_THE_STORM = ("full_disk_report",)
ENDS_THE_INVOCATION = {"kill9_main", "sigint", "sigterm"}  # the harness waits for it to end

# mini-shaped (d_model 64, 2 heads, block 64, batch 16) and tiny: 8 grid runs + 4 refinement runs
SWEEP = ("preset=mini depth=2 lrs=0.01,1 seeds=0,1 max_steps=40 warmup_steps=5 eval_every=10 "
         "probe_every=10 log_every=5 ckpt_every=10 divergence_window=10 max_seeds=2 "
         "threshold_steps=0").split()
NAME = "chaos"

USAGE = "usage: " + __doc__.split("\n\n")[1].strip() + """

keys: faults=30 (at least one of each kind from 7 on)  seed= (default: drawn, printed)
      work= (a folder for the data and both trees; default a temporary one, removed on success)
      keep=false (keep work even on success)  data= (a prepared corpus; default: synthetic bytes)
      any other key=value is a sweep key and replaces the default's
      (default sweep: """ + " ".join(SWEEP) + ")"


def schedule(rng: random.Random, n: int, kinds: list[str]) -> list[str]:
    """n fault kinds: every kind in turn (each floor(n / k) times or more), in random order."""
    out = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(out)
    return out


# --- the storm ---------------------------------------------------------------------------------

@dataclass
class Result:
    seed: int
    differences: list[str]
    injected: Counter
    mid_run: Counter
    no_target: Counter
    skipped: dict[str, str]  # kind -> why it could not run here
    exits: Counter
    invocations: int
    final_invocations: int
    repaired: int  # run folders moved to .damaged/ by the sweep
    compared: int  # run folders compared with the undisturbed sweep's
    reference_seconds: float
    storm_seconds: float

    @property
    def ok(self) -> bool:
        return not self.differences

    def table(self) -> str:
        w = max(map(len, KINDS)) + 2
        lines = [f"{'fault':<{w}}{'injected':>9}{'mid-run':>9}{'no target':>10}{'survived':>9}"]
        for kind in KINDS:
            if kind in self.skipped:
                lines.append(f"{kind:<{w}}  skipped: {self.skipped[kind]}")
                continue
            n = self.injected[kind]
            lines.append(f"{kind:<{w}}{n:>9}{self.mid_run[kind]:>9}{self.no_target[kind]:>10}"
                         f"{n if self.ok else 0:>9}")
        total = sum(self.injected.values())
        lines.append(f"{'total':<{w}}{total:>9}{sum(self.mid_run.values()):>9}"
                     f"{sum(self.no_target.values()):>10}{total if self.ok else 0:>9}")
        return "\n".join(lines)


def mount_tmpfs(folder: Path, megabytes: int) -> str | None:
    """Mount a tmpfs of this size on `folder`; None, or why it cannot be done here."""
    if not sys.platform.startswith("linux"):
        return "tmpfs mounts are for Linux"
    if os.geteuid() != 0:
        return "not running as root (mounting a tmpfs needs it)"
    if not shutil.which("mount"):
        return "no mount command"
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                          str(folder)], capture_output=True, text=True)
    if out.returncode:
        return f"mount -t tmpfs failed: {(out.stderr or out.stdout).strip()[:200]}"
    return None


def undisturbed(command: list[str], work: Path, say=print) -> tuple[list[str], float]:
    """The sweep run once, undisturbed, into work/reference: (its run folders, its seconds)."""
    reference = work / "reference"
    say(f"undisturbed sweep into {reference} ...")
    t0 = time.monotonic()
    with open(work / "reference.log", "w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - t0
    if rc:
        raise RuntimeError(f"the undisturbed sweep exited {rc}; see {work / 'reference.log'}")
    run_ids = run_folders(reference / NAME)
    say(f"  {len(run_ids)} runs in {seconds:.0f} s")
    return run_ids, seconds


def rage(s: Storm, plan: list[str], say=print) -> None:
    """Inject the planned faults one by one (see the module docstring), starting the sweep
    again whenever it has ended."""
    for i, kind in enumerate(plan):
        if s.main is None or s.wait_main(0):
            s.start()
        if s.rng.random() < 1 / 3:  # anywhere: start-up, calibration, between runs, the end
            time.sleep(s.rng.uniform(0, s.spread))
        else:  # somewhere in a run being trained, if the sweep gets to one
            s.wait_training(timeout=4 * s.spread)
            time.sleep(s.rng.uniform(0, s.run_seconds))
        s.inject(kind)
        if kind in ENDS_THE_INVOCATION:
            if not s.wait_main(600):
                raise RuntimeError(f"the sweep did not end within 600 s of {kind}")
        else:
            s.wait_main(s.rng.uniform(0, s.run_seconds))
        say(f"  fault {i + 1}/{len(plan)}: {kind}"
            + ("" if s.main.poll() is None else f" (sweep exited {s.main.returncode})"))
    s.wait_main(600)


def to_the_end(s: Storm) -> int:
    """The same command to the end, undisturbed, with no earlier process left; again if a run
    it passed over (held by a process of its own) still has no result. Returns how many
    times it ran."""
    final = 0
    while True:
        s.wait_all(1800)
        s.start()
        final += 1
        s.wait_main(3600)
        if set(run_folders(s.sweep_dir)) >= set(s.run_ids) or final == 3:
            break
    s.wait_all(1800)
    return final


def storm(faults: int, seed: int, work: Path, sweep_words: list[str], data: str | None = None,
          say=print) -> Result:
    """Run the undisturbed sweep and the storm under `work`, compare them; see the module doc."""
    work.mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-m", "qkstudy"]
    if data is None:
        data = str(work / "data")
        if not (Path(data) / "meta.json").exists():
            subprocess.run([*python, "prepare", "synthetic", "tokenizer=bytes", "size_mb=1",
                            f"out={data}"], check=True, capture_output=True)

    def command(runs_dir: Path) -> list[str]:
        return [*python, "sweep", *sweep_words, f"data={data}", f"runs_dir={runs_dir}",
                f"name={NAME}", "jobs=2", "--no-notify"]

    reference, root = work / "reference", work / "storm"
    run_ids, reference_seconds = undisturbed(command(reference), work, say)
    root.mkdir(exist_ok=True)
    size = sum(p.stat().st_size for p in reference.rglob("*") if p.is_file())
    why = mount_tmpfs(root, max(64, math.ceil(8 * size / 2**20)))
    skipped = {"disk_full": why} if why else {}
    if why:
        say(f"disk_full faults skipped: {why}")
    kinds = [k for k in KINDS if k not in skipped]
    rng = random.Random(seed)
    s = Storm(command(root), root / NAME, rng, spread=max(3.0, 2 * reference_seconds / faults),
              run_seconds=2 * reference_seconds / len(run_ids), tmpfs=not why,
              log=work / "storm.log", run_ids=run_ids)
    t0 = time.monotonic()
    try:
        plan = schedule(rng, faults, [k for k in kinds if k not in AFTER_THE_STORM])
        say(f"storm of {faults} faults (seed {seed}) into {root} ...")
        rage(s, plan, say)
        final = to_the_end(s)
        storm_seconds = time.monotonic() - t0
        say(f"compared: {len(run_ids)} run folders and the report's tables")
        differences = compare_trees(reference / NAME, root / NAME) + s.problems
        if "full_disk_report" in kinds:
            differences += full_disk_report(root / NAME, work / "report")
            s.injected["full_disk_report"] += 1
        damaged = root / NAME / run_folder.DAMAGED
        repaired = len([p for p in damaged.iterdir() if p.is_dir()]) if damaged.exists() else 0
    finally:
        s.kill_all()
        if not why:
            # the storm's tree is kept for inspection on disk, out of the tmpfs
            with contextlib.suppress(OSError):
                shutil.copytree(root, work / "storm-tree", dirs_exist_ok=True)
            subprocess.run(["umount", str(root)], check=False, capture_output=True)
    return Result(seed=seed, differences=differences, injected=s.injected, mid_run=s.mid_run,
                  no_target=s.no_target, skipped=skipped, exits=s.exits,
                  invocations=s.invocations, final_invocations=final, repaired=repaired,
                  compared=len(run_ids),
                  reference_seconds=reference_seconds, storm_seconds=storm_seconds)


def cli(argv: list[str]) -> int:
    options = split_key_values(argv)
    own = {k: options.pop(k) for k in ("faults", "seed", "work", "keep", "data") if k in options}
    try:
        faults = int(own.get("faults", 30))
        seed = int(own["seed"]) if "seed" in own else random.SystemRandom().randrange(10**6)
    except ValueError:
        raise UsageError("faults and seed must be integers") from None
    if faults < 1:
        raise UsageError(f"faults must be >= 1, got {faults}")
    if own.get("keep", "false") not in ("true", "false"):
        raise UsageError(f"keep must be true or false, got {own['keep']!r}")
    for key in ("runs_dir", "name", "jobs"):
        if key in options:
            raise UsageError(f"{key} is set by the storm (two trees, name={NAME}, jobs=2)")
    defaults = split_key_values(SWEEP)
    words = [f"{k}={v}" for k, v in {**defaults, **options}.items()]
    work = Path(own["work"]) if "work" in own else Path(tempfile.mkdtemp(prefix="mlx-gpt-chaos-"))
    print(f"storm test: seed {seed}, {faults} faults, work folder {work}", flush=True)
    t0 = time.monotonic()
    result = storm(faults, seed, work, words, own.get("data"),
                   say=lambda line: print(line, flush=True))
    print(result.table())
    exits = ", ".join(f"{code}: {n}" for code, n in sorted(result.exits.items()))
    print(f"{result.invocations} invocations of the sweep ({result.final_invocations} undisturbed "
          f"at the end); exit codes {exits}; {result.compared} run folders compared; "
          f"{result.repaired} damaged runs repaired (moved to "
          f"{NAME}/{run_folder.DAMAGED}/, not compared); undisturbed sweep "
          f"{result.reference_seconds:.0f} s, storm {result.storm_seconds:.0f} s, "
          f"all {time.monotonic() - t0:.0f} s; seed {seed}")
    if result.differences:
        print(f"FAILED: {len(result.differences)} differences (trees kept in {work}):")
        for line in result.differences:
            print(f"  {line}")
        return 1
    print("identical: every run folder and every report table")
    if own.get("keep") != "true" and "work" not in own:
        shutil.rmtree(work, ignore_errors=True)
    return 0
