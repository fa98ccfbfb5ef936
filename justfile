# The study's interface. Words after a recipe are forwarded as they are: `just sweep depth=6`.
set positional-arguments

py := if path_exists(".venv/bin/python") == "true" { ".venv/bin/python" } else { "python3" }

# list the recipes
default:
    @{{just_executable()}} --list --unsorted --justfile {{justfile()}}

# create .venv and install the project (and, on Linux, OpenBLAS and Chromium)
[group('1 get started')]
setup:
    @./setup.sh

# a first result on the embedded synthetic corpus (32 runs: depth 2, 4 LRs, 4 seeds), then its report (1m32s on 2 idle cores: docs/sweeps.md)
[group('1 get started')]
demo *args:
    @test -f data/synthetic-bytes/meta.json || {{py}} -m qkstudy prepare synthetic tokenizer=bytes
    @{{py}} -m qkstudy sweep preset=demo "$@"
    @{{py}} -m analysis report runs/demo out=reports/demo

# whether a run needs QK-norm, from the published results: just advise lr=3e-3 warmup=100 steps=2000 [d_model=N] [depth=N] [vocab=N]
[group('1 get started')]
advise *args:
    @{{py}} -m analysis advise "$@"

# every run of a sweep and its progress, time left on this machine: just status [RUNS_DIR | SWEEP_DIR] [--watch[=SECONDS]] (--watch redraws it until Ctrl-C)
[group('1 get started')]
status *args:
    @{{py}} -m qkstudy status "$@"

# tables, charts, verdicts and report.html: just report [RUNS_DIR [OTHER_RUNS_DIR: compared]] [framework=NAME[,NAME]] [out=DIR] [key=value ...]
[group('1 get started')]
report *args:
    @{{py}} -m analysis report "$@"

# tokenise a corpus: just prepare synthetic|tinystories|fineweb-edu|PATH [tokenizer=gpt2|bytes] ...
[group('2 run the study')]
prepare *args:
    @{{py}} -m qkstudy prepare "$@"

# train one run: just train lr=3e-3 qk_norm=rmsnorm depth=6 ...
[group('2 run the study')]
train *args:
    @{{py}} -m qkstudy train "$@"

# QK-norm x LR grid x seeds: just sweep depth=6 | depth=2,4,8 [--dry-run --calibrate] [--emit-commands]
[group('2 run the study')]
sweep *args:
    @{{py}} -m qkstudy sweep "$@"

# the smallest study that tests H1-H3 (little power for H3: docs/report.md): depths 2,4,8 x both arms x 8 LRs x 5 seeds fixed in advance (+ boundary and crossing bisection; max_seeds 5: no adaptive seeds), then its report (wall time: docs/results.md)
[group('2 run the study')]
mini *args:
    #!/usr/bin/env bash
    set -euo pipefail
    name=mini  # the sweep folder the report reads: name= and runs_dir= as the sweep takes them
    runs=runs
    for word in "$@"; do case "$word" in name=*) name=${word#name=};; runs_dir=*) runs=${word#runs_dir=};; esac; done
    test -f data/synthetic-bytes/meta.json || {{py}} -m qkstudy prepare synthetic tokenizer=bytes
    {{py}} -m qkstudy sweep preset=mini "$@"
    {{py}} -m analysis report "$runs/$name" out="reports/$name"

# the ladder (docs/report.md): each point a sweep into runs/ladder/<point>, resumable: just ladder [points=NAME,NAME] [--dry-run]
[group('2 run the study')]
ladder *args:
    @test -f data/synthetic-bytes/meta.json || {{py}} -m qkstudy prepare synthetic tokenizer=bytes
    @{{py}} -m qkstudy ladder "$@"

# a study's finished runs as one compact .tar.xz (no weights), or restore=FILE into runs/: just archive runs/mini [out=results/mini.tar.xz]
[group('2 run the study')]
archive *args:
    @{{py}} -m qkstudy archive "$@"

# MLX vs PyTorch: logits, loss, gradients, probes and a 50-step trajectory; non-zero on a broken tolerance
[group('3 check the engines and the machine')]
parity *args:
    @{{py}} -m crosscheck parity "$@"

# a finished run again in the other engine (MLX -> torch, torch -> MLX), judged against it (loss curve, final loss, gradient norm, outcome); non-zero on a broken tolerance: just spot-check RUN_DIR [device=cuda|mps|cpu] [data=PATH]
[group('3 check the engines and the machine')]
spot-check *args:
    @{{py}} -m crosscheck spot-check "$@"

# every backend's train step timed the same way (fresh processes, median of rounds) at the demo, mini and study presets: PyTorch vs MLX, FLOP/s, probe/eval overhead
[group('3 check the engines and the machine')]
bench *args:
    @{{py}} -m qkstudy bench "$@"


# backend=torch on one CUDA GPU in under 8 minutes: CUDA-vs-CPU parity, tokens/s at the study shape (fp32/tf32/bf16 eager, compiled bf16 at 1 and K runs), a jobs=K demo sweep, one summary table; exits 1 unless every check passed; writes to $OUT or gpu-check/ (device=cpu quick=true: tiny, on the CPU)
[group('3 check the engines and the machine')]
gpu-check *args:
    @{{py}} -m crosscheck gpu-check "$@"

# the analysis plan's false-claim rates (with 95% upper bounds), power and interval coverage on simulated sweeps (docs/report.md): just calibrate [studies=300 seeds=5 scenarios=null,... runs=DIR onset_sd=DECADES]
[group('4 check the statistics and the tooling')]
calibrate *args:
    @{{py}} -m analysis calibrate "$@"

# the storm test: a small jobs=2 sweep under 30 random faults (kill -9, Ctrl-C, SIGTERM, full disk, truncated part, stale lock, full disk at a lock and at the report) must end bit-identical to an undisturbed one: just chaos [faults=N seed=N]
[group('4 check the statistics and the tooling')]
chaos *args:
    @{{py}} -m tests.reliability chaos "$@"

# the I/O-error and crash tests: every file operation of prepare, train, a sweep, report, status and the Slurm writer failed in turn (ENOSPC, EIO; kill -9, SIGINT, SIGTERM for train and sweep): just faults [cases=train,sweep every=true]
[group('4 check the statistics and the tooling')]
faults *args:
    @{{py}} -m tests.reliability faults "$@"

# the test suite, one worker per core, each test file on one worker (so one Slurm cluster at a time)
[group('4 check the statistics and the tooling')]
test *args:
    @{{py}} -m pytest -n auto --dist loadfile "$@"

# the real-Slurm test: a one-node cluster on this machine (Linux, root, slurm-wlm + munge)
[group('4 check the statistics and the tooling')]
test-slurm *args:
    @{{py}} -m pytest tests/test_slurm.py "$@"

# rewrite the docs' generated tables from the code (presets, run keys) and from results/ (the published answer: README, docs/results.md); --check only compares
[group('4 check the statistics and the tooling')]
docs *args:
    @{{py}} -m analysis.doc_tables "$@"
    @{{py}} -m analysis.published "$@"
