#!/usr/bin/env bash
# Set up a fresh machine.
#   ./setup.sh         system packages on Linux, then .venv with the project and its dev extra
#                      (MLX, PyTorch, the analysis, the test tools): everything, the tests included
#   ./setup.sh torch   .venv with the core and PyTorch only (the torch extra), for backend=torch
#                      runs on a CUDA machine: no MLX, no analysis, no system packages. A PyTorch
#                      the machine already has (`$PYTHON -c "import torch"`, PYTHON defaulting
#                      to python3) is used as it is: .venv sees that interpreter's packages, the
#                      project is linked in without a build, and only what is missing is
#                      installed, so with everything present it needs no network
#   ./setup.sh summary only the closing summary: what is installed and what a missing piece costs
# Quiet but alive: one line per stage (dots while it waits), the full output in .setup.log, and
# at the end what is and is not installed and what a missing piece costs.
set -euo pipefail
cd "$(dirname "$0")"
MODE=${1:-dev}
case "$MODE" in
  dev | torch | summary) ;;
  *) echo "usage: ./setup.sh [torch | summary]" >&2; exit 2 ;;
esac
LOG=.setup.log

# run "$@" with its output in the log, printing a dot every 5 s; returns its exit status
quietly() {
  "$@" >>"$LOG" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do sleep 5; kill -0 "$pid" 2>/dev/null && printf '.'; done
  wait "$pid"
}
stage() { printf '%s ' "$1"; }
row() { printf '  %-10s %s\n' "$1" "$2"; }
# OpenBLAS is in the loader's cache. The listing is read whole before it is searched: a pipe into
# `grep -q` under pipefail fails when grep exits before ldconfig has written everything (SIGPIPE).
# SETUP_LDCONFIG: the command that lists the cache (tests/test_setup_summary.py replaces it).
has_openblas() {
  local listing
  listing=$(${SETUP_LDCONFIG:-ldconfig -p} 2>/dev/null) || true
  [[ $listing == *libopenblas.so.0* ]]
}
# what is there, and what a missing piece costs
summary() {
  echo "installed:"
  if [ "$(uname -s)" = Linux ]; then
    if has_openblas; then row OpenBLAS yes
    else row OpenBLAS "NO: MLX's CPU matmuls run ~50x slower (apt-get install libopenblas0-pthread)"; fi
    if command -v g++ >/dev/null; then row g++ yes
    else row g++ "NO: MLX cannot compile its CPU kernels, training fails (apt-get install g++)"; fi
    if command -v chromium >/dev/null; then row Chromium yes
    else row Chromium "NO: the report page test is skipped (apt-get install chromium)"; fi
    if [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ]; then row Slurm yes
    else row Slurm "NO: the Slurm test is skipped (apt-get install slurm-wlm munge)"; fi
  fi
  row .venv "$(.venv/bin/python -c 'import mlx.core as mx, torch; print(f"mlx {mx.__version__}, torch {torch.__version__}")' 2>/dev/null \
    || echo "NO: MLX or PyTorch does not import (./setup.sh)")"
  echo "ready: .venv/bin/just --list (full set-up log: $LOG)"
}
if [ "$MODE" = summary ]; then summary; exit 0; fi
: >"$LOG"

if [ "$MODE" = dev ] && [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  apt_install() {
    quietly $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "$@" \
      || { quietly $sudo apt-get update -qq \
           && quietly $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                --no-install-recommends "$@"; }
  }
  # OpenBLAS: MLX's Linux wheel ships the reference BLAS (~50x slower matmuls); mlx_gpt loads
  # OpenBLAS when present. g++: MLX's CPU backend compiles its fused kernels at run time.
  # Chromium: the report's headless page test.
  need=()
  has_openblas || need+=(libopenblas0-pthread)
  command -v g++ >/dev/null || need+=(g++)
  command -v chromium >/dev/null || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    stage "system packages (${need[*]})"
    if apt_install "${need[@]}"; then echo " done"; else echo " FAILED (see $LOG)"; fi
  fi
  # Slurm and munge: tests/test_slurm.py starts a one-node cluster on this machine (as root) and
  # runs a sweep as a job array; without them that test is skipped.
  if ! [ -x /usr/sbin/slurmctld ] || ! [ -x /usr/sbin/munged ]; then
    stage "slurm-wlm and munge (for the Slurm test)"
    if apt_install slurm-wlm munge; then echo " done"; else echo " FAILED (see $LOG)"; fi
  fi
fi

# torch mode with a PyTorch already there: a .venv that sees it, nothing installed that is present
if [ "$MODE" = torch ] && "${PYTHON:-python3}" -c "import torch" >/dev/null 2>&1; then
  PY=${PYTHON:-python3}
  "$PY" -c 'import os, torch
cuda = torch.version.cuda or "none: a CPU build"
print(f"found torch {torch.__version__} (CUDA {cuda}) in {os.path.dirname(os.path.dirname(torch.__file__))}")'
  # what the core and the torch extra need that $PY's packages lack (.venv sees the same ones)
  missing=$("$PY" - <<'PYEOF'
import importlib.metadata as metadata, re, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["torch"]:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        if name != "torch":  # imported above: a torch without its metadata is still a torch
            print(requirement.split(";")[0])
PYEOF
)
  stage "python environment .venv (seeing $PY's packages)"
  # pip only when there is something to install (ensurepip is the slow part of a venv)
  if ! quietly "$PY" -m venv --system-site-packages $([ -n "$missing" ] || echo --without-pip) \
      .venv; then
    echo " FAILED"; tail -n 20 "$LOG" >&2; exit 1
  fi
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # $PY may itself be a venv or conda env, whose packages a new venv does not inherit: list
  # where its packages are, and the checkout itself (what an editable install does, no build)
  "$PY" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' >"$site/machine-python.pth"
  pwd >"$site/qknorm-study.pth"
  echo " done"
  if [ -n "$missing" ]; then
    stage "installing what is missing ($(echo $missing))"
    # shellcheck disable=SC2086  (one requirement a word)
    if quietly .venv/bin/python -m pip install $missing; then echo " done"
    else echo " FAILED"; tail -n 20 "$LOG" >&2; exit 1; fi
  else
    echo "nothing to install: the core's and the torch extra's packages are all there"
  fi
  READY_TORCH=1
fi

if [ -z "${READY_TORCH:-}" ]; then
  stage "python environment .venv"
  # (the dev set-up brings pip up to date; torch mode keeps the venv's own, one download less)
  if quietly python3 -m venv .venv \
      && { [ "$MODE" = torch ] || quietly .venv/bin/python -m pip install --upgrade pip; }; then
    echo " done"
  else
    echo " FAILED"; tail -n 20 "$LOG" >&2; exit 1
  fi
  if [ "$MODE" = torch ]; then
    stage "the project with its torch extra (numpy, pyarrow, scipy, tiktoken, PyTorch; minutes)"
    extra=torch
  else
    stage "the project with its dev extra (MLX, PyTorch, Polars, Altair, pytest, just; minutes)"
    extra=dev
  fi
  if quietly .venv/bin/python -m pip install -e ".[$extra]"; then
    echo " done"
  else
    echo " FAILED"; tail -n 20 "$LOG" >&2; exit 1
  fi
fi

if [ "$MODE" = torch ]; then
  echo "installed:"
  row .venv "$(.venv/bin/python -c 'import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
cuda = torch.version.cuda or "none (a CPU build)"
print(f"torch {torch.__version__}, CUDA {cuda}, GPU: {gpu}")')"
  if command -v cc >/dev/null || command -v gcc >/dev/null; then row "C compiler" yes
  else row "C compiler" "NO: compile=true (Triton) needs one; every other setting runs"; fi
  echo "ready: .venv/bin/python -m qkstudy sweep backend=torch device=cuda ... (docs/sweeps.md#where-to-run)"
  exit 0
fi

summary
