#!/usr/bin/env bash
# Installs the test-only dependencies: ASE and vesin (independent references).
set -euo pipefail
if ! python3 -c "import ase, vesin, numpy" >/dev/null 2>&1; then
  python3 -m pip install -q ase vesin numpy
fi
