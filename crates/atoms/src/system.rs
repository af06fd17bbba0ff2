use crate::properties::{Column, InfoValue, Properties};
use crate::Cell;
use thiserror::Error;

/// Errors about the content of a system.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SystemError {
    /// Positions and atomic numbers of different lengths.
    #[error("positions ({positions}) and atomic numbers ({numbers}) differ in length")]
    LengthMismatch {
        /// Number of positions.
        positions: usize,
        /// Number of atomic numbers.
        numbers: usize,
    },
    /// A position component is NaN or infinite.
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition {
        /// 0-based atom index.
        atom: usize,
        /// The position (Å).
        position: [f64; 3],
    },
    /// A coordinate beyond [`crate::MAX_ABS_LENGTH`]: a unit mistake or a corrupted file.
    #[error(
        "atom {atom} has coordinate {axis} = {value:e} Å, beyond the supported {limit:e} Å; \
         positions are probably in the wrong unit"
    )]
    PositionOutOfRange {
        /// 0-based atom index.
        atom: usize,
        /// Cartesian axis (0, 1, 2).
        axis: usize,
        /// The coordinate (Å).
        value: f64,
        /// The largest supported magnitude (Å), `MAX_ABS_LENGTH`.
        limit: f64,
    },
    /// A periodic axis without a cell.
    #[error("axis {axis} is periodic but the system has no cell")]
    PeriodicWithoutCell {
        /// The periodic axis (0, 1, 2).
        axis: usize,
    },
    /// An invalid cell.
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

    /// Checks lengths, finiteness, that every coordinate is within
    /// [`crate::MAX_ABS_LENGTH`], and that periodic axes have a valid cell.
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
            if let Some(axis) = p.iter().position(|x| x.abs() > crate::MAX_ABS_LENGTH) {
                return Err(SystemError::PositionOutOfRange {
                    atom,
                    axis,
                    value: p[axis],
                    limit: crate::MAX_ABS_LENGTH,
                });
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

/// Accessors for the results ASE stores with a structure (`energy`,
/// `stress` in `info`; `forces` in `arrays`), under ASE's key names.
impl System {
    /// Total energy (eV) from `info["energy"]`, if present and numeric.
    pub fn energy(&self) -> Option<f64> {
        match self.properties.info.get("energy")? {
            InfoValue::Float(x) => Some(*x),
            InfoValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// Stores the total energy (eV) as `info["energy"]`.
    pub fn set_energy(&mut self, energy: f64) {
        self.properties
            .info
            .insert("energy".to_string(), InfoValue::Float(energy));
    }

    /// Forces (eV/Å), one row per atom, from the `forces` column; `None`
    /// unless it is a real column of width 3 with one row per atom.
    pub fn forces(&self) -> Option<Vec<[f64; 3]>> {
        match self.properties.arrays.get("forces")? {
            Column::Float(values, 3) if values.len() == 3 * self.len() => {
                Some(values.chunks_exact(3).map(|f| [f[0], f[1], f[2]]).collect())
            }
            _ => None,
        }
    }

    /// Stores forces (eV/Å, one row per atom) as the `forces` column.
    pub fn set_forces(&mut self, forces: &[[f64; 3]]) {
        let values = forces.iter().flatten().copied().collect();
        self.properties
            .arrays
            .insert("forces".to_string(), Column::Float(values, 3));
    }

    /// Stress (eV/Å³) in Voigt order xx yy zz yz xz xy from `info["stress"]`:
    /// 6 numbers are taken as Voigt already; 9 numbers are a 3×3 matrix in
    /// the Fortran (column-major) order of extended XYZ, converted exactly as
    /// ASE does (`[0,0] [1,1] [2,2] [1,2] [0,2] [0,1]`). `None` otherwise.
    pub fn stress_voigt(&self) -> Option<[f64; 6]> {
        let values: Vec<f64> = match self.properties.info.get("stress")? {
            InfoValue::FloatArray(v) => v.clone(),
            InfoValue::IntArray(v) => v.iter().map(|&i| i as f64).collect(),
            _ => return None,
        };
        match values.len() {
            6 => Some([
                values[0], values[1], values[2], values[3], values[4], values[5],
            ]),
            // Column-major: element [i][j] is values[i + 3 j].
            9 => Some([
                values[0], values[4], values[8], values[7], values[6], values[3],
            ]),
            _ => None,
        }
    }

    /// Stores a Voigt stress (eV/Å³, xx yy zz yz xz xy) as the 9 numbers of
    /// the symmetric 3×3 matrix, the form ASE writes.
    pub fn set_stress_voigt(&mut self, s: [f64; 6]) {
        let [xx, yy, zz, yz, xz, xy] = s;
        let full = vec![xx, xy, xz, xy, yy, yz, xz, yz, zz];
        self.properties
            .info
            .insert("stress".to_string(), InfoValue::FloatArray(full));
    }
}

/// Several systems evaluated together; per-system outputs have one row per system.
pub type Batch = Vec<System>;
