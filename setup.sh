#!/usr/bin/env bash
# Set up a fresh machine: system libraries on Linux, then .venv with the project and its dev extra.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null; then
  # OpenBLAS: MLX's Linux wheel ships the reference BLAS (~50x slower matmuls); mlx_gpt loads
  # OpenBLAS automatically when it is present. Chromium: the report's headless render test.
  need=()
  ldconfig -p 2>/dev/null | grep -q libopenblas.so.0 || need+=(libopenblas0-pthread)
  command -v chromium >/dev/null || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    # Neither is required: without OpenBLAS MLX is slow, without Chromium one test is skipped.
    $sudo apt-get install -y --no-install-recommends "${need[@]}" \
      || { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "${need[@]}"; } \
      || echo "warning: could not install ${need[*]}; continuing without" >&2
  fi
  # Slurm and munge: tests/test_slurm.py starts a one-node cluster on this machine (as root) and
  # runs a sweep as a job array; without them that test is skipped.
  if ! [ -x /usr/sbin/slurmctld ] || ! [ -x /usr/sbin/munged ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing slurm-wlm and munge (apt) for the Slurm test ..."
    { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurm-wlm munge; } >/dev/null 2>&1 \
      || echo "warning: could not install slurm-wlm and munge; the Slurm test will be skipped" >&2
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "ready: .venv (try: .venv/bin/just --list)"
