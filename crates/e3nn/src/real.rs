//! The floating-point abstraction the kernels are generic over.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// A real scalar (`f32` or `f64`): arithmetic, the few transcendental
/// functions the kernels need, conversions through `f64`, and a GEMM.
pub trait Real:
    Copy
    + Send
    + Sync
    + Debug
    + Default
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Converts from `f64`, rounding to nearest.
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` (exact).
    fn to_f64(self) -> f64;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Exponential.
    fn exp(self) -> Self;
    /// Sine (radians).
    fn sin(self) -> Self;
    /// Cosine (radians).
    fn cos(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Larger of two values.
    fn max(self, other: Self) -> Self;

    /// `C = alpha·A·B + beta·C` on strided matrices (`A` m×k, `B` k×n,
    /// `C` m×n; strides in elements). When `beta == 0`, `C` is not read.
    ///
    /// # Safety
    /// Every element addressed through the pointers and strides must be valid,
    /// and `c` must not alias `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_real {
    ($t:ty, $gemm:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: the caller upholds `gemm_raw`'s contract (every
                // addressed element valid, `c` aliasing neither input), which
                // is matrixmultiply's.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}

impl_real!(f32, matrixmultiply::sgemm);
impl_real!(f64, matrixmultiply::dgemm);
