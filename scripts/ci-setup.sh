#!/usr/bin/env bash
# Installs what the tests need that cargo does not bring: ASE and vesin
# (independent references), maturin and pytest (the Python package and its
# tests) and the four SevenNet checkpoints (from the sevenn wheel on PyPI;
# never committed).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import ase, vesin, numpy" >/dev/null 2>&1; then
  python3 -m pip install -q ase vesin numpy
fi
if ! python3 -c "import maturin, pytest" >/dev/null 2>&1; then
  python3 -m pip install -q "maturin>=1.9,<2" pytest
fi
bash scripts/fetch-sevennet.sh >/dev/null

# OpenMPI and libclang (bindgen) for the MPI backend (`--features mpi`).
mpi_packages="libopenmpi-dev openmpi-bin libclang-dev"
missing=""
for p in $mpi_packages; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  # shellcheck disable=SC2086  # word splitting of the package list is intended
  $sudo apt-get install -y -q --no-install-recommends $missing
fi
