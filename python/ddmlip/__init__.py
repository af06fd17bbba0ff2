"""ddmlip from Python: machine-learned interatomic potentials run by spatial
domain decomposition, with proof that the split run equals the
single-process one.

- :class:`Calculator`: an ASE calculator (energy, free_energy, forces,
  stress, energies) that keeps each rank's memory between calls.
- :func:`validate`: does a model give the single-process answer split over
  ranks? Returns the report of ``ddmlip validate --json``.
- :func:`neighbor_list`: ``i, j, S, d`` like ASE's / vesin's ``neighbor_list``.
- :func:`models`: the built-in models.
- :func:`md`, :func:`relax`: molecular dynamics and FIRE relaxation
  (``ddmlip md`` / ``ddmlip relax``) returning ASE ``Atoms``.

Units are ASE's: Å, eV, eV/Å; stress in eV/Å³ with ASE's sign, Voigt order
``xx yy zz yz xz xy``. Bad input raises :class:`ValueError` with the message
the ``ddmlip`` command prints; a run that fails raises :class:`RuntimeError`.
The GIL is released while Rust computes.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ddmlip
from ._ddmlip import __version__

__all__ = [
    "Calculator",
    "ValidationError",
    "ValidationReport",
    "MdResult",
    "RelaxResult",
    "md",
    "models",
    "neighbor_list",
    "relax",
    "validate",
    "__version__",
]

SpecLike = Union[None, str, "os.PathLike[str]", Dict[str, Any]]


def _spec_json(spec: SpecLike) -> Optional[str]:
    """A distribution spec as JSON text: ``None``, a dict (the spec's JSON
    object), a path to a spec file, or JSON text itself."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        return json.dumps(spec)
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if text.lstrip().startswith("{"):
            return text
        try:
            with open(text, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"spec file {text}: {e.strerror or e}") from None
    raise TypeError(f"spec must be a dict, a path or JSON text, not {type(spec).__name__}")


def _model_name(model: Union[str, "os.PathLike[str]"]) -> str:
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a path, not {type(model).__name__}")
    return os.fspath(model)


def _system_arrays(atoms: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Tuple[bool, bool, bool]]:
    """(positions, numbers, cell, pbc) of an ASE ``Atoms`` in the dtypes the
    extension reads; arrays already in those dtypes are passed as views."""
    positions = np.ascontiguousarray(atoms.positions, dtype=np.float64)
    numbers = np.ascontiguousarray(atoms.numbers, dtype=np.int64)
    cell = np.ascontiguousarray(np.asarray(atoms.cell), dtype=np.float64)
    pbc = tuple(bool(p) for p in atoms.pbc)
    return positions, numbers, cell, pbc  # type: ignore[return-value]


def models() -> List[Tuple[str, str]]:
    """The built-in models as ``(name, description)`` pairs, as ``ddmlip
    models`` lists them (``sevennet-0`` says whether its checkpoint is
    installed)."""
    return list(_ddmlip.models())


class ValidationReport(dict):
    """The report of a validation: a ``dict`` with the fields of ``ddmlip
    validate --json`` (``ok``, ``model``, ``ranks``, ``atol``, ``rtol``,
    ``prior_source``, ``spec``, ``attempts``, ``fix_applied``, ``inferred``,
    ``next_action``, ``diagnostics``, ``seconds``), each also readable as an
    attribute (``report.ok``, ``report.next_action``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_json(self) -> str:
        """The report as JSON text (what ``ddmlip validate --json`` prints)."""
        return json.dumps(self, indent=2)

    def save_spec(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the working (or best) spec as JSON, like ``--spec-out``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self["spec"], f, indent=2)
            f.write("\n")

    def summary(self) -> str:
        """One line: verdict, attempts and the next action."""
        verdict = "PASS" if self["ok"] else "FAIL"
        return (
            f"validate {self['model']} on {self['ranks']} rank(s): {verdict} "
            f"({len(self['attempts'])} attempt(s)); {self['next_action']}"
        )

    def __repr__(self) -> str:
        return f"<ValidationReport {self.summary()}>"


class ValidationError(RuntimeError):
    """A validation ran and failed: no spec made the split run match the
    single-process run. ``report`` holds the full :class:`ValidationReport`."""

    def __init__(self, report: ValidationReport):
        super().__init__(report.summary())
        self.report = report


def validate(
    model: Union[str, "os.PathLike[str]"],
    atoms: Any,
    ranks: int = 4,
    spec: SpecLike = None,
    autofix: bool = True,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    max_attempts: int = 8,
    dtype: str = "float64",
    timeout: float = 120.0,
    check: bool = False,
) -> ValidationReport:
    """Runs ``model`` once in one process (traced), infers a distribution
    spec (keeping ``spec`` verbatim when given), runs it on ``ranks`` ranks
    (threads), compares every output per atom, and tries known fixes when
    ``autofix``: ``ddmlip validate``.

    ``atoms`` is an ASE ``Atoms`` or a sequence of them (a batch). ``spec``
    is a prior spec: a dict, a path to a spec file, or JSON text.
    ``atol``/``rtol`` default to 1e-8/1e-10 in float64 and 1e-4/1e-5 in
    float32.

    Returns the report (``report.ok`` is the verdict). With ``check=True`` a
    failed validation raises :class:`ValidationError` (its ``report``
    attribute holds the report) instead. Bad input (unknown model, malformed
    spec, an element the model lacks, NaN positions) raises ``ValueError``.
    """
    batch = [atoms] if hasattr(atoms, "positions") else list(atoms)
    if dtype in ("float32", "f32", "float", "single"):
        default_atol, default_rtol = 1e-4, 1e-5
    else:
        default_atol, default_rtol = 1e-8, 1e-10
    text = _ddmlip.validate(
        _model_name(model),
        [_system_arrays(a) for a in batch],
        ranks=ranks,
        spec_json=_spec_json(spec),
        autofix=autofix,
        atol=default_atol if atol is None else atol,
        rtol=default_rtol if rtol is None else rtol,
        max_attempts=max_attempts,
        dtype=dtype,
        timeout=timeout,
    )
    report = ValidationReport(json.loads(text))
    if check and not report["ok"]:
        raise ValidationError(report)
    return report


def neighbor_list(
    atoms_or_arrays: Any,
    cutoff: float,
    full: bool = True,
    quantities: str = "ijSd",
) -> Tuple[np.ndarray, ...]:
    """All pairs within ``cutoff`` (Å), like ``ase.neighborlist.neighbor_list``
    and vesin: returns one array per letter of ``quantities`` (default
    ``"ijSd"``):

    - ``i``, ``j``: centre and neighbour indices (int64, P);
    - ``S``: integer cell shift of the neighbour image (int64, P×3);
    - ``d``: distance ``|r_j + S·cell − r_i|`` (float64, P);
    - ``D``: the vector ``r_j + S·cell − r_i`` (float64, P×3).

    ``atoms_or_arrays`` is an ASE ``Atoms``, a tuple ``(positions, cell,
    pbc)``, or a positions array alone (no periodicity). Triclinic cells,
    mixed periodicity and cells smaller than the cutoff (many images) are
    handled. ``full=False`` keeps each pair once (``i < j``, or ``i == j``
    with a lexicographically positive ``S``). Pairs come sorted by
    ``(i, j, S)``; the self pair is never included.
    """
    if hasattr(atoms_or_arrays, "get_positions"):
        positions = atoms_or_arrays.positions
        cell = np.asarray(atoms_or_arrays.cell)
        pbc = atoms_or_arrays.pbc
    elif isinstance(atoms_or_arrays, (tuple, list)) and len(atoms_or_arrays) == 3:
        positions, cell, pbc = atoms_or_arrays
    else:
        positions, cell, pbc = atoms_or_arrays, None, (False, False, False)
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {positions.shape}")
    if cell is not None:
        cell = np.ascontiguousarray(cell, dtype=np.float64)
        if cell.shape != (3, 3):
            raise ValueError(f"cell must have shape (3, 3), got {cell.shape}")
    pbc_arr = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    unknown = set(quantities) - set("ijSdD")
    if unknown:
        raise ValueError(
            f"unknown quantities {''.join(sorted(unknown))!r}: use letters of 'ijSdD'"
        )
    i, j, shifts, d, vectors = _ddmlip.neighbor_list(
        positions, cell, tuple(bool(p) for p in pbc_arr), float(cutoff), full=full
    )
    by_letter = {"i": i, "j": j, "S": shifts, "d": d, "D": vectors}
    return tuple(by_letter[q] for q in quantities)


# Last: the calculator module reads the helpers above.
from .calculator import Calculator  # noqa: E402
from .dynamics import MdResult, RelaxResult, md, relax  # noqa: E402
