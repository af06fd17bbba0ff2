"""`ddmlip.md` and `ddmlip.relax` against independent references: ASE's
VelocityVerlet with ASE's LennardJones, the `ddmlip` command on the same
input, and the single-rank run for the decomposed one."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.calculators.lj import LennardJones
from ase.io import read, write
from ase.md.verlet import VelocityVerlet

import ddmlip
from conftest import cli_error, run_cli


def argon(rattle: float = 0.05, temperature: float = 60.0):
    """108 argon atoms, rattled, with Maxwell–Boltzmann momenta."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    atoms.rattle(rattle, seed=3)
    rng = np.random.default_rng(7)
    masses = atoms.get_masses()[:, None]
    p = rng.normal(size=(len(atoms), 3)) * np.sqrt(masses * temperature * units.kB)
    atoms.set_momenta(p - p.mean(axis=0))
    return atoms


def ase_lj():
    # The built-in `lj`: argon ε, σ, cutoff 3σ, shifted.
    return LennardJones(epsilon=0.0104, sigma=3.4, rc=10.2, smooth=False)


def test_nve_equals_ase_velocity_verlet():
    atoms = argon()
    start = atoms.copy()
    out = ddmlip.md("lj", atoms, ensemble="nve", dt=2.0, steps=100, log_every=10)
    # The input is not modified.
    assert np.array_equal(atoms.positions, start.positions)

    ref = start.copy()
    ref.calc = ase_lj()
    VelocityVerlet(ref, timestep=2.0 * units.fs).run(100)
    # ddmlip wraps atoms into the cell, ASE's VelocityVerlet does not.
    frac = np.linalg.solve(ref.cell.T, (out.atoms.positions - ref.positions).T).T
    dpos = np.max(np.abs((frac - np.round(frac)) @ ref.cell))
    dmom = np.max(np.abs(out.atoms.get_momenta() - ref.get_momenta()))
    assert dpos < 1e-8, dpos
    assert dmom < 1e-8, dmom
    # The final calculator carries the final energy, forces and stress.
    assert abs(out.atoms.get_potential_energy() - ref.get_potential_energy()) < 1e-8
    assert np.max(np.abs(out.atoms.get_forces() - ref.get_forces())) < 1e-8
    assert np.max(np.abs(out.atoms.get_stress() - ref.get_stress())) < 1e-8
    # The thermo table: steps 0, 10, ..., 100 with the ASE energies at the end.
    assert list(out.thermo["step"]) == list(range(0, 101, 10))
    assert set(out.thermo) == set(ddmlip.dynamics.THERMO_COLUMNS)
    assert abs(out.thermo["potential_eV"][-1] - ref.get_potential_energy()) < 1e-8
    assert abs(out.thermo["kinetic_eV"][-1] - ref.get_kinetic_energy()) < 1e-8
    assert abs(out.thermo["temperature_K"][-1] - ref.get_temperature()) < 1e-6
    assert np.isclose(out.thermo["volume_A3"][-1], ref.get_volume())
    assert out.summary["steps"] == 100 and out.summary["n_atoms"] == 108


@pytest.mark.parametrize("ensemble", ["nve", "langevin"])
def test_ranks_equal_single_rank(ensemble):
    atoms = argon()
    kw = dict(ensemble=ensemble, dt=4.0, steps=60, temperature=80.0, skin=0.5)
    one = ddmlip.md("lj", atoms, ranks=1, **kw)
    three = ddmlip.md("lj", atoms, ranks=3, **kw)
    assert one.summary["rebuilds"] > 0  # migrations happened on the way
    assert np.max(np.abs(one.atoms.positions - three.atoms.positions)) < 1e-10
    assert np.max(np.abs(one.atoms.get_momenta() - three.atoms.get_momenta())) < 1e-10
    for name in ("potential_eV", "kinetic_eV", "conserved_eV"):
        scale = max(1.0, np.max(np.abs(one.thermo[name])))
        assert np.max(np.abs(one.thermo[name] - three.thermo[name])) < 1e-10 * scale, name


def test_md_equals_cli(tmp_path):
    structure = tmp_path / "ar.xyz"
    write(structure, argon(), format="extxyz")
    # Both read the file, so both start from the same (rounded) numbers.
    atoms = read(structure)
    out = ddmlip.md(
        "lj", atoms, ensemble="nose-hoover", dt=3.0, steps=40, temperature=70.0,
        ranks=2, log_every=5, traj=tmp_path / "py.xyz", traj_every=20,
    )
    proc = run_cli(
        "md", "--model", "lj", "--structure", str(structure), "--ensemble", "nose-hoover",
        "--dt", "3", "--steps", "40", "--temperature", "70", "--ranks", "2",
        "--log", str(tmp_path / "cli.csv"), "--log-every", "5",
        "--traj", str(tmp_path / "cli.xyz"), "--traj-every", "20",
        "--output", str(tmp_path / "final.xyz"), "--json",
    )
    summary = json.loads(proc.stdout)
    for key in ("potential_energy", "kinetic_energy", "total_energy", "conserved",
                "mean_temperature", "mean_temperature_logged"):
        assert abs(out.summary[key] - summary[key]) < 1e-10 * max(1.0, abs(summary[key])), key
    for key in ("steps", "last_step", "rebuilds", "migrated", "n_atoms", "ranks", "ensemble"):
        assert out.summary[key] == summary[key], key
    final = read(tmp_path / "final.xyz")
    assert np.max(np.abs(out.atoms.positions - final.positions)) < 1e-10
    assert np.max(np.abs(out.atoms.get_momenta() - final.get_momenta())) < 1e-10
    assert np.max(np.abs(out.atoms.get_forces() - final.get_forces())) < 1e-10
    with open(tmp_path / "cli.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(ddmlip.dynamics.THERMO_COLUMNS)
    assert [int(r["step"]) for r in rows] == list(out.thermo["step"])
    # The log prints temperatures with 6 decimals, energies with 11 digits.
    for name, atol in (("temperature_K", 1e-6), ("potential_eV", 1e-9), ("kinetic_eV", 1e-9),
                       ("conserved_eV", 1e-9), ("pressure_GPa", 1e-9)):
        cli = np.array([float(r[name]) for r in rows])
        assert np.allclose(out.thermo[name], cli, rtol=1e-9, atol=atol), name
    # The trajectory holds the same frames as the command's.
    py_traj, cli_traj = read(tmp_path / "py.xyz", ":"), read(tmp_path / "cli.xyz", ":")
    assert [a.info["step"] for a in cli_traj] == [0, 20, 40]
    assert len(py_traj) == len(cli_traj)
    for a, b in zip(py_traj, cli_traj):
        assert a.info["step"] == b.info["step"]
        assert np.array_equal(a.positions, b.positions)
        assert np.array_equal(a.get_momenta(), b.get_momenta())


def test_relax_converges_and_equals_cli(tmp_path):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 3))
    atoms.rattle(0.15, seed=9)
    structure = tmp_path / "ar.xyz"
    write(structure, atoms, format="extxyz")
    atoms = read(structure)
    ref = atoms.copy()
    ref.calc = ase_lj()
    fmax0 = np.max(np.linalg.norm(ref.get_forces(), axis=1))
    assert fmax0 > 0.05

    out = ddmlip.relax("lj", atoms, fmax=0.01, max_steps=500, ranks=2)
    assert out.summary["converged"]
    # Independent check of the result: ASE's LennardJones on the positions.
    check = out.atoms.copy()
    check.calc = ase_lj()
    fmax = np.max(np.linalg.norm(check.get_forces(), axis=1))
    assert fmax < 0.01, fmax
    assert abs(fmax - out.summary["fmax"]) < 1e-10
    assert abs(check.get_potential_energy() - out.summary["energy"]) < 1e-10
    assert out.summary["energy"] < out.summary["initial_energy"]

    proc = run_cli(
        "relax", "--model", "lj", "--structure", str(structure), "--fmax", "0.01",
        "--max-steps", "500", "--ranks", "2", "--output", str(tmp_path / "out.xyz"), "--json",
    )
    summary = json.loads(proc.stdout)
    assert summary["steps"] == out.summary["steps"]
    assert abs(summary["energy"] - out.summary["energy"]) < 1e-10
    cli = read(tmp_path / "out.xyz")
    assert np.max(np.abs(cli.positions - out.atoms.positions)) < 1e-10
    assert np.max(np.abs(cli.get_forces() - out.atoms.get_forces())) < 1e-10


def test_bad_input_raises_the_cli_message(tmp_path):
    atoms = argon()
    structure = tmp_path / "ar.xyz"
    write(structure, atoms, format="extxyz")
    base = ("md", "--model", "lj", "--structure", str(structure), "--ensemble", "nve")
    for flags, kwargs in [
        (("--dt", "-1", "--steps", "10"), dict(dt=-1.0, steps=10)),
        (("--dt", "1", "--steps", "0"), dict(dt=1.0, steps=0)),
        (("--dt", "1", "--steps", "5", "--skin", "-1"), dict(dt=1.0, steps=5, skin=-1.0)),
    ]:
        expected = cli_error(*base, *flags)
        with pytest.raises(ValueError) as err:
            ddmlip.md("lj", atoms, **kwargs)
        assert str(err.value) == expected
    expected = cli_error("md", "--model", "lj", "--structure", str(structure),
                         "--ensemble", "langevin", "--dt", "1", "--steps", "5")
    with pytest.raises(ValueError) as err:
        ddmlip.md("lj", atoms, ensemble="langevin", dt=1.0, steps=5)
    assert str(err.value) == expected
    with pytest.raises(ValueError, match="ensemble"):
        ddmlip.md("lj", atoms, ensemble="npt-magic", dt=1.0, steps=5)
    bad = atoms.copy()
    bad.positions[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        ddmlip.md("lj", bad, dt=1.0, steps=5)
    with pytest.raises(ValueError, match="finite"):
        ddmlip.relax("lj", bad)
    expected = cli_error("relax", "--model", "lj", "--structure", str(structure), "--fmax", "-1")
    with pytest.raises(ValueError) as err:
        ddmlip.relax("lj", atoms, fmax=-1.0)
    assert str(err.value) == expected
    with pytest.raises(ValueError, match="ranks"):
        ddmlip.md("lj", atoms, dt=1.0, steps=5, ranks=0)
    with pytest.raises(ValueError, match="backend"):
        ddmlip.relax("lj", atoms, backend="mpi")


def test_relax_cell_equals_ase_unit_cell_filter():
    """``relax(cell=True, pressure=P)`` follows ASE's FIRE on a
    ``UnitCellFilter`` step for step: same steps, same energy and cell."""
    from ase.filters import UnitCellFilter
    from ase.optimize import FIRE

    atoms = bulk("Ar", "fcc", a=5.2, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=3)
    atoms.set_cell(atoms.cell[:] @ np.diag([1.02, 0.99, 1.0]), scale_atoms=True)
    ref = atoms.copy()
    ref.calc = ase_lj()
    opt = FIRE(UnitCellFilter(ref, scalar_pressure=0.1 * units.GPa), logfile=None)
    opt.run(fmax=1e-4, steps=2000)

    out = ddmlip.relax("lj", atoms, fmax=1e-4, max_steps=2000, ranks=2, cell=True, pressure=0.1)
    assert out.summary["converged"]
    assert out.summary["steps"] == opt.nsteps
    assert abs(out.summary["energy"] - ref.get_potential_energy()) < 1e-10
    assert np.max(np.abs(out.atoms.cell[:] - ref.cell[:])) < 1e-8
    # The returned atoms carry the relaxed cell and its stress (≈ −P).
    assert np.max(np.abs(out.atoms.get_stress()[:3] + 0.1 * units.GPa)) < 1e-5

    with pytest.raises(ValueError, match="pressure"):
        ddmlip.relax("lj", atoms, pressure=1.0)
