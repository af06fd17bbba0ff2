"""`ddmlip.neighbor_list` against ASE's `neighbor_list` (sorted comparison)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, molecule
from ase.neighborlist import neighbor_list as ase_neighbor_list

import ddmlip


def structures():
    rng = np.random.default_rng(4)
    cubic = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 3))
    cubic.rattle(0.05, seed=1)
    tri = bulk("Si", "diamond", a=5.43)  # 2-atom triclinic cell, far smaller than the cutoff
    tri.set_cell(tri.cell.array @ (np.eye(3) + rng.uniform(-0.05, 0.05, (3, 3))), scale_atoms=True)
    tri.rattle(0.02, seed=2)
    slab = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 2))
    slab.center(vacuum=5.0, axis=2)
    slab.pbc = (True, True, False)
    slab.rattle(0.03, seed=3)
    mol = molecule("C6H6")
    mol.pbc = False
    outside = cubic.copy()
    outside.positions += 7.3  # atoms outside the cell: shifts refer to the positions as given
    return {"cubic": cubic, "triclinic": tri, "slab": slab, "molecule": mol, "outside": outside}


def sorted_pairs(i, j, S, d):
    order = np.lexsort((S[:, 2], S[:, 1], S[:, 0], j, i))
    return i[order], j[order], S[order], d[order]


@pytest.mark.parametrize("name", list(structures()))
@pytest.mark.parametrize("cutoff", [2.6, 5.0, 7.5])
def test_full_list_equals_ase(name, cutoff):
    atoms = structures()[name]
    ours = ddmlip.neighbor_list(atoms, cutoff)
    ref = ase_neighbor_list("ijSd", atoms, cutoff)
    a, b = sorted_pairs(*ours), sorted_pairs(*[np.asarray(x) for x in ref])
    assert len(a[0]) == len(b[0]) > 0
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(a[3], b[3], rtol=0, atol=1e-12)
    # Already sorted by (i, j, S), int64 indices as ASE gives.
    np.testing.assert_array_equal(ours[0], a[0])
    assert ours[0].dtype == np.int64 and ours[2].shape == (len(ours[0]), 3)


def test_half_list_and_vectors():
    atoms = structures()["triclinic"]
    i, j, S, d, D = ddmlip.neighbor_list(atoms, 6.0, quantities="ijSdD")
    hi, hj, hS, hd = ddmlip.neighbor_list(atoms, 6.0, full=False)
    assert 2 * len(hi) == len(i)
    # Every full pair is a half pair or the mirror of one.
    half = {(a, b, *s) for a, b, s in zip(hi, hj, hS.tolist())}
    for a, b, s in zip(i, j, S.tolist()):
        assert (a, b, *s) in half or (b, a, *(-np.asarray(s))) in half
    expected = atoms.positions[j] + S @ atoms.cell.array - atoms.positions[i]
    np.testing.assert_allclose(D, expected, atol=1e-12)
    np.testing.assert_allclose(d, np.linalg.norm(D, axis=1), atol=1e-12)


def test_arrays_in():
    atoms = structures()["slab"]
    from_atoms = ddmlip.neighbor_list(atoms, 4.0)
    from_arrays = ddmlip.neighbor_list((atoms.positions, atoms.cell.array, atoms.pbc), 4.0)
    for x, y in zip(from_atoms, from_arrays):
        np.testing.assert_array_equal(x, y)
    mol = structures()["molecule"]
    i, j, S, d = ddmlip.neighbor_list(mol.positions, 3.0)
    ref = ase_neighbor_list("ij", mol, 3.0)
    assert len(i) == len(ref[0]) and not S.any()
    empty = ddmlip.neighbor_list(Atoms("H2", positions=[[0, 0, 0], [0, 0, 9]]), 1.0)
    assert all(len(x) == 0 for x in empty)
