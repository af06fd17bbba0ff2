use crate::dist::DataMut;
use std::fmt::Debug;
use std::ops::{AddAssign, MulAssign, SubAssign};

/// Floating-point element type of a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F32,
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
    const DTYPE: DType;
    /// Converts from f64 (rounding for f32).
    fn of(x: f64) -> Self;
    /// Converts to f64 exactly.
    fn to_f64_lossless(self) -> f64;
    /// Erases the element type of a mutable slice for communication.
    fn data_mut(s: &mut [Self]) -> DataMut<'_>;
    /// `C = alpha·A·B + beta·C` with explicit row/column strides.
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
                // SAFETY: callers pass slices whose extents cover the strided
                // m×k, k×n and m×n views (checked by `gemm_extent_ok` in debug).
                debug_assert!(gemm_extent_ok(m, k, rsa, csa, a.len()));
                debug_assert!(gemm_extent_ok(k, n, rsb, csb, b.len()));
                debug_assert!(gemm_extent_ok(m, n, rsc, csc, c.len()));
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

fn gemm_extent_ok(r: usize, c: usize, rs: isize, cs: isize, len: usize) -> bool {
    if r == 0 || c == 0 {
        return true;
    }
    let last = (r as isize - 1) * rs + (c as isize - 1) * cs;
    last >= 0 && (last as usize) < len
}

impl_scalar!(f64, DType::F64, F64, matrixmultiply::dgemm);
impl_scalar!(f32, DType::F32, F32, matrixmultiply::sgemm);
