#!/usr/bin/env bash
# Installs what the tests need that cargo does not bring: ASE and vesin
# (independent references) and the SevenNet-0 checkpoint (from the sevenn
# wheel on PyPI; never committed).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import ase, vesin, numpy" >/dev/null 2>&1; then
  python3 -m pip install -q ase vesin numpy
fi
bash scripts/fetch-sevennet.sh >/dev/null
