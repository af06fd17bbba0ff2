//! 3×3 matrix helpers (row-major, row vectors: `v' = v·M`).

/// A 3×3 matrix, row-major.
pub(crate) type Mat3 = [[f64; 3]; 3];

/// The identity.
pub(crate) const IDENTITY: Mat3 = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

/// The inverse of a 3×3 matrix, `None` when it is singular or not finite.
pub(crate) fn invert3(m: &Mat3) -> Option<Mat3> {
    let c = |r: usize, k: usize| {
        let (r1, r2) = ((r + 1) % 3, (r + 2) % 3);
        let (k1, k2) = ((k + 1) % 3, (k + 2) % 3);
        m[r1][k1] * m[r2][k2] - m[r1][k2] * m[r2][k1]
    };
    let det = m[0][0] * c(0, 0) + m[0][1] * c(0, 1) + m[0][2] * c(0, 2);
    if !(det.is_finite() && det.abs() > 0.0) {
        return None;
    }
    // inverse[i][j] = cofactor(j, i) / det.
    Some([0, 1, 2].map(|i| [0, 1, 2].map(|j| c(j, i) / det)))
}

/// The product `a·b`.
pub(crate) fn mul3(a: &Mat3, b: &Mat3) -> Mat3 {
    [0, 1, 2].map(|i| [0, 1, 2].map(|j| a[i][0] * b[0][j] + a[i][1] * b[1][j] + a[i][2] * b[2][j]))
}

/// The transpose.
pub(crate) fn transpose3(m: &Mat3) -> Mat3 {
    [0, 1, 2].map(|i| [0, 1, 2].map(|j| m[j][i]))
}

/// The row vector `v·m`.
pub(crate) fn row_times(v: &[f64; 3], m: &Mat3) -> [f64; 3] {
    [0, 1, 2].map(|b| v[0] * m[0][b] + v[1] * m[1][b] + v[2] * m[2][b])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_matrix_is_the_identity() {
        let m = [[2.0, 0.3, -0.1], [0.2, 1.5, 0.4], [-0.3, 0.1, 3.0]];
        let inv = invert3(&m).unwrap();
        let p = mul3(&m, &inv);
        for (i, row) in p.iter().enumerate() {
            for (j, x) in row.iter().enumerate() {
                assert!((x - IDENTITY[i][j]).abs() < 1e-14, "{p:?}");
            }
        }
        assert_eq!(transpose3(&transpose3(&m)), m);
        assert_eq!(row_times(&[1.0, 0.0, 0.0], &m), m[0]);
        assert!(invert3(&[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]]).is_none());
    }
}
