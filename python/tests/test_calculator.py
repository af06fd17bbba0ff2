"""`ddmlip.Calculator` against the `ddmlip eval --json` command (same Rust
code, different front door: must agree to 1e-12), against itself split over
ranks, and against physics ASE checks independently (finite differences,
energy conservation of ASE's own VelocityVerlet)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms, units
from ase.build import bulk, molecule
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress
from ase.io import read, write
from ase.md.verlet import VelocityVerlet

import ddmlip
from conftest import cli_eval, max_rel

DEMO_MODELS = ["lj", "eam-demo", "bp-demo", "schnet-demo", "qeq-demo", "rebuild-demo"]


def demo_structures() -> list:
    """Periodic cubic, triclinic, slab-like mixed pbc, and a molecule."""
    rng = np.random.default_rng(7)
    cu = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 3))
    cu.positions += rng.normal(scale=0.05, size=cu.positions.shape)
    tri = bulk("Cu", "fcc", a=3.615).repeat((4, 3, 3))
    tri.set_cell(tri.cell.array @ (np.eye(3) + rng.uniform(-0.04, 0.04, (3, 3))), scale_atoms=True)
    tri.positions += rng.normal(scale=0.04, size=tri.positions.shape)
    slab = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 2))
    slab.center(vacuum=6.0, axis=2)
    slab.pbc = (True, True, False)
    slab.positions += rng.normal(scale=0.03, size=slab.positions.shape)
    mol = molecule("CH3CH2OH")
    mol.center(vacuum=4.0)
    mol.pbc = False
    mol.positions += rng.normal(scale=0.02, size=mol.positions.shape)
    return [cu, tri, slab, mol]


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "demo.xyz"
    write(path, demo_structures(), format="extxyz")
    return path


def assert_matches_cli(calc, frames, cli, tol=1e-12):
    """Every frame's results equal the command's (relative to each output's scale)."""
    offset = 0
    for s, atoms in enumerate(frames):
        atoms = atoms.copy()
        atoms.calc = calc
        n = len(atoms)
        e = atoms.get_potential_energy()
        assert abs(e - cli["energy"][s]) <= tol * max(1.0, abs(cli["energy"][s])), (s, e, cli["energy"][s])
        assert atoms.get_potential_energy(force_consistent=True) == e
        f_ref = np.asarray(cli["forces"][offset : offset + n])
        assert max_rel(atoms.get_forces(), f_ref) <= tol, s
        if "atomic_energies" in cli:
            assert max_rel(atoms.get_potential_energies(), cli["atomic_energies"][offset : offset + n]) <= tol
            # ASE's per-atom energies sum to the energy.
            assert abs(atoms.get_potential_energies().sum() - e) <= 1e-9 * max(1.0, abs(e))
        stress_ref = cli.get("stress", [None] * len(frames))[s] if cli.get("stress") else None
        if atoms.pbc.any():
            assert stress_ref is not None
            assert max_rel(atoms.get_stress(voigt=True), stress_ref) <= tol, s
        else:
            with pytest.raises(Exception):
                atoms.get_stress()
        offset += n


@pytest.mark.parametrize("model", DEMO_MODELS)
def test_demo_models_equal_cli_eval(model, demo_file):
    frames = read(demo_file, ":")
    cli = cli_eval(demo_file, model)
    assert_matches_cli(ddmlip.Calculator(model), frames, cli)


@pytest.mark.parametrize("model", ["schnet-demo", "lj"])
def test_split_over_ranks_equals_cli_and_single_process(model, demo_file):
    frames = read(demo_file, ":")[:2]
    one = ddmlip.Calculator(model, ranks=1)
    four = ddmlip.Calculator(model, ranks=4)
    for atoms in frames:
        a1, a4 = atoms.copy(), atoms.copy()
        a1.calc, a4.calc = one, four
        assert abs(a4.get_potential_energy() - a1.get_potential_energy()) <= 1e-10 * abs(a1.get_potential_energy())
        assert max_rel(a4.get_forces(), a1.get_forces()) <= 1e-10
        assert max_rel(a4.get_stress(), a1.get_stress()) <= 1e-10
        assert max_rel(a4.get_potential_energies(), a1.get_potential_energies()) <= 1e-10
    # And the split run equals the command's split run.
    cli = cli_eval(demo_file, model, "--ranks", "4")
    one_frame = read(demo_file, ":")
    assert_matches_cli(four, one_frame, cli, tol=1e-12)


def small_fixture_frames(source, target, max_atoms=200):
    """Copies the fixture frames of at most `max_atoms` atoms verbatim (the
    text itself, so positions keep every digit)."""
    lines = source.read_text().splitlines(keepends=True)
    kept, k = [], 0
    while k < len(lines):
        n = int(lines[k])
        if n <= max_atoms:
            kept.extend(lines[k : k + n + 2])
        k += n + 2
    target.write_text("".join(kept))
    return target


def test_sevennet0_fixtures_equal_cli_eval_and_upstream(sevennet_fixtures, sevennet_available, tmp_path):
    # Every fixture but the 960-atom one (Rust tests cover that): seconds, not a minute.
    path = small_fixture_frames(sevennet_fixtures, tmp_path / "small.extxyz")
    frames = read(path, ":")
    assert len(frames) == 6
    cli = cli_eval(path, "sevennet-0")
    calc = ddmlip.Calculator("sevennet-0")
    assert_matches_cli(calc, frames, cli)
    # The fixtures also hold upstream's own f64 results: same bar as the Rust tests.
    for atoms in read(path, ":"):
        ref_e = atoms.info["energy"] if "energy" in atoms.info else atoms.get_potential_energy()
        ref_f = atoms.arrays["forces"] if "forces" in atoms.arrays else atoms.calc.results["forces"]
        atoms.calc = calc
        assert abs(atoms.get_potential_energy() - ref_e) / len(atoms) < 1e-12
        assert np.max(np.abs(atoms.get_forces() - ref_f)) < 1e-10


def test_float32_close_to_float64():
    atoms = demo_structures()[0]
    a32, a64 = atoms.copy(), atoms.copy()
    a32.calc = ddmlip.Calculator("schnet-demo", dtype="float32")
    a64.calc = ddmlip.Calculator("schnet-demo", dtype="float64")
    assert a32.get_forces().dtype == np.float64
    assert abs(a32.get_potential_energy() - a64.get_potential_energy()) / len(atoms) < 1e-5
    assert max_rel(a32.get_forces(), a64.get_forces()) < 1e-4


def test_forces_and_stress_are_derivatives_of_the_energy():
    """ASE's finite differences: forces = −dE/dr, stress = (1/V) dE/dε with
    ASE's sign."""
    atoms = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=3)
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.02 * np.random.default_rng(1).normal(size=(3, 3))), scale_atoms=True)
    calc = ddmlip.Calculator("eam-demo")
    atoms.calc = calc
    num_f = calculate_numerical_forces(atoms, eps=1e-5)
    assert np.max(np.abs(atoms.get_forces() - num_f)) < 1e-6
    num_s = calculate_numerical_stress(atoms, eps=1e-6, voigt=True)
    assert np.max(np.abs(atoms.get_stress() - num_s)) < 1e-6


def test_lj_equals_ase_lennard_jones():
    """The built-in `lj` (argon ε, σ, cutoff 3σ, shifted) against ASE's own
    LennardJones calculator: an independent implementation."""
    from ase.calculators.lj import LennardJones

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.1, seed=5)
    ours = atoms.copy()
    ours.calc = ddmlip.Calculator("lj")
    atoms.calc = LennardJones(epsilon=0.0104, sigma=3.4, rc=10.2, smooth=False)
    assert abs(ours.get_potential_energy() - atoms.get_potential_energy()) < 1e-10 * len(atoms)
    assert np.max(np.abs(ours.get_forces() - atoms.get_forces())) < 1e-10
    assert np.max(np.abs(ours.get_stress() - atoms.get_stress())) < 1e-10


def total_energy_trace(calc, dt_fs: float, steps: int) -> np.ndarray:
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.02, seed=11)
    # Maxwell–Boltzmann momenta at 40 K.
    kt = 40 * units.kB
    rng = np.random.default_rng(2)
    masses = atoms.get_masses()[:, None]
    atoms.set_momenta(rng.normal(size=(len(atoms), 3)) * np.sqrt(masses * kt))
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, timestep=dt_fs * units.fs)
    totals = []

    def record():
        totals.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())

    dyn.attach(record, interval=1)
    dyn.run(steps)
    return np.asarray(totals)


def test_ase_velocity_verlet_conserves_energy():
    """ASE's own NVE integrator driven by the calculator: the total energy
    stays put, and its wobble shrinks ~4× when the step is halved (second
    order), which inconsistent forces would break."""
    calc = ddmlip.Calculator("lj", ranks=2)
    coarse = total_energy_trace(calc, 10.0, 100)
    fine = total_energy_trace(calc, 5.0, 200)
    n = 108
    spread_coarse = np.ptp(coarse) / n
    spread_fine = np.ptp(fine) / n
    assert spread_coarse < 3e-5, spread_coarse  # eV/atom over 1 ps
    assert 3.0 < spread_coarse / spread_fine < 5.0, (spread_coarse, spread_fine)


def test_evaluator_survives_changing_systems():
    """One calculator on systems of different sizes and species, then back:
    same answers as fresh calculators."""
    structures = demo_structures()
    calc = ddmlip.Calculator("schnet-demo", ranks=2)
    first = []
    for atoms in structures + structures[:1]:
        a = atoms.copy()
        a.calc = calc
        first.append((a.get_potential_energy(), a.get_forces()))
    for atoms, (e, f) in zip(structures + structures[:1], first):
        a = atoms.copy()
        a.calc = ddmlip.Calculator("schnet-demo", ranks=2)
        assert a.get_potential_energy() == pytest.approx(e, rel=1e-12)
        assert max_rel(a.get_forces(), f) <= 1e-12
    assert calc.held_bytes > 0
    assert calc.model_name == "schnet-demo"


def test_gil_is_released_while_rust_computes():
    """Python keeps running in another thread during an evaluation: the
    longest pause of a busy loop is a fraction of the evaluation's time."""
    import threading
    import time

    atoms = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((6, 6, 7))
    atoms.rattle(0.02, seed=4)
    atoms.calc = ddmlip.Calculator("schnet-demo")
    worker = threading.Thread(target=atoms.get_forces)
    worker.start()
    last, longest_pause = time.perf_counter(), 0.0
    while worker.is_alive():
        now = time.perf_counter()
        longest_pause, last = max(longest_pause, now - last), now
    worker.join()
    evaluation = atoms.calc.last_seconds
    assert evaluation > 0.2, evaluation  # long enough for the comparison to mean something
    assert longest_pause < 0.25 * evaluation, (longest_pause, evaluation)
