"""Bad input raises `ValueError` with the message the `ddmlip` command
prints (after `error: `), and never takes the interpreter down."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.io import read, write

import ddmlip
from conftest import cli_error


def message_of(excinfo) -> str:
    return str(excinfo.value)


def test_unknown_model(tmp_path):
    path = tmp_path / "cu.xyz"
    write(path, bulk("Cu", "fcc", a=3.615), format="extxyz")
    expected = cli_error("eval", "--model", "no-such-model", "--structure", str(path))
    with pytest.raises(ValueError) as err:
        ddmlip.Calculator("no-such-model")
    assert message_of(err) == expected


def test_missing_model_file():
    with pytest.raises(ValueError, match="model"):
        ddmlip.Calculator("does/not/exist.toml")


def test_wrong_dtype_and_options():
    with pytest.raises(ValueError, match="unknown dtype `float16`"):
        ddmlip.Calculator("lj", dtype="float16")
    with pytest.raises(ValueError, match="backend"):
        ddmlip.Calculator("lj", backend="mpi")
    with pytest.raises(ValueError, match="ranks"):
        ddmlip.Calculator("lj", ranks=0)
    with pytest.raises(ValueError, match="balance"):
        ddmlip.Calculator("lj", balance="random")
    with pytest.raises(ValueError, match="timeout"):
        ddmlip.Calculator("lj", timeout=-1)
    with pytest.raises(TypeError):
        ddmlip.Calculator("lj", no_such_option=1)


def test_element_the_model_lacks(tmp_path):
    # The demo models have parameters up to Z = 94; americium is 95.
    atoms = Atoms("CuAm", positions=[[0, 0, 0], [2.5, 0, 0]])
    path = tmp_path / "am.xyz"
    write(path, atoms, format="extxyz")
    expected = cli_error("eval", "--model", "schnet-demo", "--structure", str(path))
    atoms.calc = ddmlip.Calculator("schnet-demo")
    with pytest.raises(ValueError) as err:
        atoms.get_potential_energy()
    # The command names the file it read; from Python there is no file, and
    # the rest of the message is the same.
    assert expected == f"{path}: {message_of(err)}"
    assert "Am (Z=95)" in expected


def test_nan_positions(tmp_path):
    atoms = bulk("Cu", "fcc", a=3.615, cubic=True)
    atoms.positions[2, 1] = np.nan
    path = tmp_path / "nan.xyz"
    write(path, atoms, format="extxyz")
    expected = cli_error("eval", "--model", "eam-demo", "--structure", str(path))
    atoms.calc = ddmlip.Calculator("eam-demo", ranks=2)
    with pytest.raises(ValueError) as err:
        atoms.get_forces()
    # The command's reader stops at the file's line; from Python there is no
    # file, so the message is the runtime's own check, naming the same atom.
    assert "atom index 2: position is not finite" in expected
    assert message_of(err) == "frame 0: atom 2 has a non-finite position [1.8075, NaN, 1.8075]"


def test_degenerate_cell_and_close_atoms(tmp_path):
    flat = bulk("Cu", "fcc", a=3.615, cubic=True)
    flat.cell[2] = flat.cell[0]
    flat.calc = ddmlip.Calculator("lj")
    with pytest.raises(ValueError):
        flat.get_potential_energy()
    pair = Atoms("Ar2", positions=[[0, 0, 0], [0, 0, 1e-9]])
    path = tmp_path / "close.xyz"
    write(path, pair, format="extxyz")
    expected = cli_error("eval", "--model", "lj", "--structure", str(path))
    pair = read(path)  # the same positions as the command reads
    pair.calc = ddmlip.Calculator("lj")
    with pytest.raises(ValueError) as err:
        pair.get_potential_energy()
    assert expected == f"{path}: {message_of(err)}"


def test_calculator_still_works_after_an_error():
    calc = ddmlip.Calculator("lj", ranks=2)
    bad = bulk("Ar", "fcc", a=5.26, cubic=True)
    bad.positions[0, 0] = np.inf
    bad.calc = calc
    with pytest.raises(ValueError):
        bad.get_potential_energy()
    good = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    good.calc = calc
    fresh = good.copy()
    fresh.calc = ddmlip.Calculator("lj", ranks=2)
    assert good.get_potential_energy() == pytest.approx(fresh.get_potential_energy(), rel=1e-13)


def test_bad_arrays():
    with pytest.raises(ValueError, match="cutoff"):
        ddmlip.neighbor_list(bulk("Cu"), -1.0)
    with pytest.raises(ValueError, match="shape"):
        ddmlip.neighbor_list(np.zeros((4, 2)), 3.0)
    with pytest.raises(ValueError, match="non-finite"):
        ddmlip.neighbor_list(np.array([[0.0, 0.0, np.nan]]), 3.0)
    with pytest.raises(ValueError, match="periodic"):
        ddmlip.neighbor_list((np.zeros((1, 3)), None, (True, False, False)), 3.0)
