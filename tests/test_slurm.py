"""A sweep submitted to a real Slurm: a one-node cluster started on this machine.

Needs Linux, root, and Debian's slurm-wlm and munge (setup.sh installs them on Linux); anywhere
else every test here is skipped with the reason. The fixture writes a slurm.conf for this host
(2 CPUs, state, spool, logs and the munge socket in a temporary folder, free ports), starts
munged, slurmctld and slurmd, and stops them (by their pid files) at the end. Run it alone with
`just test-slurm`; `just test` includes it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkstudy import files, run_folder, status, trainer
from qkstudy.__main__ import main
from qkstudy.config import parse_train_config
from qkstudy.run_folder import RunFolder

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
TIMEOUT = 120  # seconds any one wait on the cluster may take
LOSS_COLUMNS = ["step", "tokens", "lr", "train_loss", "grad_norm", "val_loss"]


def why_no_slurm() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"a Slurm cluster is started on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    missing = [d for d in DAEMONS if shutil.which(d) is None
               and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def stop(pid_file: Path) -> None:
    """SIGTERM the daemon whose pid this file holds, and wait (bounded) until it is gone."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def write_conf(root: Path) -> Path:
    """A slurm.conf for a one-node cluster on this host (2 CPUs), its files under `root`."""
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=qkt
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=30
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def start_daemons(root: Path, conf: Path, key: Path, started: list[Path]) -> None:
    """Start munged, slurmctld and slurmd, adding each one's pid file to `started` (so that
    they are stopped whatever happens); skip the tests if one does not start."""
    for command, pid_file in (
            ([tool("munged"), "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
              f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
              f"--seed-file={root}/munged.seed"], root / "munged.pid"),
            ([tool("slurmctld"), "-c", "-f", str(conf)], root / "slurmctld.pid"),
            ([tool("slurmd"), "-f", str(conf)], root / "slurmd.pid")):
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        started.append(pid_file)
        if out.returncode != 0:
            pytest.skip(f"{Path(command[0]).name} did not start: {out.stderr.strip()[-300:]}")


def wait_until_idle(root: Path) -> None:
    """Wait (30 s at the most) until the node is idle; skip the tests if it never is."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        if state == "idle":
            break
        time.sleep(0.3)
    else:
        logs = " | ".join((root / f).read_text()[-200:] for f in ("slurmctld.log",
                                                                  "slurmd.log")
                          if (root / f).exists())
        pytest.skip(f"the one-node cluster did not come up within 30 s: {logs}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = write_conf(root)
    for d in ("state", "spool"):
        (root / d).mkdir()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    started = []
    try:
        start_daemons(root, conf, key, started)
        wait_until_idle(root)
        yield root
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, timeout=10)
        for pid_file in reversed(started):
            stop(pid_file)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def sweep_words(data: str, runs: Path, name: str, *extra: str) -> list[str]:
    """A tiny sweep: depth 1, d_model 32, 30 steps of 4 x 32 tokens (a few seconds a run).
    `extra` words replace the defaults of the same key (a key may be given once)."""
    words = dict(w.split("=", 1) for w in (
        "preset=demo", f"data={data}", f"runs_dir={runs}", f"name={name}", "depth=1",
        "d_model=32", "n_heads=2", "block_size=32", "batch_size=4", "max_steps=30",
        "warmup_steps=5", "eval_every=10", "eval_batches=2", "probe_every=10", "log_every=5",
        "ckpt_every=10", "divergence_window=5", "seeds=0", "jobs=1", *extra))
    return [f"{k}={v}" for k, v in words.items()]


def submit(words: list[str], capsys) -> tuple[str | None, str]:
    """Run `sweep ... --slurm --submit`; (the job id it printed or None, its output)."""
    assert main(["sweep", *words, "--slurm", "--submit"]) == 0
    out = capsys.readouterr().out
    job = next((line.split()[3] for line in out.splitlines()
                if line.startswith("submitted job array")), None)
    return job, out


def in_queue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%F"], capture_output=True, text=True,
                         timeout=10)
    return job in out.stdout.split()


def wait_for(job: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while in_queue(job):
        assert time.monotonic() < deadline, f"job {job} still queued after {TIMEOUT} s"
        time.sleep(0.5)


def task_lines(folder: Path) -> list[str]:
    return [line for log in sorted(folder.glob("task-*.log"))
            for line in log.read_text().splitlines() if line.startswith("task ")]


def test_sweep_as_a_job_array(cluster, tiny_data, tmp_path, capsys):
    runs = tmp_path / "runs"
    words = sweep_words(tiny_data, runs, "s", "lrs=1e-3,1", "arms=none,rmsnorm",
                        "refine=true", "refine_steps=1", "slurm_max_parallel=2")
    job, out = submit(words, capsys)
    assert job and "4 runs to submit as one array: 4 grid runs not finished" in out
    first = runs / "s" / "slurm" / "001"
    script = (first / "array.sbatch").read_text()
    assert "#SBATCH --array=0-3%2" in script and sys.executable in script
    assert len((first / "tasks.txt").read_text().splitlines()) == 4
    wait_for(job)

    tasks = [line.split() for line in (first / "tasks.txt").read_text().splitlines()]
    grid = [parse_train_config(t[t.index("train") + 1:]) for t in tasks]
    for cfg in grid:  # finished, once: no resume, one task trained it, its rows once each
        folder = RunFolder.of(cfg).path
        summary = files.read_json(folder / "summary.json")
        assert summary["status"] == ("completed" if cfg.lr < 0.5 else "diverged"), cfg.run_id
        assert "resumed_from_step" not in files.read_json(folder / "manifest.json")
        assert run_folder.finished_problem(folder, summary) is None
    lines = task_lines(first)
    assert sorted(line.split()[3] for line in lines if line.endswith(("completed", "diverged"))
                  ) == sorted(c.run_id for c in grid)

    text = status.render(runs / "s")  # Slurm state beside run state
    assert "4 runs: 2 completed, 2 diverged" in text and "Slurm task states from squeue" in text
    assert all(f"{job}_{i} ended" in text for i in range(4))

    # the results now call for one bisection point per arm; then nothing is left
    job2, out = submit(words, capsys)
    assert job2 and ("2 runs to submit as one array: 0 grid runs not finished (interrupted "
                     "ones resume from their checkpoint), 2 boundary-refinement runs") in out
    wait_for(job2)
    refined = [line for line in task_lines(runs / "s" / "slurm" / "002")
               if line.endswith(("completed", "diverged"))]
    assert len(refined) == 2 and all("-lr0.0316-" in line for line in refined)
    job3, out = submit(words, capsys)
    assert job3 is None and "nothing to submit" in out
    assert sorted(p.name for p in (runs / "s" / "slurm").iterdir()) == ["001", "002"]

    report = subprocess.run([sys.executable, "-m", "analysis", "report", str(runs / "s"),
                             f"out={tmp_path / 'report'}"], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "report" / "report.html").exists()


def wait_for_checkpoint(folder: Path, job: str):
    """(config, run folder) of the array's one task, once it is mid-run (first checkpoint)."""
    line = (folder / "tasks.txt").read_text().split()
    cfg = parse_train_config(line[line.index("train") + 1:])
    run_dir = RunFolder.of(cfg).path
    deadline = time.monotonic() + TIMEOUT
    while not (run_dir / "checkpoint.safetensors").exists():
        assert time.monotonic() < deadline and in_queue(job), "the task never checkpointed"
        time.sleep(0.05)
    return cfg, run_dir


def train_alone(cfg) -> Path:
    """Train `cfg` in a process of its own, as a task does (a torch run's numerics depend on
    whether MLX's BLAS was loaded first, as it is in this test process). Its run folder."""
    from qkstudy.sweep.plan import command_line

    out = subprocess.run([sys.executable, "-m", "qkstudy", *command_line(cfg).split()[3:]],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-2000:]
    return RunFolder.of(cfg).path


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_cancelled_task_resumes_bit_exact(cluster, tiny_data, tmp_path, capsys, backend):
    runs = tmp_path / "runs"
    words = sweep_words(tiny_data, runs, "c", "lrs=1e-3", "arms=none", "max_steps=200",
                        "eval_every=50", "probe_every=50", f"backend={backend}")
    job, out = submit(words, capsys)
    assert job and "1 run to submit" in out
    folder = runs / "c" / "slurm" / "001"
    cfg, run_dir = wait_for_checkpoint(folder, job)
    subprocess.run(["scancel", job], check=True, timeout=10)  # Slurm sends SIGTERM
    wait_for(job)
    log = (folder / "task-0.log").read_text()
    assert "stopped by SIGTERM; checkpointed" in log, log[-2000:]
    assert not (run_dir / "summary.json").exists()
    stopped_at = int(files.read_tensors(run_dir / "checkpoint.safetensors")[1]["step"])
    assert 0 < stopped_at < cfg.steps

    job2, out = submit(words, capsys)  # the interrupted run again, resumed
    assert job2 and "1 run to submit as one array: 1 grid run not finished" in out
    wait_for(job2)
    assert files.read_json(run_dir / "summary.json")["status"] == "completed"
    assert files.read_json(run_dir / "manifest.json")["resumed_from_step"] == stopped_at
    assert files.read_json(run_dir / "summary.json")["framework"] == backend

    # the same run, never interrupted
    reference = train_alone(dataclasses.replace(cfg, runs_dir=str(tmp_path / "reference")))
    got = run_folder.read_parts(run_dir / "metrics").select(LOSS_COLUMNS).to_pydict()
    want = run_folder.read_parts(reference / "metrics").select(LOSS_COLUMNS).to_pydict()
    assert got == want


def test_preempted_task_is_requeued_and_finishes_bit_exact(cluster, tiny_data, tmp_path, capsys):
    runs = tmp_path / "runs"
    words = sweep_words(tiny_data, runs, "p", "lrs=1e-3", "arms=none", "max_steps=200",
                        "eval_every=50", "probe_every=50")
    job, out = submit(words, capsys)
    assert job
    folder = runs / "p" / "slurm" / "001"
    assert "#SBATCH --requeue" in (folder / "array.sbatch").read_text()
    cfg, run_dir = wait_for_checkpoint(folder, job)
    # as a preemption: Slurm stops the task (SIGTERM) and puts it back in the queue
    subprocess.run(["scontrol", "requeue", f"{job}_0"], check=True, timeout=10)
    # Slurm holds a requeued task until 120 s from now (reason BeginTime); start it sooner
    deadline = time.monotonic() + TIMEOUT
    while "PENDING" not in subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%T"],
                                          capture_output=True, text=True, timeout=10).stdout:
        assert time.monotonic() < deadline, "the task was not requeued"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}_0", "StartTime=now"], check=True,
                   timeout=10)
    wait_for(job)  # requeued, run again, finished: the same job, no second submission
    summary = files.read_json(run_dir / "summary.json")
    assert summary and summary["status"] == "completed"
    resumed = files.read_json(run_dir / "manifest.json").get("resumed_from_step")
    assert resumed and 0 < resumed < cfg.steps
    log = (folder / "task-0.log").read_text()  # a requeued task appends to its log
    assert "stopped by SIGTERM; checkpointed" in log and log.rstrip().endswith("completed"), log

    reference = dataclasses.replace(cfg, runs_dir=str(tmp_path / "reference"))
    trainer.train(reference, verbose=False)  # the same run, never interrupted
    got = run_folder.read_parts(run_dir / "metrics").select(LOSS_COLUMNS).to_pydict()
    want = run_folder.read_parts(RunFolder.of(reference).path / "metrics").select(
        LOSS_COLUMNS).to_pydict()
    assert got == want


# --- without a cluster: the files --slurm writes, and bad input -------------------------------


def test_task_list_is_the_sweeps_runs(tiny_data, tmp_path, capsys, monkeypatch):
    from qkstudy import sweep

    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no sbatch, no squeue here
    runs = tmp_path / "runs"
    words = sweep_words(tiny_data, runs, "f", "lrs=1e-3,1e-2", "arms=none,rmsnorm")
    for bad, message in ((["slurm_cpus=2"], "slurm_cpus is a Slurm setting; add --slurm"),
                         (["slurm_time=soon", "--slurm"], "slurm_time='soon' is not a Slurm time"),
                         (["slurm_gpu=1", "--slurm"], "unknown key 'slurm_gpu'"),
                         (["slurm_extra=qos", "--slurm"], "'qos' is not an sbatch option"),
                         (["--submit"], "--submit goes with --slurm"),
                         (["--slurm", "--submit"], "--submit needs sbatch on PATH"),
                         (["--slurm", "--dry-run"], "give it without --dry-run")):
        assert main(["sweep", *words, *bad]) == 2, bad
        assert message in capsys.readouterr().err, bad
    assert not runs.exists()  # nothing written by bad input

    assert main(["sweep", *words, "--slurm", "slurm_max_parallel=3", "slurm_gpus=1",
                 "slurm_extra=--account=lab --qos=low"]) == 0
    out = capsys.readouterr().out
    folder = runs / "f" / "slurm" / "001"
    assert f"sbatch {folder / 'array.sbatch'}" in out
    lines = (folder / "tasks.txt").read_text().splitlines()
    assert all(line.startswith(f"{sys.executable} -m qkstudy train ") for line in lines)
    planned = [parse_train_config(line.split()[4:]) for line in lines]
    grid = sweep.grid(sweep.parse_sweep_config(words))
    assert [c.run_id for c in planned] == [c.run_id for c in grid]  # exactly the sweep's runs
    assert [r["run_id"] for r in files.read_json(folder / "submission.json")["runs"]] == \
        [c.run_id for c in grid]
    script = (folder / "array.sbatch").read_text().splitlines()
    for option in ("--array=0-3%3", "--gres=gpu:1", "--account=lab", "--qos=low",
                   f"--output={folder}/task-%a.log"):
        assert f"#SBATCH {option}" in script
    assert script[-1].endswith(f"--slurm-task {folder / 'tasks.txt'} \"$SLURM_ARRAY_TASK_ID\"")


def test_array_asks_for_a_signal_before_the_time_limit_and_requeues(tiny_data, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    runs = tmp_path / "runs"
    words = sweep_words(tiny_data, runs, "f", "lrs=1e-3", "arms=none")
    assert main(["sweep", *words, "--slurm", "slurm_time=1:00:00"]) == 0
    script = (runs / "f" / "slurm" / "001" / "array.sbatch").read_text().splitlines()
    for option in ("--time=1:00:00", "--signal=B:TERM@120", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {option}" in script
    assert script[-1].startswith("exec ")  # the batch shell B: signals is the task itself
    assert main(["sweep", *words, "--slurm", "slurm_signal_seconds=300",
                 "slurm_requeue=false"]) == 0
    script = (runs / "f" / "slurm" / "002" / "array.sbatch").read_text()
    assert "#SBATCH --signal=B:TERM@300\n" in script and "--requeue" not in script
    assert main(["sweep", *words, "--slurm", "slurm_signal_seconds=-1"]) == 2
    assert "slurm_signal_seconds must be >= 0" in capsys.readouterr().err
