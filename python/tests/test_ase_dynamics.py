"""ASE's own integrators driving `ddmlip.Calculator` against the `ddmlip md`
command: ASE's `VelocityVerlet` with the calculator must follow the command's
NVE trajectory and conserve energy as well as it does."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.io import read, write
from ase.md.verlet import VelocityVerlet

import ddmlip
from conftest import run_cli


def _start(symbol: str, a: float, lattice: str, reps, temperature: float, seed: int):
    atoms = bulk(symbol, lattice, a=a, cubic=True).repeat(reps)
    atoms.rattle(0.03, seed=seed)
    rng = np.random.default_rng(seed)
    masses = atoms.get_masses()[:, None]
    p = rng.normal(size=(len(atoms), 3)) * np.sqrt(masses * temperature * units.kB)
    atoms.set_momenta(p - p.mean(axis=0))
    return atoms


CASES = {
    # a many-body model (density + embedding), cheap enough for many steps
    "eam-demo": dict(symbol="Cu", a=3.615, lattice="fcc", reps=(2, 2, 2), dt=2.0, steps=150, ranks=2),
    # the real potential, on a small crystal
    "sevennet-0": dict(symbol="Si", a=5.43, lattice="diamond", reps=(2, 1, 1), dt=1.0, steps=30, ranks=1),
}


@pytest.mark.parametrize("model", sorted(CASES))
def test_ase_velocity_verlet_follows_cli_nve(tmp_path, model, request):
    case = CASES[model]
    if model == "sevennet-0":
        request.getfixturevalue("sevennet_available")  # fails with how to install it
    structure = tmp_path / "start.xyz"
    write(structure, _start(case["symbol"], case["a"], case["lattice"], case["reps"], 400.0, 11), format="extxyz")
    atoms = read(structure)  # both runs start from the file's (rounded) numbers
    n = len(atoms)

    atoms.calc = ddmlip.Calculator(model, ranks=case["ranks"])
    totals = []

    def record():
        totals.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())

    dyn = VelocityVerlet(atoms, timestep=case["dt"] * units.fs)
    dyn.attach(record, interval=1)
    dyn.run(case["steps"])

    run_cli(
        "md", "--model", model, "--structure", str(structure), "--ensemble", "nve",
        "--dt", str(case["dt"]), "--steps", str(case["steps"]), "--ranks", str(case["ranks"]),
        "--log", str(tmp_path / "nve.csv"), "--log-every", "1", "--output", str(tmp_path / "final.xyz"),
    )
    with open(tmp_path / "nve.csv") as f:
        rows = list(csv.DictReader(f))
    cli_totals = np.array([float(r["total_eV"]) for r in rows])
    ase_totals = np.array(totals)
    assert len(cli_totals) == len(ase_totals) == case["steps"] + 1

    # The same integrator on the same forces: the same trajectory (ddmlip
    # wraps atoms into the cell, ASE does not).
    final = read(tmp_path / "final.xyz")
    frac = np.linalg.solve(atoms.cell.T, (final.positions - atoms.positions).T).T
    assert np.max(np.abs((frac - np.round(frac)) @ atoms.cell)) < 1e-8
    assert np.max(np.abs(final.get_momenta() - atoms.get_momenta())) < 1e-8
    # Hence the same energy conservation, step by step (the log prints 11 digits).
    assert np.max(np.abs(cli_totals - ase_totals)) < 1e-8 * max(1.0, np.max(np.abs(cli_totals)))
    # And it does conserve: the total energy wanders far less than the
    # kinetic energy it exchanges with the potential.
    kinetic = np.array([float(r["kinetic_eV"]) for r in rows])
    wander = np.max(np.abs(ase_totals - ase_totals[0])) / n
    assert wander < 0.02 * (kinetic.max() - kinetic.min() + kinetic.mean()) / n, wander
