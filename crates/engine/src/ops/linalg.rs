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
    // Rows of `c` from the same rows of `a`: each element's sum over k runs
    // the same way in any row block.
    let rows = |ab: &[T], cb: &mut [T]| {
        ddmlip_float::gemm(
            cb.len() / n.max(1),
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
    };
    by_row_blocks(a, c, (m, k, n), k, n, &rows);
}

/// `ga += g · bᵀ` with g (m×n), b (k×n) → ga (m×k); `ga = g · bᵀ`
/// (its content not read) when `overwrite`.
pub(crate) fn matmul_bt_into<T: Scalar>(
    g: &[T],
    b: &[T],
    ga: &mut [T],
    (m, k, n): (usize, usize, usize),
    overwrite: bool,
) {
    let beta = if overwrite { T::zero() } else { T::one() };
    let rows = |gb: &[T], gab: &mut [T]| {
        ddmlip_float::gemm(
            gab.len() / k.max(1),
            n,
            k,
            T::one(),
            gb,
            n as isize,
            1,
            b,
            1,
            n as isize,
            beta,
            gab,
            k as isize,
            1,
        );
    };
    by_row_blocks(g, ga, (m, k, n), n, k, &rows);
}

/// Runs `rows(input rows, output rows)` over all `m` rows of a product
/// (`input` has `in_cols` per row, `out` has `out_cols`): in pieces other
/// ranks may run when they can help, in one call when the product is
/// small, otherwise over rayon in blocks of [`ROW_BLOCK`] rows.
fn by_row_blocks<T: Scalar>(
    input: &[T],
    out: &mut [T],
    (m, k, n): (usize, usize, usize),
    in_cols: usize,
    out_cols: usize,
    rows: &(dyn Fn(&[T], &mut [T]) + Sync),
) {
    let pieces = crate::helpers::pieces_for(m * out_cols);
    if pieces > 1 && out_cols > 0 {
        crate::helpers::run_parts(out, out_cols, pieces, &|start, part| {
            let first = start / out_cols;
            let count = part.len() / out_cols;
            rows(&input[first * in_cols..(first + count) * in_cols], part);
        });
    } else if m * k * n < 1 << 16 || m <= ROW_BLOCK {
        rows(input, out);
    } else {
        out.par_chunks_mut(ROW_BLOCK * out_cols)
            .zip(input.par_chunks(ROW_BLOCK * in_cols))
            .for_each(|(part, block)| rows(block, part));
    }
}

impl<T: Scalar> Graph<T> {
    /// Matrix product `a (rows×k) · b (k×n)`; the result has `a`'s row domain.
    pub fn matmul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        self.check_live(&[a, b])?;
        let (m, k) = self.shape(a);
        let (kb, n) = self.shape(b);
        if k != kb {
            return Err(EngineError::shape(
                "matmul",
                format!("inner sizes differ: {m}×{k} · {kb}×{n}"),
            ));
        }
        if let Some(backend) = self.device_for_op() {
            return self.matmul_device(backend, a, b, (m, k, n));
        }
        self.ensure_host(&[a, b])?;
        // β = 0: the GEMM writes every element without reading it.
        let mut out = self.pool.for_overwrite(m * n);
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
        // a's gradient reads b, b's reads a: a constant weight keeps only
        // itself, not the layer's input.
        let mut reads = Vec::new();
        if self.nodes[b.id].requires_grad {
            reads.push(a);
        }
        if self.nodes[a.id].requires_grad {
            reads.push(b);
        }
        self.push_op_reading(
            spec,
            out,
            &[a, b],
            &[],
            None,
            Box::new(move |ctx, g| {
                if ctx.wants(a) {
                    let bv = ctx.value(b);
                    ctx.accumulate_or_fill(a, |ga, fresh| {
                        matmul_bt_into(g, bv, ga, (m, k, n), fresh)
                    });
                }
                if ctx.wants(b) {
                    // gb (k×n) += aᵀ (k×m) · g (m×n); β = 0 when fresh.
                    let av = ctx.value(a);
                    ctx.accumulate_or_fill(b, |gb, fresh| {
                        ddmlip_float::gemm(
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
                            if fresh { T::zero() } else { T::one() },
                            gb,
                            n as isize,
                            1,
                        )
                    });
                }
                Ok(())
            }),
            &reads,
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
