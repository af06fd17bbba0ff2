use crate::graph::NodeSpec;
use crate::{EngineError, Graph, Scalar, Tensor};
use rayon::prelude::*;

/// Rows per GEMM task when splitting a tall product over threads.
const ROW_BLOCK: usize = 256;

/// `c = a · b` for row-major a (m×k), b (k×n), parallel over row blocks of a.
pub(crate) fn matmul_into<T: Scalar>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) {
    let beta = if accumulate { T::one() } else { T::zero() };
    let pieces = crate::helpers::pieces_for(m * n);
    if pieces > 1 && n > 0 {
        // Each element's sum over k runs the same way in any row block.
        crate::helpers::run_parts(c, n, pieces, &|start, cb| {
            let (first, rows) = (start / n, cb.len() / n);
            T::gemm(
                rows,
                k,
                n,
                T::one(),
                &a[first * k..(first + rows) * k],
                k as isize,
                1,
                b,
                n as isize,
                1,
                beta,
                cb,
                n as isize,
                1,
            );
        });
        return;
    }
    if m * k * n < 1 << 16 || m <= ROW_BLOCK {
        T::gemm(
            m,
            k,
            n,
            T::one(),
            a,
            k as isize,
            1,
            b,
            n as isize,
            1,
            beta,
            c,
            n as isize,
            1,
        );
        return;
    }
    c.par_chunks_mut(ROW_BLOCK * n)
        .zip(a.par_chunks(ROW_BLOCK * k))
        .for_each(|(cb, ab)| {
            let rows = ab.len() / k.max(1);
            T::gemm(
                rows,
                k,
                n,
                T::one(),
                ab,
                k as isize,
                1,
                b,
                n as isize,
                1,
                beta,
                cb,
                n as isize,
                1,
            );
        });
}

/// `ga += g · bᵀ` with g (m×n), b (k×n) → ga (m×k).
pub(crate) fn matmul_bt_into<T: Scalar>(
    g: &[T],
    b: &[T],
    ga: &mut [T],
    m: usize,
    k: usize,
    n: usize,
) {
    let pieces = crate::helpers::pieces_for(m * k);
    if pieces > 1 && k > 0 {
        crate::helpers::run_parts(ga, k, pieces, &|start, gab| {
            let (first, rows) = (start / k, gab.len() / k);
            T::gemm(
                rows,
                n,
                k,
                T::one(),
                &g[first * n..(first + rows) * n],
                n as isize,
                1,
                b,
                1,
                n as isize,
                T::one(),
                gab,
                k as isize,
                1,
            );
        });
        return;
    }
    if m * k * n < 1 << 16 || m <= ROW_BLOCK {
        T::gemm(
            m,
            n,
            k,
            T::one(),
            g,
            n as isize,
            1,
            b,
            1,
            n as isize,
            T::one(),
            ga,
            k as isize,
            1,
        );
        return;
    }
    ga.par_chunks_mut(ROW_BLOCK * k)
        .zip(g.par_chunks(ROW_BLOCK * n))
        .for_each(|(gab, gb)| {
            let rows = gb.len() / n.max(1);
            T::gemm(
                rows,
                n,
                k,
                T::one(),
                gb,
                n as isize,
                1,
                b,
                1,
                n as isize,
                T::one(),
                gab,
                k as isize,
                1,
            );
        });
}

impl<T: Scalar> Graph<T> {
    /// Matrix product `a (rows×k) · b (k×n)`; the result has `a`'s row domain.
    pub fn matmul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        let (m, k) = self.shape(a);
        let (kb, n) = self.shape(b);
        if k != kb {
            return Err(EngineError::shape(
                "matmul",
                format!("inner sizes differ: {m}×{k} · {kb}×{n}"),
            ));
        }
        let mut out = self.pool.zeroed(m * n);
        matmul_into(self.value(a), self.value(b), &mut out, m, k, n, false);
        let (na, nb) = (&self.nodes[a.id], &self.nodes[b.id]);
        let spec = NodeSpec {
            op: "matmul".into(),
            rows: m,
            cols: n,
            domain: na.domain,
            fresh: na.fresh,
            replicated: na.replicated && nb.replicated,
        };
        self.push_op(
            spec,
            out,
            &[a, b],
            &[],
            None,
            Box::new(move |ctx, g| {
                if ctx.wants(a) {
                    let bv = ctx.value(b);
                    ctx.accumulate_with(a, |ga| matmul_bt_into(g, bv, ga, m, k, n));
                }
                if ctx.wants(b) {
                    // gb (k×n) += aᵀ (k×m) · g (m×n)
                    let av = ctx.value(a);
                    ctx.accumulate_with(b, |gb| {
                        T::gemm(
                            k,
                            m,
                            n,
                            T::one(),
                            av,
                            1,
                            k as isize,
                            g,
                            n as isize,
                            1,
                            T::one(),
                            gb,
                            n as isize,
                            1,
                        )
                    });
                }
                Ok(())
            }),
        )
    }

    /// `x · w + bias`: a dense layer with `w` (in×out) and an optional `bias` (1×out).
    pub fn linear(
        &mut self,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
    ) -> Result<Tensor, EngineError> {
        let y = self.matmul(x, w)?;
        match bias {
            Some(b) => self.add(y, b),
            None => Ok(y),
        }
    }
}
