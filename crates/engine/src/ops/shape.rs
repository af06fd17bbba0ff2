//! Concatenation, column slices and reductions along rows or columns.

use crate::device::DeviceBackend;
use crate::graph::{NodeSpec, OpRecord};
use crate::ops::map_rows;
use crate::{EngineError, Graph, RowDomain, Scalar, Tensor};
use std::sync::Arc;

impl<T: Scalar> Graph<T> {
    /// Concatenates tensors with equal row counts along columns.
    pub fn concat_cols(&mut self, parts: &[Tensor]) -> Result<Tensor, EngineError> {
        self.ensure_host(parts)?;
        self.check_live(parts)?;
        let Some(&first) = parts.first() else {
            return Err(EngineError::shape("concat_cols", "no inputs"));
        };
        let rows = self.shape(first).0;
        let widths: Vec<usize> = parts.iter().map(|&t| self.shape(t).1).collect();
        if parts.iter().any(|&t| self.shape(t).0 != rows) {
            return Err(EngineError::shape(
                "concat_cols",
                "inputs differ in row count",
            ));
        }
        let cols: usize = widths.iter().sum();
        // Every element is written below: the parts tile each row.
        let mut out = self.pool.for_overwrite(rows * cols);
        let values: Vec<&[T]> = parts.iter().map(|t| &self.nodes[t.id].value[..]).collect();
        map_rows(&mut out, cols, |r0, part| {
            for (k, row) in part.chunks_exact_mut(cols.max(1)).enumerate() {
                let r = r0 + k;
                let mut off = 0;
                for (v, &w) in values.iter().zip(&widths) {
                    row[off..off + w].copy_from_slice(&v[r * w..(r + 1) * w]);
                    off += w;
                }
            }
        });
        let n0 = &self.nodes[first.id];
        let spec = NodeSpec {
            op: "concat_cols".into(),
            rows,
            cols,
            domain: n0.domain,
            fresh: parts.iter().all(|t| self.nodes[t.id].fresh),
            replicated: parts.iter().all(|t| self.nodes[t.id].replicated),
        };
        let parts_v = parts.to_vec();
        self.push_op(
            spec,
            out,
            parts,
            &[],
            None,
            Box::new(move |ctx, g| {
                let mut off = 0;
                for (&t, &w) in parts_v.iter().zip(&widths) {
                    if ctx.wants(t) {
                        // Every element is written below.
                        let mut gt = ctx.for_overwrite(rows * w);
                        map_rows(&mut gt, w, |r0, part| {
                            for (k, row) in part.chunks_exact_mut(w.max(1)).enumerate() {
                                let r = (r0 + k) * cols + off;
                                row.copy_from_slice(&g[r..r + w]);
                            }
                        });
                        ctx.accumulate(t, gt);
                    }
                    off += w;
                }
                Ok(())
            }),
        )
    }

    /// Columns `start..end` of every row.
    pub fn slice_cols(
        &mut self,
        x: Tensor,
        start: usize,
        end: usize,
    ) -> Result<Tensor, EngineError> {
        self.check_live(&[x])?;
        let (rows, cols) = self.shape(x);
        if start > end || end > cols {
            return Err(EngineError::shape(
                "slice_cols",
                format!("range {start}..{end} outside 0..{cols}"),
            ));
        }
        // A value already on the device is sliced there.
        if let Some(backend) = self.device_for_op() {
            if self.is_on_device(x) {
                return self.slice_cols_device(backend, x, start, end);
            }
        }
        self.ensure_host(&[x])?;
        let w = end - start;
        let v = &self.nodes[x.id].value;
        // Every element is written below.
        let mut out = self.pool.for_overwrite(rows * w);
        map_rows(&mut out, w, |r0, part| {
            for (k, row) in part.chunks_exact_mut(w.max(1)).enumerate() {
                let r = (r0 + k) * cols;
                row.copy_from_slice(&v[r + start..r + end]);
            }
        });
        let n = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "slice_cols".into(),
            rows,
            cols: w,
            domain: n.domain,
            fresh: n.fresh,
            replicated: n.replicated,
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                ctx.accumulate_with(x, |gx| {
                    map_rows(gx, cols, |r0, part| {
                        for (k, row) in part.chunks_exact_mut(cols.max(1)).enumerate() {
                            let r = (r0 + k) * w;
                            for (a, &b) in row[start..end].iter_mut().zip(&g[r..r + w]) {
                                *a += b;
                            }
                        }
                    });
                });
                Ok(())
            }),
        )
    }

    /// [`Graph::slice_cols`] on the device; its backward writes the
    /// gradient into those columns of a zeroed array.
    fn slice_cols_device(
        &mut self,
        backend: Arc<dyn DeviceBackend<T>>,
        x: Tensor,
        start: usize,
        end: usize,
    ) -> Result<Tensor, EngineError> {
        let op = "slice_cols";
        let dev_err = |e| EngineError::device(op, e);
        let (rows, cols) = self.shape(x);
        let w = end - start;
        let mut out = backend.alloc(rows * w).map_err(dev_err)?;
        backend
            .copy_cols(
                rows,
                w,
                (self.device_value(x)?, cols, start),
                (&mut out, w, 0),
            )
            .map_err(dev_err)?;
        let n = &self.nodes[x.id];
        let spec = NodeSpec {
            op: op.into(),
            rows,
            cols: w,
            domain: n.domain,
            fresh: n.fresh,
            replicated: n.replicated,
        };
        let record = OpRecord {
            inputs: &[x],
            indices: &[],
            handler: None,
            reads: &[],
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let g = ctx.device_out_grad(op)?;
                let b = ctx.backend(op)?;
                let mut gx = b.alloc(rows * cols).map_err(dev_err)?;
                b.zero(&mut gx).map_err(dev_err)?;
                b.copy_cols(rows, w, (g, w, 0), (&mut gx, cols, start))
                    .map_err(dev_err)?;
                ctx.device_add(op, x, gx)
            }),
        )
    }

    /// Sum over the columns of each row (rows×cols → rows×1).
    pub fn sum_cols(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.ensure_host(&[x])?;
        self.check_live(&[x])?;
        let (rows, cols) = self.shape(x);
        let v = &self.nodes[x.id].value;
        let out: Vec<T> = (0..rows)
            .map(|r| v[r * cols..(r + 1) * cols].iter().copied().sum())
            .collect();
        let n = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "sum_cols".into(),
            rows,
            cols: 1,
            domain: n.domain,
            fresh: n.fresh,
            replicated: n.replicated,
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                ctx.accumulate_with(x, |gx| {
                    map_rows(gx, cols, |r0, part| {
                        for (k, row) in part.chunks_exact_mut(cols.max(1)).enumerate() {
                            for a in row {
                                *a += g[r0 + k];
                            }
                        }
                    });
                });
                Ok(())
            }),
        )
    }

    /// Sum over all rows (rows×cols → 1×cols, domain none). A purely local
    /// reduction: in a decomposed run it does not combine ranks — use
    /// [`Graph::segment_sum`] for per-system totals.
    pub fn sum_rows(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.ensure_host(&[x])?;
        self.check_live(&[x])?;
        let (rows, cols) = self.shape(x);
        let v = &self.nodes[x.id].value;
        let mut out = vec![T::zero(); cols];
        for r in 0..rows {
            for c in 0..cols {
                out[c] += v[r * cols + c];
            }
        }
        let spec = NodeSpec {
            op: "sum_rows".into(),
            rows: 1,
            cols,
            domain: RowDomain::None,
            fresh: true,
            replicated: false,
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                ctx.accumulate_with(x, |gx| {
                    map_rows(gx, cols, |_, part| {
                        for row in part.chunks_exact_mut(cols.max(1)) {
                            for (a, &b) in row.iter_mut().zip(g) {
                                *a += b;
                            }
                        }
                    });
                });
                Ok(())
            }),
        )
    }
}
