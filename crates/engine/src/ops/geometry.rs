//! Geometry: strain, edge vectors with cell shifts, row norms.

use crate::graph::NodeSpec;
use crate::ops::{scatter_in_source_order, PAR_THRESHOLD};
use crate::{EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use ddmlip_spec::GatherMode;
use rayon::prelude::*;
use std::sync::Arc;

/// Rows per task of `row_norm` and its gradient.
const NORM_ROWS: usize = 4096;

/// The periodic part of edge vectors: integer shifts S per edge, the cell as
/// a (3·n_systems)×3 tensor, and each edge's system.
#[derive(Debug, Clone)]
pub struct PeriodicShifts {
    pub cell: Tensor,
    pub shifts: Arc<Vec<[i32; 3]>>,
    pub edge_system: Index,
}

impl<T: Scalar> Graph<T> {
    /// Applies a per-system strain to row vectors: `r' = r·(I + ε_s)` where
    /// `eps` is System×9 (row-major 3×3) and `idx` maps each row to its system.
    /// Used for positions (Atom rows) and cell vectors (3 rows per system), so
    /// that `∂E/∂ε` gives the virial.
    pub fn apply_strain(
        &mut self,
        x: Tensor,
        eps: Tensor,
        idx: Index,
    ) -> Result<Tensor, EngineError> {
        let (rows, cols) = self.shape(x);
        let (_, ecols) = self.shape(eps);
        if cols != 3 || ecols != 9 {
            return Err(EngineError::shape(
                "apply_strain",
                format!("need rows×3 vectors and n×9 strain, got {rows}×{cols} and ·×{ecols}"),
            ));
        }
        let ids = self.indices[idx.id].values.clone();
        if ids.len() != rows {
            return Err(EngineError::shape(
                "apply_strain",
                "index length differs from the rows",
            ));
        }
        let xv = &self.nodes[x.id].value;
        let ev = &self.nodes[eps.id].value;
        let mut out = self.pool.zeroed(rows * 3);
        let strain_row = |(r, o): (usize, &mut [T])| {
            let e = &ev[ids[r] as usize * 9..ids[r] as usize * 9 + 9];
            for k in 0..3 {
                let mut s = xv[r * 3 + k];
                for m in 0..3 {
                    s += xv[r * 3 + m] * e[m * 3 + k];
                }
                o[k] = s;
            }
        };
        if rows * 3 >= PAR_THRESHOLD {
            out.par_chunks_mut(3).enumerate().for_each(strain_row);
        } else {
            out.chunks_mut(3).enumerate().for_each(strain_row);
        }
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "apply_strain".into(),
            rows,
            cols: 3,
            domain: nx.domain,
            fresh: nx.fresh,
            replicated: nx.replicated,
        };
        self.push_op(
            spec,
            out,
            &[x, eps],
            &[idx],
            None,
            Box::new(move |ctx, g| {
                let ids = ctx.index(idx);
                let ev = ctx.value(eps);
                let xv = ctx.value(x);
                if ctx.wants(x) {
                    // Every element is written below.
                    let mut gx = ctx.for_overwrite(rows * 3);
                    for r in 0..rows {
                        let e = &ev[ids[r] as usize * 9..ids[r] as usize * 9 + 9];
                        for m in 0..3 {
                            let mut s = g[r * 3 + m];
                            for k in 0..3 {
                                s += g[r * 3 + k] * e[m * 3 + k];
                            }
                            gx[r * 3 + m] = s;
                        }
                    }
                    ctx.accumulate(x, gx);
                }
                if ctx.wants(eps) {
                    ctx.accumulate_with(eps, |ge| {
                        for r in 0..rows {
                            let s = ids[r] as usize * 9;
                            for m in 0..3 {
                                for k in 0..3 {
                                    ge[s + m * 3 + k] += xv[r * 3 + m] * g[r * 3 + k];
                                }
                            }
                        }
                    });
                }
                Ok(())
            }),
        )
    }

    /// Edge vectors `r_j − r_i + S·cell_s` (Edge×3) from positions (Atom×3),
    /// `center` (i) and `neighbor` (j) indices, and — for periodic images —
    /// integer shifts with the cell as a (3·n_systems)×3 tensor and each edge's system.
    pub fn edge_vectors(
        &mut self,
        positions: Tensor,
        center: Index,
        neighbor: Index,
        periodic: Option<PeriodicShifts>,
    ) -> Result<Tensor, EngineError> {
        let mut positions = positions;
        let mut handler = None;
        let mode = match &self.dist {
            Some(d)
                if self.nodes[positions.id].rows == d.n_local()
                    && self.nodes[positions.id].domain == RowDomain::Atom =>
            {
                Some(d.spec().policy.gather)
            }
            _ => None,
        };
        if let Some(mode) = mode {
            if mode == GatherMode::HaloRead && !self.nodes[positions.id].fresh {
                positions = self.halo_refresh(positions, "gather:halo_read(refresh)")?;
            }
            handler = Some(match mode {
                GatherMode::HaloRead => "gather:halo_read",
                GatherMode::Local => "gather:local",
            });
        }
        let ci = self.indices[center.id].values.clone();
        let ni = self.indices[neighbor.id].values.clone();
        if ci.len() != ni.len() {
            return Err(EngineError::shape(
                "edge_vectors",
                "center and neighbor indices differ in length",
            ));
        }
        let n_edges = ci.len();
        let pv = &self.nodes[positions.id].value;
        // `fill` writes every element: no zeroing pass first.
        let mut out = self.pool.for_overwrite(n_edges * 3);
        let fill = |(e, o): (usize, &mut [T])| {
            let (i, j) = (ci[e] as usize, ni[e] as usize);
            for k in 0..3 {
                o[k] = pv[j * 3 + k] - pv[i * 3 + k];
            }
        };
        if out.len() >= PAR_THRESHOLD {
            out.par_chunks_mut(3).enumerate().for_each(fill);
        } else {
            out.chunks_mut(3).enumerate().for_each(fill);
        }
        let mut inputs = vec![positions];
        let mut idxs = vec![center, neighbor];
        let mut shift_data = None;
        if let Some(PeriodicShifts {
            cell,
            shifts,
            edge_system: esys,
        }) = periodic
        {
            self.shift_arrays.push(shifts.clone());
            if shifts.len() != n_edges || self.indices[esys.id].values.len() != n_edges {
                return Err(EngineError::shape(
                    "edge_vectors",
                    "shifts / edge systems differ in length from the edges",
                ));
            }
            let cv = &self.nodes[cell.id].value;
            let sys = self.indices[esys.id].values.clone();
            for e in 0..n_edges {
                let s = shifts[e];
                if s == [0, 0, 0] {
                    continue;
                }
                let base = sys[e] as usize * 9;
                for (a, &sa) in s.iter().enumerate() {
                    if sa != 0 {
                        for k in 0..3 {
                            out[e * 3 + k] += T::of(sa as f64) * cv[base + a * 3 + k];
                        }
                    }
                }
            }
            inputs.push(cell);
            idxs.push(esys);
            shift_data = Some((cell, shifts, sys));
        }
        let spec = NodeSpec {
            op: "edge_vectors".into(),
            rows: n_edges,
            cols: 3,
            domain: RowDomain::Edge,
            fresh: true,
            replicated: false,
        };
        self.push_op(
            spec,
            out,
            &inputs,
            &idxs,
            handler,
            Box::new(move |ctx, g| {
                if ctx.wants(positions) {
                    // Per atom, in ascending edge order: + the edge when the
                    // atom is its neighbour, then − when it is its centre.
                    // One pass over the edges on one thread; per atom, the
                    // merged inverse maps otherwise: the same sums in the
                    // same order on any number of threads.
                    let (node_c, node_n) = (ctx.index_node(center), ctx.index_node(neighbor));
                    if scatter_in_source_order(g.len()) {
                        ctx.accumulate_with(positions, |gp| {
                            let edges = g
                                .chunks_exact(3)
                                .zip(node_n.values.iter().zip(node_c.values.iter()));
                            for (row, (&j, &i)) in edges {
                                let j = j as usize * 3;
                                for k in 0..3 {
                                    gp[j + k] += row[k];
                                }
                                let i = i as usize * 3;
                                for k in 0..3 {
                                    gp[i + k] -= row[k];
                                }
                            }
                        });
                    } else {
                        let csr_c = node_c.csr(|| ctx.pool.take_indices());
                        let csr_n = node_n.csr(|| ctx.pool.take_indices());
                        ctx.accumulate_with(positions, |gp| {
                            gp.par_chunks_mut(3).enumerate().for_each(|(a, o)| {
                                let mut as_neighbor = csr_n.sources(a).peekable();
                                let mut as_center = csr_c.sources(a).peekable();
                                loop {
                                    // Ties (an edge from an atom to its own
                                    // image) take the neighbour's + first.
                                    let plus = match (as_neighbor.peek(), as_center.peek()) {
                                        (Some(&n), Some(&c)) => n <= c,
                                        (Some(_), None) => true,
                                        (None, Some(_)) => false,
                                        (None, None) => break,
                                    };
                                    if plus {
                                        if let Some(e) = as_neighbor.next() {
                                            for k in 0..3 {
                                                o[k] += g[e * 3 + k];
                                            }
                                        }
                                    } else if let Some(e) = as_center.next() {
                                        for k in 0..3 {
                                            o[k] -= g[e * 3 + k];
                                        }
                                    }
                                }
                            });
                        });
                    }
                }
                if let Some((cell, shifts, sys)) = &shift_data {
                    if ctx.wants(*cell) {
                        ctx.accumulate_with(*cell, |gc| {
                            for e in 0..shifts.len() {
                                let s = shifts[e];
                                let base = sys[e] as usize * 9;
                                for (a, &sa) in s.iter().enumerate() {
                                    if sa != 0 {
                                        for k in 0..3 {
                                            gc[base + a * 3 + k] += T::of(sa as f64) * g[e * 3 + k];
                                        }
                                    }
                                }
                            }
                        });
                    }
                }
                Ok(())
            }),
        )
    }

    /// Euclidean norm of each row (rows×cols → rows×1).
    pub fn row_norm(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        let (rows, cols) = self.shape(x);
        let xv = &self.nodes[x.id].value;
        // Every element is written below: no zeroing pass first.
        let mut out = self.pool.for_overwrite(rows);
        if cols > 0 {
            // Blocks of rows, each a straight loop the compiler unrolls for
            // the common three columns (edge vectors).
            let norms = |(b, o): (usize, &mut [T])| {
                let src = &xv[b * NORM_ROWS * cols..];
                if cols == 3 {
                    for (o, v) in o.iter_mut().zip(src.chunks_exact(3)) {
                        *o = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
                    }
                } else {
                    for (o, v) in o.iter_mut().zip(src.chunks_exact(cols)) {
                        *o = v.iter().map(|&v| v * v).sum::<T>().sqrt();
                    }
                }
            };
            if rows * cols >= PAR_THRESHOLD {
                out.par_chunks_mut(NORM_ROWS).enumerate().for_each(norms);
            } else {
                out.chunks_mut(NORM_ROWS).enumerate().for_each(norms);
            }
        } else {
            out.iter_mut().for_each(|o| *o = T::zero());
        }
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "row_norm".into(),
            rows,
            cols: 1,
            domain: nx.domain,
            fresh: nx.fresh,
            replicated: nx.replicated,
        };
        let out_t = Tensor {
            id: self.nodes.len(),
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let xv = ctx.value(x);
                let nv = ctx.value(out_t);
                if cols == 0 {
                    return Ok(());
                }
                // d|x|/dx = x/|x|; zero-length rows (coincident atoms) get 0.
                // One division per row, not per element.
                ctx.accumulate_blocks(
                    x,
                    NORM_ROWS * cols,
                    || (),
                    |_, b, dst, overwrite| {
                        let first = b * NORM_ROWS;
                        let rows = dst
                            .chunks_exact_mut(cols)
                            .zip(xv[first * cols..].chunks_exact(cols));
                        for (r, (o, v)) in rows.enumerate() {
                            let n = nv[first + r];
                            let scale = if n > T::zero() {
                                g[first + r] / n
                            } else {
                                T::zero()
                            };
                            for (o, &v) in o.iter_mut().zip(v) {
                                if overwrite {
                                    *o = scale * v;
                                } else {
                                    *o += scale * v;
                                }
                            }
                        }
                    },
                );
                Ok(())
            }),
        )
    }
}
