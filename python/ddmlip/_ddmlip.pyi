"""Type stubs of the extension module ``ddmlip._ddmlip`` (the Rust half of
``ddmlip``; use the documented functions of ``ddmlip`` instead)."""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Pbc = Tuple[bool, bool, bool]
_SystemArrays = Tuple[
    npt.NDArray[np.float64], npt.NDArray[np.int64], Optional[npt.NDArray[np.float64]], _Pbc
]

class Engine:
    """Repeated evaluations of one model, keeping each rank's memory."""

    def __init__(
        self,
        model: str,
        ranks: int = 1,
        dtype: str = "float64",
        spec_json: Optional[str] = None,
        balance: str = "geometric",
        threads_per_rank: int = 0,
        work_sharing: bool = True,
        timeout: float = 120.0,
        device: str = "cpu",
    ) -> None: ...
    @property
    def model_name(self) -> str: ...
    @property
    def cutoff(self) -> float: ...
    @property
    def held_bytes(self) -> int: ...
    @property
    def last_seconds(self) -> float: ...
    def evaluate(
        self,
        positions: npt.NDArray[np.float64],
        numbers: npt.NDArray[np.int64],
        cell: Optional[npt.NDArray[np.float64]],
        pbc: _Pbc,
    ) -> Dict[str, Union[float, npt.NDArray[np.float64], None]]:
        """``energy`` (eV), ``forces`` (N×3, eV/Å), ``stress`` (6, eV/Å³, or
        None), ``energies`` (N, eV, or None)."""

def validate(
    model: str,
    systems: Sequence[_SystemArrays],
    ranks: int = 4,
    spec_json: Optional[str] = None,
    autofix: bool = True,
    atol: float = 1e-8,
    rtol: float = 1e-10,
    max_attempts: int = 8,
    dtype: str = "float64",
    timeout: float = 120.0,
) -> str:
    """The report of ``ddmlip validate --json`` as JSON text."""

def neighbor_list(
    positions: npt.NDArray[np.float64],
    cell: Optional[npt.NDArray[np.float64]],
    pbc: _Pbc,
    cutoff: float,
    full: bool = True,
) -> Tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
]:
    """``i, j, S, d, D``."""

def models() -> List[Tuple[str, str]]: ...

def md_run(
    model: str,
    positions: npt.NDArray[np.float64],
    numbers: npt.NDArray[np.int64],
    cell: Optional[npt.NDArray[np.float64]],
    pbc: _Pbc,
    masses: npt.NDArray[np.float64],
    has_masses: bool,
    momenta: Optional[npt.NDArray[np.float64]],
    ensemble: str,
    dt: float,
    steps: int,
    temperature: Optional[float] = None,
    friction: float = 1.0,
    tdamp: Optional[float] = None,
    chain: int = 3,
    init_temperature: Optional[float] = None,
    seed: int = 0,
    skin: float = 1.0,
    ranks: int = 1,
    dtype: str = "float64",
    balance: str = "geometric",
    modal: Optional[str] = None,
    traj: Optional[str] = None,
    traj_every: int = 10,
    log_every: int = 10,
) -> Tuple[str, npt.NDArray[np.float64], Dict[str, Union[float, npt.NDArray[np.float64], None]]]:
    """``(summary_json, thermo rows (R×12), final state)``."""

def relax_run(
    model: str,
    positions: npt.NDArray[np.float64],
    numbers: npt.NDArray[np.int64],
    cell: Optional[npt.NDArray[np.float64]],
    pbc: _Pbc,
    fmax: float = 0.05,
    max_steps: int = 1000,
    skin: float = 1.0,
    ranks: int = 1,
    dtype: str = "float64",
    balance: str = "geometric",
    modal: Optional[str] = None,
    relax_cell: bool = False,
    pressure: Optional[float] = None,
) -> Tuple[str, Dict[str, Union[float, npt.NDArray[np.float64], None]]]:
    """``(summary_json, final state)``."""
