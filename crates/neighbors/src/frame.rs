//! The periodic frame: a full-rank basis whose periodic rows are the user's
//! lattice vectors, plus its inverse and per-axis heights.
//!
//! Non-periodic axes never produce images, so their lattice vectors only
//! matter for binning. Replacing them by unit vectors orthogonal to the
//! periodic ones makes the frame well defined even when the user's cell is
//! `None`, has a zero vector on an open axis (ASE slabs), or is singular only
//! along open axes. Fractional coordinates along an open axis are then plain
//! Cartesian distances along that direction.

use crate::NeighborError;
use ddmlip_atoms::{Cell, MAX_ABS_LENGTH};

/// Below this normalised volume `|det| / (|a||b||c|)` the periodic lattice
/// vectors are treated as linearly dependent.
const MIN_NORMALISED_VOLUME: f64 = 1e-10;

/// A full-rank basis for fractional coordinates.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    /// Rows: the user's lattice vector on periodic axes, a unit vector
    /// orthogonal to the periodic vectors on open axes (Å).
    pub basis: [[f64; 3]; 3],
    /// `frac = cart · inverse` (row vectors).
    pub inverse: [[f64; 3]; 3],
    /// Distance between the two faces spanned by the other two basis rows
    /// (Å); `|Δfrac_k| ≤ |Δr| / heights[k]` for any displacement `Δr`.
    pub heights: [f64; 3],
    /// Periodicity per axis.
    pub pbc: [bool; 3],
    /// `|det(basis)|`: the volume (3 periodic axes), area (2) or length (1)
    /// of the periodic lattice, since open rows are orthonormal to it; 1
    /// without periodic axes.
    pub measure: f64,
}

impl Frame {
    /// Builds and validates the frame for `cell` and `pbc`.
    pub fn new(cell: Option<&Cell>, pbc: [bool; 3]) -> Result<Self, NeighborError> {
        let n_periodic = pbc.iter().filter(|&&p| p).count();
        let matrix = match cell {
            Some(c) => c.matrix,
            None if n_periodic == 0 => [[0.0; 3]; 3],
            None => {
                let axis = pbc.iter().position(|&p| p).unwrap_or(0);
                return Err(NeighborError::MissingCell { axis });
            }
        };
        // Only the periodic rows are used; open rows may hold anything finite.
        for (row, values) in matrix.iter().enumerate() {
            for (col, &value) in values.iter().enumerate() {
                if pbc[row] && !value.is_finite() {
                    return Err(NeighborError::NonFiniteCell { row, col, value });
                }
                if pbc[row] && value.abs() > MAX_ABS_LENGTH {
                    return Err(NeighborError::CellOutOfRange {
                        row,
                        col,
                        value,
                        limit: MAX_ABS_LENGTH,
                    });
                }
            }
        }
        for axis in 0..3 {
            if pbc[axis] && norm(matrix[axis]) == 0.0 {
                return Err(NeighborError::ZeroLatticeVector { axis });
            }
        }

        let mut basis = [[0.0; 3]; 3];
        match n_periodic {
            3 => basis = matrix,
            2 => {
                let open = pbc.iter().position(|&p| !p).unwrap_or(2);
                let (k1, k2) = ((open + 1) % 3, (open + 2) % 3);
                let normal = cross(matrix[k1], matrix[k2]);
                let measure = norm(normal) / (norm(matrix[k1]) * norm(matrix[k2]));
                if measure.is_nan() || measure < MIN_NORMALISED_VOLUME {
                    return Err(NeighborError::DegenerateCell { measure });
                }
                basis[k1] = matrix[k1];
                basis[k2] = matrix[k2];
                basis[open] = scale(normal, 1.0 / norm(normal));
            }
            1 => {
                let k = pbc.iter().position(|&p| p).unwrap_or(0);
                let u = scale(matrix[k], 1.0 / norm(matrix[k]));
                // The Cartesian axis least aligned with u gives a well-conditioned cross product.
                let mut e = [0.0; 3];
                let least = (0..3)
                    .min_by(|&a, &b| u[a].abs().total_cmp(&u[b].abs()))
                    .unwrap_or(0);
                e[least] = 1.0;
                let v1 = cross(u, e);
                let v1 = scale(v1, 1.0 / norm(v1));
                let v2 = cross(u, v1);
                basis[k] = matrix[k];
                basis[(k + 1) % 3] = v1;
                basis[(k + 2) % 3] = v2;
            }
            _ => basis = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
        }

        let det = determinant(&basis);
        let measure = det.abs() / (norm(basis[0]) * norm(basis[1]) * norm(basis[2]));
        if measure.is_nan() || measure < MIN_NORMALISED_VOLUME || !det.is_finite() {
            return Err(NeighborError::DegenerateCell { measure });
        }
        let inverse = invert(&basis, det);
        let mut heights = [0.0; 3];
        for (k, h) in heights.iter_mut().enumerate() {
            let column = [inverse[0][k], inverse[1][k], inverse[2][k]];
            *h = 1.0 / norm(column);
        }
        Ok(Self {
            basis,
            inverse,
            heights,
            pbc,
            measure: det.abs(),
        })
    }

    /// Fractional coordinates of `cart` in this frame.
    #[inline]
    pub fn fractional(&self, cart: [f64; 3]) -> [f64; 3] {
        let m = &self.inverse;
        let mut out = [0.0; 3];
        for (k, out_k) in out.iter_mut().enumerate() {
            *out_k = cart[0] * m[0][k] + cart[1] * m[1][k] + cart[2] * m[2][k];
        }
        out
    }

    /// Cartesian image displacement `S·cell` (Å). Open axes always carry a
    /// zero shift, so only the user's periodic lattice vectors contribute.
    ///
    /// Both the cell-list search and the brute-force reference compute pair
    /// vectors through this one function so that their cutoff decisions are
    /// bit-for-bit identical.
    #[inline]
    pub fn shift_cartesian(&self, shift: [i32; 3]) -> [f64; 3] {
        let m = &self.basis;
        let s = [shift[0] as f64, shift[1] as f64, shift[2] as f64];
        let mut out = [0.0; 3];
        for (k, out_k) in out.iter_mut().enumerate() {
            *out_k = s[0] * m[0][k] + s[1] * m[1][k] + s[2] * m[2][k];
        }
        out
    }
}

/// The pair vector `r_j + S·cell − r_i` and its squared length, computed in
/// one fixed order shared by every code path.
#[inline]
pub(crate) fn pair_vector(r_i: [f64; 3], r_j: [f64; 3], shift_cart: [f64; 3]) -> ([f64; 3], f64) {
    let v = [
        r_j[0] + shift_cart[0] - r_i[0],
        r_j[1] + shift_cart[1] - r_i[1],
        r_j[2] + shift_cart[2] - r_i[2],
    ];
    (v, v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
}

fn determinant(m: &[[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

fn invert(m: &[[f64; 3]; 3], det: f64) -> [[f64; 3]; 3] {
    let mut inv = [[0.0; 3]; 3];
    for (i, row) in inv.iter_mut().enumerate() {
        for (j, value) in row.iter_mut().enumerate() {
            let (i1, i2) = ((j + 1) % 3, (j + 2) % 3);
            let (j1, j2) = ((i + 1) % 3, (i + 2) % 3);
            *value = (m[i1][j1] * m[i2][j2] - m[i1][j2] * m[i2][j1]) / det;
        }
    }
    inv
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn norm(a: [f64; 3]) -> f64 {
    (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt()
}

fn scale(a: [f64; 3], s: f64) -> [f64; 3] {
    [a[0] * s, a[1] * s, a[2] * s]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_inverse(frame: &Frame) {
        for i in 0..3 {
            for j in 0..3 {
                let s: f64 = (0..3)
                    .map(|k| frame.basis[i][k] * frame.inverse[k][j])
                    .sum();
                assert!(
                    (s - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12,
                    "{frame:?}"
                );
            }
        }
    }

    #[test]
    fn full_pbc_heights_match_cell_heights() {
        let cell = Cell::new([[5.2, 0.0, 0.0], [3.9, 5.6, 0.0], [-2.6, 1.7, 6.1]]);
        let frame = Frame::new(Some(&cell), [true; 3]).unwrap();
        assert_inverse(&frame);
        for k in 0..3 {
            assert!((frame.heights[k] - cell.height(k)).abs() < 1e-12);
        }
    }

    #[test]
    fn slab_completion_is_orthogonal_unit_normal() {
        // A zero third vector is legal for a slab (ASE writes it that way).
        let cell = Cell::new([[4.0, 0.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.0, 0.0]]);
        let frame = Frame::new(Some(&cell), [true, true, false]).unwrap();
        assert_inverse(&frame);
        let n = frame.basis[2];
        assert!((norm(n) - 1.0).abs() < 1e-14);
        for k in 0..2 {
            let dot: f64 = (0..3).map(|m| n[m] * cell.matrix[k][m]).sum();
            assert!(dot.abs() < 1e-12);
        }
        // In-plane width of a: distance from a to the line along b.
        let b = cell.matrix[1];
        let a = cell.matrix[0];
        let width = norm(cross(a, b)) / norm(b);
        assert!((frame.heights[0] - width).abs() < 1e-12);
    }

    #[test]
    fn wire_height_is_vector_length() {
        let cell = Cell::new([[0.0, 3.0, 4.0], [0.0; 3], [0.0; 3]]);
        let frame = Frame::new(Some(&cell), [true, false, false]).unwrap();
        assert_inverse(&frame);
        assert!((frame.heights[0] - 5.0).abs() < 1e-12);
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            Frame::new(None, [false, true, false]).unwrap_err(),
            NeighborError::MissingCell { axis: 1 }
        );
        let zero_b = Cell::new([[1.0, 0.0, 0.0], [0.0; 3], [0.0, 0.0, 1.0]]);
        assert_eq!(
            Frame::new(Some(&zero_b), [true; 3]).unwrap_err(),
            NeighborError::ZeroLatticeVector { axis: 1 }
        );
        let flat = Cell::new([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]]);
        assert!(matches!(
            Frame::new(Some(&flat), [true; 3]),
            Err(NeighborError::DegenerateCell { .. })
        ));
        assert!(matches!(
            Frame::new(Some(&flat), [true, true, false]),
            Err(NeighborError::DegenerateCell { .. })
        ));
        // The same flat cell is fine when the dependent vector is on an open axis.
        assert!(Frame::new(Some(&flat), [true, false, true]).is_ok());
        let nan = Cell::new([[f64::NAN, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]);
        assert!(matches!(
            Frame::new(Some(&nan), [true; 3]),
            Err(NeighborError::NonFiniteCell { row: 0, .. })
        ));
    }
}
