"""``ddmlip.Calculator``: the ASE calculator."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

import numpy as np
from ase.calculators.calculator import Calculator as _AseCalculator
from ase.calculators.calculator import all_changes

from . import SpecLike, _ddmlip, _model_name, _spec_json, _system_arrays


class Calculator(_AseCalculator):
    """An ASE calculator running a ddmlip model, in one process or split
    over ``ranks`` ranks (threads) by spatial domain decomposition.

    ``model``: a built-in name (``ddmlip.models()``: ``lj``, ``eam-demo``,
    ``schnet-demo``, …, ``sevennet-0``), a TOML model file, or a SevenNet
    ``.pth`` checkpoint. ``dtype``: ``"float64"`` or ``"float32"``.
    ``backend``: ``"threads"`` (MPI runs go through the ``ddmlip`` command).

    Options: ``spec`` (a distribution spec for ``ranks > 1``: dict, path or
    JSON text; default the model's own), ``balance`` (``"geometric"`` or
    ``"atoms"``), ``threads_per_rank`` (0: cores / ranks), ``work_sharing``
    (idle ranks run pieces of busy ones; same bits), ``timeout`` (s, of
    every blocking communication call), ``device`` (``"cpu"``, or
    ``"cuda"`` / ``"cuda:N"`` for an NVIDIA GPU: ``lj``, ``schnet-demo``
    and the SevenNet checkpoints with their own kernels, every other model
    through the op engine with its generic ops on the GPU; ``ranks`` ranks
    sharing it; without a GPU or driver it raises ``ValueError`` saying
    which).

    Properties (ASE units): ``energy`` and ``free_energy`` (eV), ``forces``
    (eV/Å), ``stress`` (eV/Å³, ASE's sign, Voigt ``xx yy zz yz xz xy``;
    periodic systems only), ``energies`` (per atom, eV; models that have
    them). Every call computes all of them at once.

    The calculator keeps the model and each rank's memory and thread pool
    between calls, so ASE's dynamics and optimisers run at the engine's
    speed; a call with a different number of atoms starts with fresh
    memory. Bad input raises ``ValueError`` with the ``ddmlip`` command's
    message (unknown model or dtype, an element the model lacks, NaN
    positions); a failed run raises ``RuntimeError``.
    """

    implemented_properties: List[str] = ["energy", "free_energy", "forces", "stress", "energies"]

    def __init__(
        self,
        model: Union[str, "os.PathLike[str]"] = "sevennet-0",
        ranks: int = 1,
        dtype: str = "float64",
        backend: str = "threads",
        *,
        spec: SpecLike = None,
        balance: str = "geometric",
        threads_per_rank: int = 0,
        work_sharing: bool = True,
        timeout: float = 120.0,
        device: str = "cpu",
        atoms: Any = None,
        label: Optional[str] = None,
        directory: str = ".",
    ) -> None:
        if backend != "threads":
            raise ValueError(
                f"unknown backend `{backend}`: the Python calculator runs ranks as threads "
                '(backend="threads"); MPI runs go through `mpirun -n N ddmlip eval --backend mpi`'
            )
        if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
            raise ValueError(f"ranks must be an integer of at least 1, got {ranks!r}")
        name = _model_name(model)
        self._engine = _ddmlip.Engine(
            name,
            ranks=int(ranks),
            dtype=dtype,
            spec_json=_spec_json(spec),
            balance=balance,
            threads_per_rank=int(threads_per_rank),
            work_sharing=bool(work_sharing),
            timeout=float(timeout),
            device=device,
        )
        super().__init__(atoms=atoms, label=label, directory=directory)
        self.parameters.update(
            model=name,
            ranks=int(ranks),
            dtype=dtype,
            backend=backend,
            balance=balance,
            threads_per_rank=int(threads_per_rank),
            work_sharing=bool(work_sharing),
            timeout=float(timeout),
            device=device,
        )

    @property
    def model_name(self) -> str:
        """Registry name of the loaded model."""
        return self._engine.model_name

    @property
    def cutoff(self) -> float:
        """Interaction cutoff of the model (Å)."""
        return self._engine.cutoff

    @property
    def held_bytes(self) -> int:
        """Bytes of tensor memory kept for the next call, over all ranks."""
        return self._engine.held_bytes

    @property
    def last_seconds(self) -> float:
        """Seconds the last calculation spent evaluating in Rust (array
        conversions and ASE's bookkeeping excluded)."""
        return self._engine.last_seconds

    def calculate(
        self,
        atoms: Any = None,
        properties: Sequence[str] = ("energy",),
        system_changes: Sequence[str] = all_changes,
    ) -> None:
        super().calculate(atoms, properties, system_changes)
        positions, numbers, cell, pbc = _system_arrays(self.atoms)
        out = self._engine.evaluate(positions, numbers, cell, pbc)
        results = {
            "energy": out["energy"],
            "free_energy": out["energy"],
            "forces": out["forces"],
        }
        if out["stress"] is not None:
            results["stress"] = out["stress"]
        if out["energies"] is not None:
            results["energies"] = out["energies"]
        self.results = results
