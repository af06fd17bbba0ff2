//! The floating-point element types every kernel of the workspace is generic
//! over, and the one GEMM they all call.
//!
//! [`Real`] is `f32` or `f64`: `num_traits::Float` arithmetic and functions,
//! constants, conversions through `f64`, and the raw GEMM kernel.
//! [`gemm`] is the safe entry to that kernel: it checks every strided view
//! against its slice in every build, so a wrong shape is a panic, never an
//! out-of-bounds access. The op engine (`ddmlip-engine`, whose `Scalar`
//! extends [`Real`]) and the e3nn kernels (`ddmlip-e3nn`) both use them.

mod exp;
mod isa;
mod softplus;
mod trig;

pub use exp::{exp_f32, exp_f64};
pub use isa::Isa;
pub use softplus::{softplus_f32, softplus_f64};
pub use trig::{sin_cos_slice, SIN_COS_REDUCED_MAX};

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// A real scalar (`f32` or `f64`): `num_traits::Float` (arithmetic, `sqrt`,
/// `exp`, `sin`, `cos`, `abs`, `max`, …), compound assignment, constants,
/// conversions through `f64`, and the raw GEMM kernel behind [`gemm`].
pub trait Real:
    num_traits::Float
    + Default
    + Debug
    + Send
    + Sync
    + 'static
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
    /// Converts from `f64`, rounding to nearest (exact for `f64`).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64`; exact for both types.
    fn to_f64_lossless(self) -> f64;
    /// `eˣ` without branches or library calls ([`exp_f32`], [`exp_f64`]),
    /// so that loops over slices vectorise: within 1 ulp (`f32`) and 1.5 ulp
    /// (`f64`) wherever the result is a normal number; NaN stays NaN.
    fn exp_branchless(self) -> Self;
    /// `ln(1 + eˣ)` without branches or library calls ([`softplus_f32`],
    /// [`softplus_f64`]), so that loops over slices vectorise: within 1 ulp
    /// (`f32`) and 2.5 ulp (`f64`) of the platform's `ln_1p(exp(x))`; NaN
    /// stays NaN.
    fn softplus_branchless(self) -> Self;

    /// `C = alpha·A·B + beta·C` on strided matrices (`A` m×k, `B` k×n,
    /// `C` m×n; strides in elements). When `beta == 0`, `C` is not read.
    /// Call [`gemm`] instead: it checks the views first.
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
    ($t:ty, $gemm:path, $exp:path, $softplus:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64_lossless(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp_branchless(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn softplus_branchless(self) -> Self {
                $softplus(self)
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

impl_real!(f32, matrixmultiply::sgemm, exp_f32, softplus_f32);
impl_real!(f64, matrixmultiply::dgemm, exp_f64, softplus_f64);

/// `C = alpha·A·B + beta·C` with explicit row/column strides (`A` m×k,
/// `B` k×n, `C` m×n, strides in elements, non-negative). When `beta == 0`,
/// `C` is not read. Nothing happens when `m` or `n` is zero.
///
/// # Panics
/// When a strided view reaches outside its slice (or a stride is negative):
/// the check runs in every build and is O(1) per call.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    rsa: isize,
    csa: isize,
    b: &[T],
    rsb: isize,
    csb: isize,
    beta: T,
    c: &mut [T],
    rsc: isize,
    csc: isize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        extent_ok(m, k, rsa, csa, a.len())
            && extent_ok(k, n, rsb, csb, b.len())
            && extent_ok(m, n, rsc, csc, c.len()),
        "gemm: a strided view reaches outside its slice"
    );
    // SAFETY: the assert above keeps every element the strided m×k, k×n and
    // m×n views address inside `a`, `b` and `c`; `c` is a unique borrow, so
    // it aliases neither input.
    unsafe {
        T::gemm_raw(
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

/// Whether an r×c view with strides (rs, cs) lies inside a slice of `len`
/// elements: every addressed offset `i·rs + j·cs` is in `0..len`. Negative
/// strides are refused (matrixmultiply would step before the pointer).
fn extent_ok(r: usize, c: usize, rs: isize, cs: isize, len: usize) -> bool {
    if r == 0 || c == 0 {
        return true;
    }
    if rs < 0 || cs < 0 {
        return false;
    }
    let last = (r as u128 - 1) * rs as u128 + (c as u128 - 1) * cs as u128;
    last < len as u128
}
