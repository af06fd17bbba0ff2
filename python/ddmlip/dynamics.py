"""``ddmlip.md`` and ``ddmlip.relax``: the ``ddmlip md`` and ``ddmlip
relax`` commands as functions on ASE ``Atoms`` (thread ranks; the GIL is
released while Rust runs)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, NamedTuple, Optional, Union

import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator

from . import _ddmlip, _model_name, _system_arrays

#: Columns of the thermo table, as in the header of ``ddmlip md --log``.
THERMO_COLUMNS = (
    "step",
    "time_ps",
    "temperature_K",
    "potential_eV",
    "kinetic_eV",
    "total_eV",
    "conserved_eV",
    "pressure_GPa",
    "volume_A3",
    "rebuilds",
    "migrated",
    "ns_per_day",
)
_INT_COLUMNS = ("step", "rebuilds", "migrated")

PathLike = Union[str, "os.PathLike[str]"]


class MdResult(NamedTuple):
    """What :func:`md` returns."""

    #: The final state: positions, momenta (ASE units), cell, and a
    #: ``SinglePointCalculator`` with energy, free_energy, forces and stress.
    atoms: Any
    #: The thermo log as numpy arrays by column (:data:`THERMO_COLUMNS`),
    #: one entry per logged step (every ``log_every`` steps, step 0 and the
    #: last step). ``pressure_GPa``/``volume_A3`` are NaN without a 3-D
    #: periodic cell.
    thermo: Dict[str, np.ndarray]
    #: The fields of ``ddmlip md --json`` (energies, mean temperature,
    #: rebuilds, timings, ...).
    summary: Dict[str, Any]


class RelaxResult(NamedTuple):
    """What :func:`relax` returns."""

    #: The relaxed structure with a ``SinglePointCalculator`` (energy,
    #: free_energy, forces, stress).
    atoms: Any
    #: The fields of ``ddmlip relax --json``: ``converged``, ``steps``,
    #: ``initial_energy``, ``energy``, ``fmax``, ``n_atoms``, ``ranks``,
    #: ``rebuilds``, ``migrated``, ``wall_s``.
    summary: Dict[str, Any]


def _ranks(ranks: Any) -> int:
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ValueError(f"ranks must be an integer of at least 1, got {ranks!r}")
    return int(ranks)


def _backend(backend: str, command: str) -> None:
    if backend != "threads":
        raise ValueError(
            f"unknown backend `{backend}`: ddmlip.{command} runs ranks as threads "
            f'(backend="threads"); MPI runs go through `mpirun -n N ddmlip {command} --backend mpi`'
        )


def _final_atoms(atoms: Any, final: Dict[str, Any], momenta: bool) -> Any:
    out = atoms.copy()
    out.calc = None
    out.positions = final["positions"]
    if atoms.cell.rank > 0:
        out.cell = final["cell"]
    if momenta:
        out.set_momenta(final["momenta"], apply_constraint=False)
    else:
        # As `ddmlip relax --output`: a relaxed structure has no momenta.
        out.arrays.pop("momenta", None)
    results: Dict[str, Any] = {
        "energy": final["energy"],
        "free_energy": final["energy"],
        "forces": final["forces"],
    }
    if final["stress"] is not None:
        results["stress"] = final["stress"]
    out.calc = SinglePointCalculator(out, **results)
    return out


def md(
    model: PathLike,
    atoms: Any,
    ensemble: str = "nve",
    dt: float = 1.0,
    steps: int = 100,
    temperature: Optional[float] = None,
    friction: float = 1.0,
    tdamp: Optional[float] = None,
    chain: int = 3,
    init_temperature: Optional[float] = None,
    seed: int = 0,
    skin: float = 1.0,
    ranks: int = 1,
    backend: str = "threads",
    dtype: str = "float64",
    balance: str = "geometric",
    traj: Optional[PathLike] = None,
    traj_every: int = 10,
    log_every: int = 10,
    modal: Optional[str] = None,
) -> MdResult:
    """Molecular dynamics of ``atoms`` with ``model``, split over ``ranks``
    ranks (threads): ``ddmlip md``. ``atoms`` is not modified.

    ``ensemble``: ``"nve"`` (velocity Verlet), ``"langevin"`` (BAOAB;
    needs ``temperature`` in K, ``friction`` in 1/ps) or ``"nose-hoover"``
    (a chain of ``chain`` thermostats; needs ``temperature``, ``tdamp`` in
    fs defaults to 100 × ``dt``). ``dt`` in fs; ``steps`` to run.

    Start state: momenta from ``atoms`` when it has them (ASE units), else
    Maxwell–Boltzmann at ``init_temperature`` (K, zero total momentum,
    drawn from ``seed``), else zero; masses from ``atoms.get_masses()``.
    ``seed`` also keys the Langevin random forces, so a trajectory does not
    depend on ``ranks``. ``skin`` (Å): the pair list reaches cutoff + skin
    and is rebuilt once an atom moved more than skin/2.

    ``traj``: an extended XYZ trajectory written every ``traj_every`` steps
    (positions, momenta, energy, forces, stress), as ``ddmlip md --traj``.
    ``log_every``: steps between rows of the returned thermo table.
    ``modal``: the fidelity of a multi-fidelity SevenNet checkpoint.

    Returns :class:`MdResult` ``(atoms, thermo, summary)``. Bad input (a
    non-positive ``dt``, an unknown ensemble, NaN positions, an element the
    model lacks) raises ``ValueError`` with the message of ``ddmlip md``; a
    failed run (forces turning NaN) raises ``RuntimeError``.
    """
    _backend(backend, "md")
    positions, numbers, cell, pbc = _system_arrays(atoms)
    has_momenta = "momenta" in atoms.arrays
    summary_json, rows, final = _ddmlip.md_run(
        _model_name(model),
        positions,
        numbers,
        cell,
        pbc,
        np.ascontiguousarray(atoms.get_masses(), dtype=np.float64),
        "masses" in atoms.arrays,
        np.ascontiguousarray(atoms.get_momenta(), dtype=np.float64) if has_momenta else None,
        str(ensemble),
        float(dt),
        int(steps),
        temperature=None if temperature is None else float(temperature),
        friction=float(friction),
        tdamp=None if tdamp is None else float(tdamp),
        chain=int(chain),
        init_temperature=None if init_temperature is None else float(init_temperature),
        seed=int(seed),
        skin=float(skin),
        ranks=_ranks(ranks),
        dtype=dtype,
        balance=balance,
        modal=modal,
        traj=None if traj is None else os.fspath(traj),
        traj_every=int(traj_every),
        log_every=int(log_every),
    )
    thermo = {
        name: rows[:, k].astype(np.int64) if name in _INT_COLUMNS else rows[:, k].copy()
        for k, name in enumerate(THERMO_COLUMNS)
    }
    return MdResult(_final_atoms(atoms, final, momenta=True), thermo, json.loads(summary_json))


def relax(
    model: PathLike,
    atoms: Any,
    fmax: float = 0.05,
    max_steps: int = 1000,
    skin: float = 1.0,
    ranks: int = 1,
    backend: str = "threads",
    dtype: str = "float64",
    balance: str = "geometric",
    modal: Optional[str] = None,
    cell: bool = False,
    pressure: Optional[float] = None,
) -> RelaxResult:
    """Relaxes the positions of ``atoms`` with FIRE (ASE's algorithm and
    defaults) until the largest force is below ``fmax`` (eV/Å) or after
    ``max_steps`` steps, split over ``ranks`` ranks (threads): ``ddmlip
    relax``. ``atoms`` is not modified. The cell is kept, unless ``cell``
    is true: then it relaxes too, as with ASE's ``UnitCellFilter``, towards
    the hydrostatic ``pressure`` (GPa, default 0): ``ddmlip relax --cell
    --pressure P``.

    Returns :class:`RelaxResult` ``(atoms, summary)``; a relaxation that did
    not converge is reported by ``summary["converged"]`` (the command exits
    1 then), not raised. Bad input raises ``ValueError`` with the message of
    ``ddmlip relax``.
    """
    _backend(backend, "relax")
    # `cell` is the flag here; the structure's cell comes with the arrays.
    relax_cell = bool(cell)
    positions, numbers, cell, pbc = _system_arrays(atoms)
    summary_json, final = _ddmlip.relax_run(
        _model_name(model),
        positions,
        numbers,
        cell,
        pbc,
        fmax=float(fmax),
        max_steps=int(max_steps),
        skin=float(skin),
        ranks=_ranks(ranks),
        dtype=dtype,
        balance=balance,
        modal=modal,
        relax_cell=relax_cell,
        pressure=None if pressure is None else float(pressure),
    )
    return RelaxResult(_final_atoms(atoms, final, momenta=False), json.loads(summary_json))
