use crate::properties::Properties;
use crate::Cell;
use thiserror::Error;

/// Errors about the content of a system.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SystemError {
    #[error("positions ({positions}) and atomic numbers ({numbers}) differ in length")]
    LengthMismatch { positions: usize, numbers: usize },
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition { atom: usize, position: [f64; 3] },
    #[error("axis {axis} is periodic but the system has no cell")]
    PeriodicWithoutCell { axis: usize },
    #[error(transparent)]
    Cell(#[from] crate::CellError),
}

/// One atomic system: positions (Å), atomic numbers, optional cell (rows are
/// lattice vectors), per-axis periodicity, and extra per-atom / per-system
/// properties carried through IO.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct System {
    /// Cartesian positions in Å, one row per atom.
    pub positions: Vec<[f64; 3]>,
    /// Atomic numbers Z, one per atom.
    pub numbers: Vec<u32>,
    /// The cell; `None` for a structure written without `Lattice`.
    pub cell: Option<Cell>,
    /// Periodicity per axis.
    pub pbc: [bool; 3],
    /// Everything else read from or written to a file (`info` / `arrays`).
    pub properties: Properties,
}

impl System {
    /// A system without extra properties.
    pub fn new(
        positions: Vec<[f64; 3]>,
        numbers: Vec<u32>,
        cell: Option<Cell>,
        pbc: [bool; 3],
    ) -> Self {
        Self {
            positions,
            numbers,
            cell,
            pbc,
            properties: Properties::default(),
        }
    }

    /// Number of atoms.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// True for a system without atoms.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// True when any axis is periodic.
    pub fn is_periodic(&self) -> bool {
        self.pbc.iter().any(|&p| p)
    }

    /// The cell, or the zero cell when there is none.
    pub fn cell_or_zero(&self) -> Cell {
        self.cell.unwrap_or_else(Cell::zero)
    }

    /// Checks lengths, finiteness and that periodic axes have a valid cell.
    pub fn validate(&self) -> Result<(), SystemError> {
        if self.positions.len() != self.numbers.len() {
            return Err(SystemError::LengthMismatch {
                positions: self.positions.len(),
                numbers: self.numbers.len(),
            });
        }
        for (atom, p) in self.positions.iter().enumerate() {
            if p.iter().any(|x| !x.is_finite()) {
                return Err(SystemError::NonFinitePosition { atom, position: *p });
            }
        }
        match &self.cell {
            Some(cell) => cell.validate(self.pbc)?,
            None => {
                if let Some(axis) = self.pbc.iter().position(|&p| p) {
                    return Err(SystemError::PeriodicWithoutCell { axis });
                }
            }
        }
        Ok(())
    }
}

/// Several systems evaluated together; per-system outputs have one row per system.
pub type Batch = Vec<System>;
