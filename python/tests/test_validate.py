"""`ddmlip.validate` against `ddmlip validate --json` on the same input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ase.build import bulk
from ase.io import write

import ddmlip
from conftest import run_cli


@pytest.fixture(scope="module")
def cu(tmp_path_factory):
    atoms = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((4, 4, 4))
    atoms.rattle(0.03, seed=1)
    path = tmp_path_factory.mktemp("validate") / "cu256.xyz"
    write(path, atoms, format="extxyz")
    from ase.io import read

    return read(path), path


def wrong_prior() -> dict:
    """rebuild-demo builds its own neighbour list, so `halo_correction`
    double-counts: a prior that fails until auto-fix switches to `local`."""
    return {
        "version": 1,
        "policy": {"kind": "halo", "scatter": "halo_correction", "gather": "halo_read"},
        "system_reductions": True,
        "output_kinds": {
            "atomic_energies": "per_atom",
            "energy": "per_system",
            "forces": "per_atom",
            "stress": "per_system",
        },
        "owned_only_outputs": [],
        "all_reduce_outputs": ["stress"],
        "op_adapters": [],
        "halo_depth": 1,
    }


def cli_report(path, *args):
    proc = run_cli("validate", "--structure", str(path), "--json", *args, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout), proc.returncode


def same_verdict(py: dict, cli: dict):
    assert set(py) == set(cli)
    for key in ("ok", "model", "ranks", "atol", "rtol", "prior_source", "spec", "fix_applied", "next_action", "inferred"):
        assert py[key] == cli[key], key
    assert len(py["attempts"]) == len(cli["attempts"])
    for a, b in zip(py["attempts"], cli["attempts"]):
        assert a["spec"] == b["spec"]
        assert a.keys() == b.keys()


def test_pass_equals_cli(cu):
    atoms, path = cu
    report = ddmlip.validate("schnet-demo", atoms, ranks=4)
    cli, status = cli_report(path, "--model", "schnet-demo", "--ranks", "4")
    assert status == 0 and report.ok and report["ok"]
    same_verdict(report, cli)
    assert report.diagnostics["partition_health"]
    assert "PASS" in report.summary()


def test_autofix_equals_cli(cu, tmp_path):
    atoms, path = cu
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps(wrong_prior()))
    report = ddmlip.validate("rebuild-demo", atoms, ranks=4, spec=wrong_prior())
    cli, status = cli_report(path, "--model", "rebuild-demo", "--ranks", "4", "--spec", str(prior))
    assert status == 0 and report.ok
    assert len(report.attempts) == 2 and report.spec["policy"]["scatter"] == "local"
    same_verdict(report, cli)
    # A spec file path gives the same.
    assert ddmlip.validate("rebuild-demo", atoms, ranks=4, spec=prior).spec == report.spec
    out = tmp_path / "fixed.json"
    report.save_spec(out)
    assert json.loads(out.read_text()) == report.spec


def test_failure_is_reported_or_raised(cu, tmp_path):
    atoms, path = cu
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps(wrong_prior()))
    report = ddmlip.validate("rebuild-demo", atoms, ranks=4, spec=wrong_prior(), autofix=False)
    cli, status = cli_report(path, "--model", "rebuild-demo", "--ranks", "4", "--spec", str(prior), "--no-autofix")
    assert status == 1 and not report.ok
    same_verdict(report, cli)
    with pytest.raises(ddmlip.ValidationError) as err:
        ddmlip.validate("rebuild-demo", atoms, ranks=4, spec=wrong_prior(), autofix=False, check=True)
    assert err.value.report.ok is False
    assert err.value.report.next_action == cli["next_action"]
    assert "FAIL" in str(err.value)


def test_batch_of_atoms(cu):
    atoms, _ = cu
    small = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((2, 2, 2))
    report = ddmlip.validate("eam-demo", [atoms, small], ranks=2)
    assert report.ok
    assert len(report.diagnostics["partition_health"]) == 2


def test_bad_input_raises_value_error(cu):
    atoms, path = cu
    with pytest.raises(ValueError, match="unknown model `nosuch`"):
        ddmlip.validate("nosuch", atoms)
    with pytest.raises(ValueError):
        ddmlip.validate("lj", atoms, spec={"version": 99})
    bad = atoms.copy()
    bad.positions[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        ddmlip.validate("lj", bad)
    with pytest.raises(ValueError, match="dtype"):
        ddmlip.validate("lj", atoms, dtype="float16")
