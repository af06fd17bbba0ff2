use thiserror::Error;

/// Errors about a simulation cell.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum CellError {
    /// An entry is NaN or infinite (the entry).
    #[error("cell contains a non-finite entry ({0})")]
    NonFinite(f64),
    /// Periodic lattice vectors that are not independent.
    #[error("cell is singular or degenerate (volume {volume:.3e} Å³); periodic axes need three independent lattice vectors")]
    Singular {
        /// |det| of the cell (Å³), below the degeneracy threshold.
        volume: f64,
    },
    /// A periodic axis with a zero lattice vector.
    #[error("lattice vector {axis} is zero but axis {axis} is periodic")]
    ZeroPeriodicVector {
        /// The axis (0, 1, 2) whose lattice vector is zero.
        axis: usize,
    },
    /// A periodic lattice vector has an entry far outside any physical length.
    #[error(
        "cell entry [{row}][{col}] of periodic lattice vector {row} is {value:e} Å, \
         beyond the supported {limit:e} Å; lengths are probably in the wrong unit"
    )]
    OutOfRange {
        /// Lattice vector (0, 1, 2).
        row: usize,
        /// Cartesian component (0, 1, 2).
        col: usize,
        /// The entry (Å).
        value: f64,
        /// The largest supported magnitude (Å), `MAX_ABS_LENGTH`.
        limit: f64,
    },
}

/// Largest magnitude (Å) of a coordinate or of a periodic lattice-vector
/// entry that systems may have: 1e10 Å is one metre. Beyond it the work and
/// memory that a neighbour search or a partition derive from the geometry
/// (rounding margins, bin and image counts) stop being meaningful, and such
/// values are unit mistakes or corrupted files, so they are rejected.
pub const MAX_ABS_LENGTH: f64 = 1.0e10;

/// A 3×3 cell whose **rows** are the lattice vectors a, b, c (Å), as in ASE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    /// `matrix[k]` is lattice vector k.
    pub matrix: [[f64; 3]; 3],
}

impl Cell {
    /// A cell from its three lattice vectors (rows).
    pub fn new(matrix: [[f64; 3]; 3]) -> Self {
        Self { matrix }
    }

    /// An orthorhombic cell with edge lengths `a`, `b`, `c`.
    pub fn orthorhombic(a: f64, b: f64, c: f64) -> Self {
        Self::new([[a, 0.0, 0.0], [0.0, b, 0.0], [0.0, 0.0, c]])
    }

    /// The all-zero cell ASE uses for "no cell".
    pub fn zero() -> Self {
        Self::new([[0.0; 3]; 3])
    }

    /// Signed determinant of the matrix (Å³).
    pub fn determinant(&self) -> f64 {
        let m = &self.matrix;
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    }

    /// Volume |det| (Å³).
    pub fn volume(&self) -> f64 {
        self.determinant().abs()
    }

    /// True when every entry is zero.
    pub fn is_zero(&self) -> bool {
        self.matrix.iter().flatten().all(|&x| x == 0.0)
    }

    /// Length of lattice vector `axis` (Å).
    pub fn length(&self, axis: usize) -> f64 {
        norm(self.matrix[axis])
    }

    /// Perpendicular width of the cell along `axis`: the distance between the
    /// two faces spanned by the other two lattice vectors (Å). Zero for a
    /// degenerate cell.
    pub fn height(&self, axis: usize) -> f64 {
        let (j, k) = ((axis + 1) % 3, (axis + 2) % 3);
        let c = cross(self.matrix[j], self.matrix[k]);
        let area = norm(c);
        if area == 0.0 {
            0.0
        } else {
            self.volume() / area
        }
    }

    /// Inverse matrix, so that `frac = cart · inverse` (row vectors).
    pub fn inverse(&self) -> Result<[[f64; 3]; 3], CellError> {
        let det = self.determinant();
        let scale = self
            .matrix
            .iter()
            .flatten()
            .fold(0.0_f64, |a, &x| a.max(x.abs()));
        if !det.is_finite() || det.abs() <= 1e-12 * scale.powi(3).max(f64::MIN_POSITIVE) {
            return Err(CellError::Singular { volume: det.abs() });
        }
        let m = &self.matrix;
        let mut inv = [[0.0; 3]; 3];
        for (i, row) in inv.iter_mut().enumerate() {
            for (j, entry) in row.iter_mut().enumerate() {
                let (i1, i2) = ((j + 1) % 3, (j + 2) % 3);
                let (j1, j2) = ((i + 1) % 3, (i + 2) % 3);
                *entry = (m[i1][j1] * m[i2][j2] - m[i1][j2] * m[i2][j1]) / det;
            }
        }
        Ok(inv)
    }

    /// Checks the cell is finite and, when any axis is periodic, non-singular
    /// with periodic entries within [`MAX_ABS_LENGTH`].
    pub fn validate(&self, pbc: [bool; 3]) -> Result<(), CellError> {
        for &x in self.matrix.iter().flatten() {
            if !x.is_finite() {
                return Err(CellError::NonFinite(x));
            }
        }
        if pbc.iter().any(|&p| p) {
            for (row, values) in self.matrix.iter().enumerate() {
                for (col, &value) in values.iter().enumerate() {
                    if pbc[row] && value.abs() > MAX_ABS_LENGTH {
                        return Err(CellError::OutOfRange {
                            row,
                            col,
                            value,
                            limit: MAX_ABS_LENGTH,
                        });
                    }
                }
            }
            for (axis, &p) in pbc.iter().enumerate() {
                if p && self.length(axis) == 0.0 {
                    return Err(CellError::ZeroPeriodicVector { axis });
                }
            }
            self.inverse()?;
        }
        Ok(())
    }

    /// Cartesian position of fractional coordinates `frac` (row vector × matrix).
    pub fn to_cartesian(&self, frac: [f64; 3]) -> [f64; 3] {
        let m = &self.matrix;
        let mut out = [0.0; 3];
        for (k, out_k) in out.iter_mut().enumerate() {
            *out_k = frac[0] * m[0][k] + frac[1] * m[1][k] + frac[2] * m[2][k];
        }
        out
    }

    /// Cartesian displacement of an integer image shift `S·cell`.
    pub fn shift_vector(&self, shift: [i32; 3]) -> [f64; 3] {
        self.to_cartesian([shift[0] as f64, shift[1] as f64, shift[2] as f64])
    }
}

/// Fractional coordinates of `cart` given the inverse cell matrix.
pub fn to_fractional(inverse: &[[f64; 3]; 3], cart: [f64; 3]) -> [f64; 3] {
    let mut out = [0.0; 3];
    for (k, out_k) in out.iter_mut().enumerate() {
        *out_k = cart[0] * inverse[0][k] + cart[1] * inverse[1][k] + cart[2] * inverse[2][k];
    }
    out
}

pub(crate) fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

pub(crate) fn norm(a: [f64; 3]) -> f64 {
    (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_matrix_is_identity() {
        let c = Cell::new([[5.2, 0.0, 0.0], [0.9, 5.6, 0.0], [-0.6, 0.7, 6.1]]);
        let inv = c.inverse().unwrap();
        for (i, row) in c.matrix.iter().enumerate() {
            let product = (0..3).map(|j| (0..3).map(|k| row[k] * inv[k][j]).sum::<f64>());
            for (j, s) in product.enumerate() {
                assert!((s - if i == j { 1.0 } else { 0.0 }).abs() < 1e-14);
            }
        }
    }

    #[test]
    fn height_of_orthorhombic_is_edge() {
        let c = Cell::orthorhombic(3.0, 4.0, 5.0);
        assert!((c.height(0) - 3.0).abs() < 1e-14);
        assert!((c.height(2) - 5.0).abs() < 1e-14);
    }

    #[test]
    fn singular_cell_rejected_when_periodic() {
        let c = Cell::new([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]]);
        assert!(c.validate([true, true, true]).is_err());
        assert!(c.validate([false, false, false]).is_ok());
    }
}
