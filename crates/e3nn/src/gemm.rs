//! Bounds-checked strided GEMM on slices (a thin safe layer over
//! `matrixmultiply`).

use crate::real::Real;

/// A strided read-only matrix view into a slice.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// A strided mutable matrix view into a slice.
pub(crate) struct MatMut<'a, T> {
    pub data: &'a mut [T],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

fn fits(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * rs + (cols - 1) * cs < len
}

/// `C = alpha·A·B + beta·C`. Shapes and extents are internal invariants of the
/// callers (validated at the public API), so a violation is a bug: it panics
/// instead of touching memory out of bounds.
pub(crate) fn gemm<T: Real>(alpha: T, a: MatRef<T>, b: MatRef<T>, beta: T, c: MatMut<T>) {
    assert!(a.rows == c.rows && b.cols == c.cols && a.cols == b.rows);
    assert!(fits(a.data.len(), a.rows, a.cols, a.rs, a.cs));
    assert!(fits(b.data.len(), b.rows, b.cols, b.rs, b.cs));
    assert!(fits(c.data.len(), c.rows, c.cols, c.rs, c.cs));
    if c.rows == 0 || c.cols == 0 {
        return;
    }
    if a.cols == 0 {
        for r in 0..c.rows {
            for col in 0..c.cols {
                let v = &mut c.data[r * c.rs + col * c.cs];
                *v = if beta == T::ZERO { T::ZERO } else { *v * beta };
            }
        }
        return;
    }
    // The asserts above are the callers' contract; `ddmlip_float::gemm`
    // checks the views again before the kernel touches memory.
    ddmlip_float::gemm(
        a.rows,
        a.cols,
        b.cols,
        alpha,
        a.data,
        a.rs as isize,
        a.cs as isize,
        b.data,
        b.rs as isize,
        b.cs as isize,
        beta,
        c.data,
        c.rs as isize,
        c.cs as isize,
    );
}

/// Row-major `C (m×n) = A (m×k) · B (k×n)`, overwriting `C`.
pub(crate) fn matmul<T: Real>(m: usize, k: usize, n: usize, a: &[T], b: &[T], c: &mut [T]) {
    gemm(
        T::ONE,
        MatRef {
            data: a,
            rows: m,
            cols: k,
            rs: k,
            cs: 1,
        },
        MatRef {
            data: b,
            rows: k,
            cols: n,
            rs: n,
            cs: 1,
        },
        T::ZERO,
        MatMut {
            data: c,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
    );
}

/// Row-major `C (m×k) = G (m×n) · Bᵀ` where `B` is stored k×n, overwriting `C`.
pub(crate) fn matmul_bt<T: Real>(m: usize, n: usize, k: usize, g: &[T], b: &[T], c: &mut [T]) {
    gemm(
        T::ONE,
        MatRef {
            data: g,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
        MatRef {
            data: b,
            rows: n,
            cols: k,
            rs: 1,
            cs: n,
        },
        T::ZERO,
        MatMut {
            data: c,
            rows: m,
            cols: k,
            rs: k,
            cs: 1,
        },
    );
}
