use crate::dist::DataMut;
use std::fmt::Debug;
use std::ops::{AddAssign, MulAssign, SubAssign};

/// Floating-point element type of a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        })
    }
}

/// The element types the engine computes in (f32 and f64).
pub trait Scalar:
    num_traits::Float
    + Default
    + Debug
    + Send
    + Sync
    + 'static
    + AddAssign
    + SubAssign
    + MulAssign
    + std::iter::Sum
{
    /// The [`DType`] naming this element type.
    const DTYPE: DType;
    /// Converts from f64 (rounding for f32).
    fn of(x: f64) -> Self;
    /// Converts to f64 exactly.
    fn to_f64_lossless(self) -> f64;
    /// Erases the element type of a mutable slice for communication.
    fn data_mut(s: &mut [Self]) -> DataMut<'_>;
    /// `C = alpha·A·B + beta·C` with explicit row/column strides (`A` m×k,
    /// `B` k×n, `C` m×n, strides in elements).
    ///
    /// # Panics
    /// When a strided view reaches outside its slice (or before its start):
    /// the check runs in every build, so a wrong shape is a panic, never an
    /// out-of-bounds access. It is O(1) per call.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: &[Self],
        rsa: isize,
        csa: isize,
        b: &[Self],
        rsb: isize,
        csb: isize,
        beta: Self,
        c: &mut [Self],
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_scalar {
    ($t:ty, $dt:expr, $var:ident, $gemm:path) => {
        impl Scalar for $t {
            const DTYPE: DType = $dt;
            #[inline]
            fn of(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn to_f64_lossless(self) -> f64 {
                self as f64
            }
            fn data_mut(s: &mut [Self]) -> DataMut<'_> {
                DataMut::$var(s)
            }
            fn gemm(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: &[Self],
                rsa: isize,
                csa: isize,
                b: &[Self],
                rsb: isize,
                csb: isize,
                beta: Self,
                c: &mut [Self],
                rsc: isize,
                csc: isize,
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                assert!(
                    gemm_extent_ok(m, k, rsa, csa, a.len())
                        && gemm_extent_ok(k, n, rsb, csb, b.len())
                        && gemm_extent_ok(m, n, rsc, csc, c.len()),
                    "gemm: a strided view reaches outside its slice"
                );
                // SAFETY: the assert above keeps every element the strided
                // m×k, k×n and m×n views address inside `a`, `b` and `c`;
                // `c` is a unique borrow, so it aliases neither input.
                unsafe {
                    $gemm(
                        m,
                        k,
                        n,
                        alpha,
                        a.as_ptr(),
                        rsa,
                        csa,
                        b.as_ptr(),
                        rsb,
                        csb,
                        beta,
                        c.as_mut_ptr(),
                        rsc,
                        csc,
                    );
                }
            }
        }
    };
}

/// Whether an r×c view with strides (rs, cs) lies inside a slice of `len`
/// elements: every addressed offset `i·rs + j·cs` is in `0..len`. Negative
/// strides are refused (matrixmultiply would step before the pointer).
fn gemm_extent_ok(r: usize, c: usize, rs: isize, cs: isize, len: usize) -> bool {
    if r == 0 || c == 0 {
        return true;
    }
    if rs < 0 || cs < 0 {
        return false;
    }
    let last = (r as u128 - 1) * rs as u128 + (c as u128 - 1) * cs as u128;
    last < len as u128
}

impl_scalar!(f64, DType::F64, F64, matrixmultiply::dgemm);
impl_scalar!(f32, DType::F32, F32, matrixmultiply::sgemm);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_the_naive_product() {
        let (m, k, n) = (3, 4, 2);
        let a: Vec<f64> = (0..m * k).map(|x| x as f64 * 0.5 - 1.0).collect();
        let b: Vec<f64> = (0..k * n).map(|x| 1.0 / (x as f64 + 1.0)).collect();
        let mut c = vec![1.0; m * n];
        f64::gemm(
            m, k, n, 2.0, &a, k as isize, 1, &b, n as isize, 1, 0.5, &mut c, n as isize, 1,
        );
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                assert!((c[i * n + j] - (2.0 * dot + 0.5)).abs() < 1e-12);
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside its slice")]
    fn gemm_refuses_a_view_past_the_end() {
        let a = vec![1.0f32; 5]; // 2×3 needs 6
        let b = vec![1.0f32; 3];
        let mut c = vec![0.0f32; 2];
        f32::gemm(2, 3, 1, 1.0, &a, 3, 1, &b, 1, 1, 0.0, &mut c, 1, 1);
    }

    #[test]
    fn extents_cover_every_addressed_element() {
        assert!(gemm_extent_ok(2, 3, 3, 1, 6));
        assert!(!gemm_extent_ok(2, 3, 3, 1, 5));
        // Column-major view of a 3×2 buffer.
        assert!(gemm_extent_ok(3, 2, 1, 3, 6));
        assert!(!gemm_extent_ok(2, 2, -1, 1, 100));
        assert!(gemm_extent_ok(0, 5, 1, 1, 0));
    }
}
