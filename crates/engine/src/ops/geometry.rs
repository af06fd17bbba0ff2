//! Geometry: strain, edge vectors with cell shifts, row norms.

use crate::graph::NodeSpec;
use crate::ops::edge_geometry::{
    backward_pieces, lock_piece, EdgeGeometry, EdgeShifts, ExactGeometry,
};
use crate::ops::index::{scatter_handler, scatter_map};
use crate::ops::pointwise::BLOCK;
use crate::ops::{scatter_in_source_order, Pointwise, PAR_THRESHOLD};
use crate::{Edges, EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use ddmlip_spec::GatherMode;
use rayon::prelude::*;
use std::sync::{Arc, Mutex, PoisonError};

/// Rows per task of `row_norm` and of the edge ops, and of their gradients.
const NORM_ROWS: usize = 4096;

/// `|v|`, the one expression every length here uses (so that edge lengths,
/// `row_norm` of edge vectors and pair sums agree bit for bit).
#[inline(always)]
pub(crate) fn length<T: Scalar>(v: [T; 3]) -> T {
    (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt()
}

/// `g / |v|`, the factor of `v` in the gradient of a length; zero for a
/// zero length (coincident atoms).
#[inline(always)]
fn length_scale<T: Scalar>(g: T, length: T) -> T {
    if length > T::zero() {
        g / length
    } else {
        T::zero()
    }
}

/// The periodic part of edge vectors: integer shifts S per edge, the cell as
/// a (3·n_systems)×3 tensor, and each edge's system.
#[derive(Debug, Clone)]
pub struct PeriodicShifts {
    /// Cells of the systems (n_systems × 9, rows are lattice vectors, Å).
    pub cell: Tensor,
    /// Integer cell shift S of each edge (one per edge).
    pub shifts: Arc<Vec<[i32; 3]>>,
    /// Edge → system whose cell the shift multiplies.
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
        if let Some(backend) = self.device_for_op() {
            return self.apply_strain_device(backend, x, eps, idx);
        }
        self.ensure_host(&[x, eps])?;
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
        let exact = self.strained_exact_values(x, eps, &ids);
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "apply_strain".into(),
            rows,
            cols: 3,
            domain: nx.domain,
            fresh: nx.fresh,
            replicated: nx.replicated,
        };
        let out_t = self.push_op(
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
        )?;
        if let Some(exact) = exact {
            self.exact_values.push((out_t.id, Arc::new(exact)));
        }
        Ok(out_t)
    }

    /// The f64 values behind `apply_strain(x, eps, ids)`'s output: those
    /// behind `x` strained in f64 (with the strain's value), when `x` has
    /// them (see [`Graph::set_exact_values`]). Reads the strain on the host.
    pub(crate) fn strained_exact_values(
        &self,
        x: Tensor,
        eps: Tensor,
        ids: &[u32],
    ) -> Option<Vec<f64>> {
        let xe = self.exact_values_of(x)?;
        let ev = &self.nodes[eps.id].value;
        let mut out = vec![0.0; ids.len() * 3];
        for (r, o) in out.chunks_exact_mut(3).enumerate() {
            let e = &ev[ids[r] as usize * 9..ids[r] as usize * 9 + 9];
            for k in 0..3 {
                let mut s = xe[r * 3 + k];
                for m in 0..3 {
                    s += xe[r * 3 + m] * e[m * 3 + k].to_f64_lossless();
                }
                o[k] = s;
            }
        }
        Some(out)
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
        let geo = self.edge_geometry("edge_vectors", positions, center, neighbor, periodic)?;
        if let Some(backend) = self.device_for_op() {
            return self.edge_op_device(backend, geo, (center, neighbor), false);
        }
        self.geometry_to_host(&geo)?;
        let (out, spec) = self.edge_rows(&geo, "edge_vectors", 3, |pv, cv, e, o| {
            o.copy_from_slice(&geo.vector(pv, cv, e))
        });
        let (inputs, idxs) = geo.inputs(center, neighbor);
        let handler = geo.handler;
        self.push_op(
            spec,
            out,
            &inputs,
            &idxs,
            handler,
            Box::new(move |ctx, g| {
                geo.backward(ctx, center, neighbor, |_, _, e| {
                    [g[e * 3], g[e * 3 + 1], g[e * 3 + 2]]
                });
                Ok(())
            }),
        )
    }

    /// Edge lengths `|r_j − r_i + S·cell_s|` (Edge×1): the same inputs as
    /// [`Graph::edge_vectors`], and the same values as `row_norm` of its
    /// output, bit for bit, without storing the vectors (with exact values,
    /// [`Graph::set_exact_values`], the f64 length rounded once instead). The gradient
    /// recomputes each vector from the positions, so neither pass moves the
    /// Edge×3 array through memory (for models that read only lengths).
    pub fn edge_lengths(
        &mut self,
        positions: Tensor,
        center: Index,
        neighbor: Index,
        periodic: Option<PeriodicShifts>,
    ) -> Result<Tensor, EngineError> {
        let geo = self.edge_geometry("edge_lengths", positions, center, neighbor, periodic)?;
        if let Some(backend) = self.device_for_op() {
            return self.edge_op_device(backend, geo, (center, neighbor), true);
        }
        self.geometry_to_host(&geo)?;
        // The same expression as `row_norm`, so the same bits (in f64, or
        // without exact values; else the f64 length rounded once).
        let (out, spec) = self.edge_rows(&geo, "edge_lengths", 1, |pv, cv, e, o| {
            o[0] = geo.length(pv, cv, e);
        });
        let (inputs, idxs) = geo.inputs(center, neighbor);
        let handler = geo.handler;
        let out_t = Tensor {
            id: self.nodes.len(),
        };
        self.push_op(
            spec,
            out,
            &inputs,
            &idxs,
            handler,
            Box::new(move |ctx, g| {
                let lengths = ctx.value(out_t);
                // d|v|/dv = v/|v| as row_norm has it: one division per edge,
                // zero for coincident atoms.
                geo.backward(ctx, center, neighbor, |pv, cv, e| {
                    let scale = length_scale(g[e], lengths[e]);
                    geo.vector(pv, cv, e).map(|v| scale * v)
                });
                Ok(())
            }),
        )
    }

    /// The runtime's neighbour graph for a model: `center`/`neighbor` rows
    /// (Edge → Atom) on `positions` (Atom×3), each edge's system, and the
    /// periodic shifts, if any. Nothing per edge is computed here; see
    /// [`Edges`].
    ///
    /// Errors: index or shift arrays of different lengths.
    pub fn edges(
        &mut self,
        positions: Tensor,
        center: Index,
        neighbor: Index,
        system: Index,
        periodic: Option<PeriodicShifts>,
    ) -> Result<Edges, EngineError> {
        let n_edges = self.indices[center.id].values.len();
        if self.indices[neighbor.id].values.len() != n_edges
            || self.indices[system.id].values.len() != n_edges
        {
            return Err(EngineError::shape(
                "edges",
                "center, neighbor and system indices differ in length",
            ));
        }
        let periodic = match periodic {
            None => None,
            Some(p) => {
                if p.shifts.len() != n_edges
                    || self.indices[p.edge_system.id].values.len() != n_edges
                {
                    return Err(EngineError::shape(
                        "edges",
                        "shifts / edge systems differ in length from the edges",
                    ));
                }
                self.shift_arrays.push(p.shifts);
                Some((p.cell, p.edge_system, self.shift_arrays.len() - 1))
            }
        };
        Ok(Edges {
            center,
            neighbor,
            system,
            positions,
            periodic,
        })
    }

    /// Per-atom sums of a function of edge lengths: `out[i] = Σ f(|v_e|)`
    /// over the edges e centred on i (Atom×1), `f` being `expr` of one
    /// input. The values of `scatter_add(pointwise([lengths], expr),
    /// center)` bit for bit, and the same gradients, with no per-edge array
    /// in either pass: both recompute the vectors from the positions (a
    /// pair potential reads each edge's centre and neighbour and nothing
    /// else). Decomposed, the positions are read as by the edge ops and the
    /// sums land as a scatter-add's do (the spec's scatter mode).
    ///
    /// Errors: an expression that does not take exactly one input, or one
    /// [`Graph::pointwise`] refuses.
    pub fn pair_sum(&mut self, edges: &Edges, expr: &Pointwise) -> Result<Tensor, EngineError> {
        let op = format!("pair_sum:{}", expr.name);
        expr.check().map_err(|m| EngineError::shape(&op, m))?;
        if expr.n_inputs != 1 {
            return Err(EngineError::shape(
                &op,
                format!(
                    "expression takes {} inputs; a pair sum gives it one, the length",
                    expr.n_inputs
                ),
            ));
        }
        let (center, neighbor) = (edges.center, edges.neighbor);
        let periodic = edges.periodic_shifts(self);
        let geo = self.edge_geometry(&op, edges.positions, center, neighbor, periodic)?;
        let ix = &self.indices[center.id];
        let n_rows = ix.target_rows;
        let mode = match &self.dist {
            Some(d) if ix.target == RowDomain::Atom && n_rows == d.n_local() => {
                Some(d.spec().policy.scatter)
            }
            _ => None,
        };
        if let (Some(backend), true) = (self.device_for_op(), expr.runs_on_device()) {
            let landing = (mode.map(scatter_handler), mode.is_none());
            let y = self.pair_sum_device(backend, op, geo, expr, (center, neighbor), landing)?;
            return match mode {
                Some(mode) => self.land_scatter(y, center, mode),
                None => Ok(y),
            };
        }
        self.geometry_to_host(&geo)?;
        let n_edges = geo.ci.len();
        let mut out = self.pool.zeroed(n_rows);
        {
            let pv = &self.nodes[geo.positions.id].value;
            let cv = geo
                .periodic
                .as_ref()
                .map(|p| &self.nodes[p.cell.id].value[..]);
            let pool = &mut self.pool;
            let csr = scatter_map(&self.indices[center.id], n_edges, || pool.take_indices());
            let mut lengths = [T::zero(); BLOCK];
            match csr {
                // Straight through the edges: each centre receives its terms
                // in edge order, as the scatter-add would add them.
                None => {
                    let mut regs = expr.registers();
                    for start in (0..n_edges).step_by(BLOCK) {
                        let len = BLOCK.min(n_edges - start);
                        for (k, r) in lengths[..len].iter_mut().enumerate() {
                            *r = geo.length(pv, cv, start + k);
                        }
                        let terms = expr.eval_one(&lengths[..len], &mut regs);
                        for (k, &y) in terms.iter().enumerate() {
                            out[geo.ci[start + k] as usize] += y;
                        }
                    }
                }
                // Per centre through the inverse map, its edges ascending:
                // the same sums in the same order on any number of threads.
                Some(csr) => {
                    let init = || (expr.registers(), [T::zero(); BLOCK]);
                    out.par_iter_mut().enumerate().for_each_init(
                        init,
                        |(regs, lengths), (a, o)| {
                            let mut len = 0;
                            let mut flush = |len: usize, lengths: &[T; BLOCK]| {
                                for &y in expr.eval_one(&lengths[..len], regs) {
                                    *o += y;
                                }
                            };
                            for e in csr.sources(a) {
                                lengths[len] = geo.length(pv, cv, e);
                                len += 1;
                                if len == BLOCK {
                                    flush(len, lengths);
                                    len = 0;
                                }
                            }
                            if len > 0 {
                                flush(len, lengths);
                            }
                        },
                    );
                }
            }
        }
        let scatter_handler = mode.map(scatter_handler);
        // The positions' read fires the gather handler as an edge op's does;
        // the trace records the scatter's, as for a message-passing op.
        if let Some(h) = geo.handler {
            *self.handler_counts.entry(h.to_string()).or_insert(0) += 1;
        }
        let spec = NodeSpec {
            op,
            rows: n_rows,
            cols: 1,
            domain: RowDomain::Atom,
            fresh: mode.is_none(),
            replicated: false,
        };
        let (inputs, idxs) = geo.inputs(center, neighbor);
        let expr = expr.clone();
        let y = self.push_op(
            spec,
            out,
            &inputs,
            &idxs,
            scatter_handler,
            Box::new(move |ctx, g| {
                let wants_cell = geo.periodic.as_ref().is_some_and(|p| ctx.wants(p.cell));
                if !ctx.wants(geo.positions) && !wants_cell {
                    return Ok(());
                }
                if ctx.wants(geo.positions) && scatter_in_source_order(n_edges * 3) {
                    // One thread: one pass over the edges, block by block —
                    // lengths, f', and each edge's term into the positions
                    // (+ neighbour, − centre) and the cell in edge order, as
                    // the unfused ops add them.
                    let mut cell_grad = match &geo.periodic {
                        Some(p) if ctx.wants(p.cell) => Some(ctx.take_grad(p.cell)),
                        _ => None,
                    };
                    // With ranks to help, the edges in pieces: the first adds
                    // into the gradients, each other piece into its own
                    // zeroed rows, added in piece order after all ran.
                    let pieces = backward_pieces(n_edges);
                    let n_position_values = ctx.value(geo.positions).len();
                    let n_cell_values = cell_grad.as_ref().map_or(0, Vec::len);
                    let extra: Vec<Mutex<(Vec<T>, Vec<T>)>> = (1..pieces)
                        .map(|_| {
                            Mutex::new((ctx.zeroed(n_position_values), ctx.zeroed(n_cell_values)))
                        })
                        .collect();
                    let pv = ctx.value(geo.positions);
                    let cv = geo.periodic.as_ref().map(|p| ctx.value(p.cell));
                    let edge_terms =
                        |edges: std::ops::Range<usize>, gp: &mut [T], mut gc: Option<&mut [T]>| {
                            let mut scratch = expr.grad_scratch(0);
                            let mut vectors = [[T::zero(); 3]; BLOCK];
                            let mut lengths = [T::zero(); BLOCK];
                            let mut seeds = [T::zero(); BLOCK];
                            let mut grads = [T::zero(); BLOCK];
                            for start in edges.clone().step_by(BLOCK) {
                                let len = BLOCK.min(edges.end - start);
                                for k in 0..len {
                                    vectors[k] = geo.vector(pv, cv, start + k);
                                    lengths[k] = geo.length_of(vectors[k], start + k);
                                    seeds[k] = g[geo.ci[start + k] as usize];
                                }
                                expr.grad_one(
                                    &lengths[..len],
                                    &seeds[..len],
                                    &mut scratch,
                                    &mut grads[..len],
                                );
                                for k in 0..len {
                                    let scale = length_scale(grads[k], lengths[k]);
                                    let term = vectors[k].map(|x| scale * x);
                                    geo.add_to_positions(start + k, term, gp);
                                    if let Some(gc) = gc.as_deref_mut() {
                                        geo.add_to_cell(start + k, term, gc);
                                    }
                                }
                            }
                        };
                    ctx.accumulate_with(geo.positions, |gp| {
                        if pieces == 1 {
                            edge_terms(0..n_edges, gp, cell_grad.as_deref_mut());
                            return;
                        }
                        let piece_edges =
                            |p: usize| p * n_edges / pieces..(p + 1) * n_edges / pieces;
                        let first = Mutex::new((gp, cell_grad.as_deref_mut()));
                        crate::helpers::run_pieces(pieces, &|p| {
                            if p == 0 {
                                let mut first = lock_piece(&first);
                                let (gp, gc) = &mut *first;
                                edge_terms(piece_edges(0), gp, gc.as_deref_mut());
                            } else {
                                let mut own = lock_piece(&extra[p - 1]);
                                let (gp, gc) = &mut *own;
                                let gc = (!gc.is_empty()).then_some(&mut gc[..]);
                                edge_terms(piece_edges(p), gp, gc);
                            }
                        });
                        let (gp, mut gc) =
                            first.into_inner().unwrap_or_else(PoisonError::into_inner);
                        for piece in &extra {
                            let own = lock_piece(piece);
                            for (a, b) in gp.iter_mut().zip(&own.0) {
                                *a += *b;
                            }
                            if let Some(gc) = gc.as_deref_mut() {
                                for (a, b) in gc.iter_mut().zip(&own.1) {
                                    *a += *b;
                                }
                            }
                        }
                    });
                    for piece in extra {
                        let (rows, cell) =
                            piece.into_inner().unwrap_or_else(PoisonError::into_inner);
                        ctx.recycle(rows);
                        ctx.recycle(cell);
                    }
                    if let (Some(p), Some(gc)) = (&geo.periodic, cell_grad) {
                        ctx.put_grad(p.cell, gc);
                    }
                    return Ok(());
                }
                let pv = ctx.value(geo.positions);
                let cv = geo.periodic.as_ref().map(|p| ctx.value(p.cell));
                // ∂out/∂|v_e| = f'(|v_e|)·g[center[e]] block by block, then
                // the edge ops' backward through the inverse maps.
                let mut length_grads = ctx.for_overwrite(n_edges);
                let fill = |scratch: &mut _, (b, dst): (usize, &mut [T])| {
                    let start = b * BLOCK;
                    let mut lengths = [T::zero(); BLOCK];
                    let mut seeds = [T::zero(); BLOCK];
                    for k in 0..dst.len() {
                        lengths[k] = geo.length(pv, cv, start + k);
                        seeds[k] = g[geo.ci[start + k] as usize];
                    }
                    let len = dst.len();
                    expr.grad_one(&lengths[..len], &seeds[..len], scratch, dst);
                };
                let init = || expr.grad_scratch(0);
                if n_edges >= PAR_THRESHOLD {
                    length_grads
                        .par_chunks_mut(BLOCK)
                        .enumerate()
                        .for_each_init(init, fill);
                } else {
                    let mut state = init();
                    length_grads
                        .chunks_mut(BLOCK)
                        .enumerate()
                        .for_each(|c| fill(&mut state, c));
                }
                geo.backward(ctx, center, neighbor, |pv, cv, e| {
                    let v = geo.vector(pv, cv, e);
                    let scale = length_scale(length_grads[e], geo.length_of(v, e));
                    v.map(|x| scale * x)
                });
                ctx.recycle(length_grads);
                Ok(())
            }),
        )?;
        match mode {
            Some(mode) => self.land_scatter(y, center, mode),
            None => Ok(y),
        }
    }

    /// An edge op's output (`cols` values per edge, written by `row` from
    /// the edge vector; blocks of edges over rayon when large) and its node.
    fn edge_rows(
        &mut self,
        geo: &EdgeGeometry,
        op: &str,
        cols: usize,
        row: impl Fn(&[T], Option<&[T]>, usize, &mut [T]) + Sync,
    ) -> (Vec<T>, NodeSpec) {
        let n_edges = geo.ci.len();
        // Every element is written: no zeroing pass first.
        let mut out = self.pool.for_overwrite(n_edges * cols);
        let pv = &self.nodes[geo.positions.id].value;
        let cv = geo
            .periodic
            .as_ref()
            .map(|p| &self.nodes[p.cell.id].value[..]);
        let fill = |(b, o): (usize, &mut [T])| {
            for (k, o) in o.chunks_exact_mut(cols).enumerate() {
                row(pv, cv, b * NORM_ROWS + k, o);
            }
        };
        if out.len() >= PAR_THRESHOLD {
            out.par_chunks_mut(NORM_ROWS * cols)
                .enumerate()
                .for_each(fill);
        } else {
            out.chunks_mut(NORM_ROWS * cols).enumerate().for_each(fill);
        }
        let spec = NodeSpec {
            op: op.into(),
            rows: n_edges,
            cols,
            domain: RowDomain::Edge,
            fresh: true,
            replicated: false,
        };
        (out, spec)
    }

    /// What [`Graph::edge_vectors`] and [`Graph::edge_lengths`] share: the
    /// positions after the halo handling, checked indices and shifts.
    fn edge_geometry(
        &mut self,
        op: &str,
        positions: Tensor,
        center: Index,
        neighbor: Index,
        periodic: Option<PeriodicShifts>,
    ) -> Result<EdgeGeometry, EngineError> {
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
                op,
                "center and neighbor indices differ in length",
            ));
        }
        let (rows, cols) = self.shape(positions);
        for idx in [center, neighbor] {
            let ix = &self.indices[idx.id];
            if cols != 3 || ix.target_rows != rows {
                return Err(EngineError::shape(
                    op,
                    format!(
                        "index `{}` points into {} rows but the positions are {rows}×{cols}",
                        ix.role, ix.target_rows
                    ),
                ));
            }
        }
        let periodic = match periodic {
            None => None,
            Some(PeriodicShifts {
                cell,
                shifts,
                edge_system,
            }) => {
                if shifts.len() != ci.len() || self.indices[edge_system.id].values.len() != ci.len()
                {
                    return Err(EngineError::shape(
                        op,
                        "shifts / edge systems differ in length from the edges",
                    ));
                }
                // Kept once per graph however many ops read it (`Graph::edges`
                // has usually kept it already).
                if !self.shift_arrays.iter().any(|s| Arc::ptr_eq(s, &shifts)) {
                    self.shift_arrays.push(shifts.clone());
                }
                Some(EdgeShifts {
                    cell,
                    shifts,
                    edge_system,
                    systems: self.indices[edge_system.id].values.clone(),
                })
            }
        };
        // Exact values only for the whole geometry: positions, and the cell
        // when periodic (a halo refresh makes a tensor without them).
        let exact = self.exact_values_of(positions).and_then(|pos| {
            let cell = match &periodic {
                Some(p) => Some(self.exact_values_of(p.cell)?),
                None => None,
            };
            Some(ExactGeometry {
                positions: pos,
                cell,
            })
        });
        Ok(EdgeGeometry {
            positions,
            handler,
            ci,
            ni,
            periodic,
            exact,
        })
    }

    /// Host copies of an edge op's positions and cell (see
    /// [`Graph::ensure_host`]).
    fn geometry_to_host(&mut self, geo: &EdgeGeometry) -> Result<(), EngineError> {
        self.ensure_host(&[geo.positions])?;
        if let Some(p) = &geo.periodic {
            self.ensure_host(&[p.cell])?;
        }
        Ok(())
    }

    /// Euclidean norm of each row (rows×cols → rows×1).
    pub fn row_norm(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.ensure_host(&[x])?;
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
