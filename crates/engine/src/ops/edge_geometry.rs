//! The inputs of the edge-geometry ops after halo handling, and how their
//! gradients are split into pieces.

use crate::ops::geometry::length;
use crate::ops::scatter_in_source_order;
use crate::{DType, Index, Scalar, Tensor};
use rayon::prelude::*;
use std::sync::{Arc, Mutex, PoisonError};

/// Periodic shifts of [`EdgeGeometry`], checked against the edges.
pub(crate) struct EdgeShifts {
    pub(crate) cell: Tensor,
    pub(crate) shifts: Arc<Vec<[i32; 3]>>,
    pub(crate) edge_system: Index,
    pub(crate) systems: Arc<Vec<u32>>,
}

/// The inputs of an edge-geometry op after the halo handling: positions
/// (Atom×3), centre and neighbour rows, and the shifts of periodic images.
pub(crate) struct EdgeGeometry {
    pub(crate) positions: Tensor,
    pub(crate) handler: Option<&'static str>,
    pub(crate) ci: Arc<Vec<u32>>,
    pub(crate) ni: Arc<Vec<u32>>,
    pub(crate) periodic: Option<EdgeShifts>,
    /// The f64 positions (and cell, when periodic) the `T` values round,
    /// when the graph has them ([`crate::Graph::set_exact_values`]).
    pub(crate) exact: Option<ExactGeometry>,
}

/// f64 positions (Atom×3) and cell ((3·n_systems)×3, when the edges are
/// periodic) behind an [`EdgeGeometry`]'s `T` values.
pub(crate) struct ExactGeometry {
    pub(crate) positions: Arc<Vec<f64>>,
    pub(crate) cell: Option<Arc<Vec<f64>>>,
}

impl EdgeGeometry {
    /// `r_j − r_i`, then `+ S_a·cell_a` axis by axis (this order in both ops,
    /// so their values agree bit for bit). `cv` is the cell's value.
    /// With exact values ([`ExactGeometry`]) the vector is computed from
    /// them in f64, in the same order, and rounded once to `T`.
    #[inline(always)]
    pub(crate) fn vector<T: Scalar>(&self, pv: &[T], cv: Option<&[T]>, e: usize) -> [T; 3] {
        // f64 graphs never hold exact values: a compile-time branch keeps
        // their hot loops as they were (a per-edge `match` cost lj ~10 %).
        if T::DTYPE == DType::F64 {
            return self.vector_from(pv, cv, e);
        }
        match &self.exact {
            Some(x) => self
                .vector_from(&x.positions, x.cell.as_deref().map(|c| &c[..]), e)
                .map(T::from_f64),
            None => self.vector_from(pv, cv, e),
        }
    }

    /// `|v|` of edge `e`'s [`EdgeGeometry::vector`]; with exact values, the
    /// f64 length of the f64 vector, rounded once.
    #[inline(always)]
    pub(crate) fn length<T: Scalar>(&self, pv: &[T], cv: Option<&[T]>, e: usize) -> T {
        if T::DTYPE == DType::F64 {
            return length(self.vector_from(pv, cv, e));
        }
        match &self.exact {
            Some(x) => T::from_f64(length(self.vector_from(
                &x.positions,
                x.cell.as_deref().map(|c| &c[..]),
                e,
            ))),
            None => length(self.vector_from(pv, cv, e)),
        }
    }

    /// The length of edge `e` whose [`EdgeGeometry::vector`] is `v`: `|v|`
    /// (no second vector computation), or with exact values the f64 length
    /// rounded once, as [`EdgeGeometry::length`].
    #[inline(always)]
    pub(crate) fn length_of<T: Scalar>(&self, v: [T; 3], e: usize) -> T {
        if T::DTYPE == DType::F64 {
            return length(v);
        }
        match &self.exact {
            Some(x) => T::from_f64(length(self.vector_from(
                &x.positions,
                x.cell.as_deref().map(|c| &c[..]),
                e,
            ))),
            None => length(v),
        }
    }

    /// [`EdgeGeometry::vector`] from positions `pv` and cell `cv` in one type.
    #[inline(always)]
    fn vector_from<U: Scalar>(&self, pv: &[U], cv: Option<&[U]>, e: usize) -> [U; 3] {
        let (i, j) = (self.ci[e] as usize * 3, self.ni[e] as usize * 3);
        let mut v = [pv[j] - pv[i], pv[j + 1] - pv[i + 1], pv[j + 2] - pv[i + 2]];
        if let (Some(p), Some(cv)) = (&self.periodic, cv) {
            let s = p.shifts[e];
            if s != [0, 0, 0] {
                let base = p.systems[e] as usize * 9;
                for (a, &sa) in s.iter().enumerate() {
                    if sa != 0 {
                        for k in 0..3 {
                            v[k] += U::from_f64(sa as f64) * cv[base + a * 3 + k];
                        }
                    }
                }
            }
        }
        v
    }

    /// The op's tensor and index inputs, in the order the trace records.
    pub(crate) fn inputs(&self, center: Index, neighbor: Index) -> (Vec<Tensor>, Vec<Index>) {
        let mut inputs = vec![self.positions];
        let mut idxs = vec![center, neighbor];
        if let Some(p) = &self.periodic {
            inputs.push(p.cell);
            idxs.push(p.edge_system);
        }
        (inputs, idxs)
    }

    /// Backward of an op whose gradient with respect to edge vector `e` is
    /// `row(positions, cell, e)`: + at the neighbour, − at the centre, and
    /// `S·row` into the cell.
    pub(crate) fn backward<T: Scalar>(
        &self,
        ctx: &mut crate::graph::BackwardCtx<'_, T>,
        center: Index,
        neighbor: Index,
        row: impl Fn(&[T], Option<&[T]>, usize) -> [T; 3] + Sync,
    ) {
        let pv = ctx.value(self.positions);
        let cv = self.periodic.as_ref().map(|p| ctx.value(p.cell));
        let row = |e: usize| row(pv, cv, e);
        let n_edges = self.ci.len();
        if ctx.wants(self.positions) {
            // Per atom, in ascending edge order: + the edge when the atom is
            // its neighbour, then − when it is its centre. One pass over the
            // edges on one thread; per atom, the merged inverse maps
            // otherwise: the same sums in the same order on any number of
            // threads.
            if scatter_in_source_order(n_edges * 3) {
                ctx.accumulate_with(self.positions, |gp| {
                    for e in 0..n_edges {
                        self.add_to_positions(e, row(e), gp);
                    }
                });
            } else {
                let (node_c, node_n) = (ctx.index_node(center), ctx.index_node(neighbor));
                let csr_c = node_c.csr(|| ctx.pool.take_indices());
                let csr_n = node_n.csr(|| ctx.pool.take_indices());
                ctx.accumulate_with(self.positions, |gp| {
                    gp.par_chunks_mut(3).enumerate().for_each(|(a, o)| {
                        let mut as_neighbor = csr_n.sources(a).peekable();
                        let mut as_center = csr_c.sources(a).peekable();
                        loop {
                            // Ties (an edge from an atom to its own image)
                            // take the neighbour's + first.
                            let plus = match (as_neighbor.peek(), as_center.peek()) {
                                (Some(&n), Some(&c)) => n <= c,
                                (Some(_), None) => true,
                                (None, Some(_)) => false,
                                (None, None) => break,
                            };
                            if plus {
                                if let Some(e) = as_neighbor.next() {
                                    let r = row(e);
                                    for k in 0..3 {
                                        o[k] += r[k];
                                    }
                                }
                            } else if let Some(e) = as_center.next() {
                                let r = row(e);
                                for k in 0..3 {
                                    o[k] -= r[k];
                                }
                            }
                        }
                    });
                });
            }
        }
        if let Some(p) = &self.periodic {
            if ctx.wants(p.cell) {
                ctx.accumulate_with(p.cell, |gc| {
                    for (e, s) in p.shifts.iter().enumerate() {
                        if *s != [0, 0, 0] {
                            self.add_to_cell(e, row(e), gc);
                        }
                    }
                });
            }
        }
    }

    /// Adds edge `e`'s vector gradient `r` to the positions' gradient `gp`:
    /// + at the neighbour, then − at the centre.
    #[inline(always)]
    pub(crate) fn add_to_positions<T: Scalar>(&self, e: usize, r: [T; 3], gp: &mut [T]) {
        let j = self.ni[e] as usize * 3;
        for k in 0..3 {
            gp[j + k] += r[k];
        }
        let i = self.ci[e] as usize * 3;
        for k in 0..3 {
            gp[i + k] -= r[k];
        }
    }

    /// Adds `S_e ⊗ r` (edge `e`'s shift times its vector gradient) to the
    /// cell's gradient `gc`; nothing for unshifted edges.
    #[inline(always)]
    pub(crate) fn add_to_cell<T: Scalar>(&self, e: usize, r: [T; 3], gc: &mut [T]) {
        let Some(p) = &self.periodic else {
            return;
        };
        let s = p.shifts[e];
        let base = p.systems[e] as usize * 9;
        for (a, &sa) in s.iter().enumerate() {
            if sa != 0 {
                for k in 0..3 {
                    gc[base + a * 3 + k] += T::from_f64(sa as f64) * r[k];
                }
            }
        }
    }
}

/// Edges per piece of a pair sum's gradient, at least, when ranks can help
/// each other (`crate::helpers`): enough that a piece's own zeroed rows and
/// their final sum cost little against its edges.
const PIECE_EDGES: usize = 1 << 18;

/// At most this many pieces: each costs one pass over the position rows.
const MAX_PIECES: usize = 16;

/// Pieces of a pair sum's one-thread gradient over `n_edges` edges: 1
/// unless ranks can help each other; a function of `n_edges` alone
/// otherwise, so that the sums do not depend on who runs which piece.
pub(crate) fn backward_pieces(n_edges: usize) -> usize {
    if crate::helpers::has_board() {
        (n_edges / PIECE_EDGES).clamp(1, MAX_PIECES)
    } else {
        1
    }
}

pub(crate) fn lock_piece<G>(m: &Mutex<G>) -> std::sync::MutexGuard<'_, G> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
