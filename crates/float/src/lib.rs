//! The floating-point element types every kernel of the workspace is generic
//! over, and the one GEMM they all call.
//!
//! [`Real`] is `f32` or `f64`: `num_traits::Float` arithmetic and functions,
//! constants, conversions through `f64`, and the raw GEMM kernel.
//! [`gemm`] is the safe entry to that kernel: it checks every strided view
//! against its slice in every build, so a wrong shape is a panic, never an
//! out-of-bounds access. The op engine (`ddmlip-engine`, whose `Scalar`
//! extends [`Real`]) and the e3nn kernels (`ddmlip-e3nn`) both use them.

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
    ($t:ty) => {
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
                // The gemm crate computes `dst = α·dst + β·lhs·rhs`, reading
                // dst only when asked to: so its α is our beta and its β our
                // alpha. Single-threaded: callers split rows over rayon.
                // SAFETY: the caller upholds `gemm_raw`'s contract (every
                // addressed element valid, `c` aliasing neither input),
                // which is the gemm crate's; strides are columns then rows.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        c,
                        csc,
                        rsc,
                        beta != 0.0,
                        a,
                        csa,
                        rsa,
                        b,
                        csb,
                        rsb,
                        beta,
                        alpha,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

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
    if k == 0 {
        // An empty sum: C = beta·C (C not read when beta is zero).
        assert!(
            extent_ok(m, n, rsc, csc, c.len()),
            "gemm: a strided view reaches outside its slice"
        );
        for i in 0..m {
            for j in 0..n {
                let v = &mut c[i * rsc as usize + j * csc as usize];
                *v = if beta == T::ZERO { T::ZERO } else { beta * *v };
            }
        }
        return;
    }
    assert!(
        extent_ok(m, k, rsa, csa, a.len())
            && extent_ok(k, n, rsb, csb, b.len())
            && extent_ok(m, n, rsc, csc, c.len()),
        "gemm: a strided view reaches outside its slice"
    );
    if n < 2 || m < min_rows(csa, rsb, n) {
        padded(m, k, n, alpha, (a, rsa, csa), (b, rsb, csb), beta, (c, rsc, csc));
        return;
    }
    // SAFETY: the assert above keeps every element the strided m×k, k×n and
    // m×n views address inside `a`, `b` and `c`; `c` is a unique borrow, so
    // it aliases neither input.
    unsafe {
        gemm_pieces(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            (rsa, csa),
            b.as_ptr(),
            (rsb, csb),
            beta,
            c.as_mut_ptr(),
            (rsc, csc),
        );
    }
}

// Same bits for a row of C whatever the number of rows in the call: the
// engine and the e3nn kernels cut products into row blocks whose height
// depends on the thread count and on work sharing, and promise the same
// results either way. The kernel sums each element over k in order in its
// general path when it does not split k (k ≤ `K_BLOCK`); it takes other
// paths, with other summation orders, for a single row or column, and for
// m·n ≤ 256 when A is row-major and B column-major. So k is cut into equal
// pieces of at most `K_BLOCK` (the sum of a row then depends only on k),
// and calls with one column, or fewer rows than `min_rows`, run on a
// zero-padded copy.
// Checked by `tests/gemm_kernel.rs`.

/// Largest inner dimension of one kernel call: up to this the kernel's
/// general path does not split the sum over k.
const K_BLOCK: usize = 512;

/// Fewest rows with which a call of n ≥ 2 columns takes the kernel's
/// general path.
fn min_rows(csa: isize, rsb: isize, n: usize) -> usize {
    if csa == 1 && rsb == 1 {
        (256 / n + 1).max(2)
    } else {
        2
    }
}

/// [`gemm`] on views already checked, with k cut into equal pieces of at
/// most [`K_BLOCK`] (the first with `beta`, the rest accumulating).
///
/// # Safety
/// Every element the strided m×k, k×n and m×n views address must be valid,
/// and `c` must alias neither input.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_pieces<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: *const T,
    (rsa, csa): (isize, isize),
    b: *const T,
    (rsb, csb): (isize, isize),
    beta: T,
    c: *mut T,
    (rsc, csc): (isize, isize),
) {
    let pieces = k.div_ceil(K_BLOCK);
    let per = k.div_ceil(pieces);
    let mut beta = beta;
    let mut p0 = 0;
    while p0 < k {
        let kb = (k - p0).min(per);
        // SAFETY: columns p0..p0+kb of A and rows p0..p0+kb of B lie within
        // the caller's views.
        unsafe {
            T::gemm_raw(
                m,
                kb,
                n,
                alpha,
                a.offset(p0 as isize * csa),
                rsa,
                csa,
                b.offset(p0 as isize * rsb),
                rsb,
                csb,
                beta,
                c,
                rsc,
                csc,
            );
        }
        beta = T::ONE;
        p0 += kb;
    }
}

/// [`gemm`] of a call with too few rows or one column (views checked): A,
/// C (when beta ≠ 0) and, for one column, B are copied into row-major
/// buffers padded with zeros to [`min_rows`] rows and two columns, the
/// padded product runs, and C's elements are copied back.
#[allow(clippy::too_many_arguments)]
fn padded<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    (a, rsa, csa): (&[T], isize, isize),
    (b, rsb, csb): (&[T], isize, isize),
    beta: T,
    (c, rsc, csc): (&mut [T], isize, isize),
) {
    let at = |i: usize, j: usize, rs: isize, cs: isize| i * rs as usize + j * cs as usize;
    // One column of B becomes two (the second zero), row-major.
    let cols = n.max(2);
    let bp: Vec<T>;
    let (b, rsb, csb) = if n < 2 {
        bp = (0..k * cols)
            .map(|q| {
                let (p, j) = (q / cols, q % cols);
                if j < n {
                    b[at(p, j, rsb, csb)]
                } else {
                    T::ZERO
                }
            })
            .collect();
        (&bp[..], cols as isize, 1)
    } else {
        (b, rsb, csb)
    };
    // Row-major A: its column stride becomes 1, so the padding is for that.
    let rows = min_rows(1, rsb, cols).max(m);
    let mut ap = vec![T::ZERO; rows * k];
    for i in 0..m {
        for p in 0..k {
            ap[i * k + p] = a[at(i, p, rsa, csa)];
        }
    }
    let mut cp = vec![T::ZERO; rows * cols];
    if beta != T::ZERO {
        for i in 0..m {
            for j in 0..n {
                cp[i * cols + j] = c[at(i, j, rsc, csc)];
            }
        }
    }
    // SAFETY: `ap` is rows×k and `cp` rows×cols, both row-major and owned
    // here; B's view was checked by the caller, or is `bp`, k×cols.
    unsafe {
        gemm_pieces(
            rows,
            k,
            cols,
            alpha,
            ap.as_ptr(),
            (k as isize, 1),
            b.as_ptr(),
            (rsb, csb),
            beta,
            cp.as_mut_ptr(),
            (cols as isize, 1),
        );
    }
    for i in 0..m {
        for j in 0..n {
            c[at(i, j, rsc, csc)] = cp[i * cols + j];
        }
    }
}

/// Whether an r×c view with strides (rs, cs) lies inside a slice of `len`
/// elements: every addressed offset `i·rs + j·cs` is in `0..len`. Negative
/// strides are refused (a view would start before the slice's first element).
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
