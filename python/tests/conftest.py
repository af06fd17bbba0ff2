"""Shared helpers: the repository's `ddmlip` binary (the reference the
package must equal) and the shared SevenNet-0 fixtures."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
# The shared fixtures sit beside the repository (as the Rust tests find them).
FIXTURES = REPO.parent / "shared" / "fixtures"


def ddmlip_binary() -> Path:
    """`$DDMLIP_BIN`, else the binary cargo built in this repository."""
    env = os.environ.get("DDMLIP_BIN")
    candidates = [Path(env)] if env else [REPO / "target" / p / "ddmlip" for p in ("debug", "release")]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(
        "no ddmlip binary: build it with `cargo build -p ddmlip-cli` or set DDMLIP_BIN "
        f"(looked at {', '.join(map(str, candidates))})"
    )


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the `ddmlip` command; returns the completed process."""
    proc = subprocess.run(
        [str(ddmlip_binary()), *args], capture_output=True, text=True, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ddmlip {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def cli_error(*args: str) -> str:
    """The message `ddmlip` prints after `error: ` for bad input (exit status 2)."""
    proc = run_cli(*args, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0][len("error: ") :]


def cli_eval(structure: Path, model: str, *extra: str) -> dict:
    """`ddmlip eval --json` of a structure file."""
    return json.loads(run_cli("eval", "--model", model, "--structure", str(structure), "--json", *extra).stdout)


def max_rel(a, b) -> float:
    """Largest |a − b| relative to the largest |b| (absolute below 1)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
    return float(np.max(np.abs(a - b))) / scale if b.size else 0.0


@pytest.fixture(scope="session")
def sevennet_fixtures() -> Path:
    # As the Rust GPU tests: `DDMLIP_FIXTURE_XYZ` names the frames on a
    # machine without the shared fixtures beside the repository.
    env = os.environ.get("DDMLIP_FIXTURE_XYZ")
    path = Path(env) if env else FIXTURES / "sevennet0" / "sevennet0_public.extxyz"
    if not path.is_file():
        pytest.fail(f"SevenNet-0 fixtures missing at {path}")
    return path


@pytest.fixture(scope="session")
def sevennet_available() -> None:
    """The SevenNet-0 checkpoint (scripts/fetch-sevennet.sh installs it)."""
    import ddmlip

    names = dict(ddmlip.models())
    if "checkpoint not installed" in names.get("sevennet-0", ""):
        pytest.fail("SevenNet-0 checkpoint not installed: run `bash scripts/fetch-sevennet.sh`")
