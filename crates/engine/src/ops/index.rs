//! Ops that move rows between domains — the ones with a distributed meaning:
//! gather (Atom → Edge), scatter-add (Edge → Atom), system reductions
//! (Atom → System), and the halo / all-reduce steps their handlers insert.

use crate::graph::{Csr, IndexNode, NodeSpec};
use crate::ops::{index_scatter_in_source_order, PAR_THRESHOLD};
use crate::{DataMut, Distributor, EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use ddmlip_spec::{GatherMode, ScatterMode};
use rayon::prelude::*;
use std::sync::Arc;

pub(crate) fn gather_rows<T: Scalar>(x: &[T], cols: usize, idx: &[u32], out: &mut [T]) {
    if cols == 0 {
        return;
    }
    let body = |(r, o): (usize, &mut [T])| {
        let s = idx[r] as usize * cols;
        o.copy_from_slice(&x[s..s + cols]);
    };
    let pieces = crate::helpers::pieces_for(out.len());
    if pieces > 1 {
        crate::helpers::run_row_parts(out, cols, pieces, &|r, o| body((r, o)));
    } else if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(cols).enumerate().for_each(body);
    } else {
        out.chunks_mut(cols).enumerate().for_each(body);
    }
}

/// The handler name a scatter onto Atom rows fires under `mode`.
pub(crate) fn scatter_handler(mode: ScatterMode) -> &'static str {
    match mode {
        ScatterMode::HaloCorrection => "scatter:halo_correction",
        ScatterMode::Refresh => "scatter:refresh",
        ScatterMode::Local => "scatter:local",
    }
}

/// The inverse map a scatter of `len` source elements through `node`
/// needs: `None` when it runs in source order on the calling thread (see
/// [`index_scatter_in_source_order`]); `spare` supplies recycled memory.
pub(crate) fn scatter_map(
    node: &IndexNode,
    len: usize,
    spare: impl FnOnce() -> Vec<u32>,
) -> Option<Arc<Csr>> {
    (!index_scatter_in_source_order(len)).then(|| node.csr(spare))
}

/// `out[t] += Σ_{s: values[s] = t} src[s]`, summed in ascending source order
/// so that results do not depend on the thread count: straight through
/// `values` when `csr` is `None`, else race-free through the inverse map.
pub(crate) fn scatter_rows<T: Scalar>(
    src: &[T],
    cols: usize,
    values: &[u32],
    csr: Option<&Csr>,
    out: &mut [T],
) {
    if cols == 0 {
        return;
    }
    let Some(csr) = csr else {
        for (row, &t) in src.chunks_exact(cols).zip(values) {
            let o = &mut out[t as usize * cols..(t as usize + 1) * cols];
            for (a, &b) in o.iter_mut().zip(row) {
                *a += b;
            }
        }
        return;
    };
    let target = |(t, o): (usize, &mut [T])| {
        csr.for_each_source(t, |s| {
            let row = &src[s * cols..(s + 1) * cols];
            for (a, &b) in o.iter_mut().zip(row) {
                *a += b;
            }
        });
    };
    // Pieces by the work (the sources), split over target rows.
    let pieces = crate::helpers::pieces_for(src.len());
    if pieces > 1 {
        crate::helpers::run_row_parts(out, cols, pieces, &|t, o| target((t, o)));
    } else {
        out.par_chunks_mut(cols).enumerate().for_each(target);
    }
}

impl<T: Scalar> Graph<T> {
    fn check_index(&self, op: &str, x: Tensor, idx: Index) -> Result<(), EngineError> {
        let ix = &self.indices[idx.id];
        let n = &self.nodes[x.id];
        if ix.target_rows != n.rows {
            return Err(EngineError::shape(
                op,
                format!(
                    "index `{}` points into {} rows but the tensor has {} rows",
                    ix.role, ix.target_rows, n.rows
                ),
            ));
        }
        Ok(())
    }

    /// Rows `x[idx[r]]` for every entry r of `idx` (Atom → Edge, species → table, System → Atom).
    ///
    /// Distributed, on Atom rows: `halo_read` refreshes ghost rows first when
    /// they may be stale; `local` reads them as they are.
    pub fn gather(&mut self, x: Tensor, idx: Index) -> Result<Tensor, EngineError> {
        self.check_index("gather", x, idx)?;
        let mut x = x;
        let mut handler = None;
        if let Some(d) = &self.dist {
            if self.nodes[x.id].domain == RowDomain::Atom && self.nodes[x.id].rows == d.n_local() {
                match d.spec().policy.gather {
                    GatherMode::HaloRead => {
                        if !self.nodes[x.id].fresh {
                            x = self.halo_refresh(x, "gather:halo_read(refresh)")?;
                        }
                        handler = Some("gather:halo_read");
                    }
                    GatherMode::Local => handler = Some("gather:local"),
                }
            }
        }
        if let Some(backend) = self.device_for_op() {
            return self.gather_device(backend, x, idx, handler);
        }
        self.gather_local(x, idx, handler)
    }

    pub(crate) fn gather_local(
        &mut self,
        x: Tensor,
        idx: Index,
        handler: Option<&str>,
    ) -> Result<Tensor, EngineError> {
        self.ensure_host(&[x])?;
        self.check_live(&[x])?;
        let (_, cols) = self.shape(x);
        let ix = &self.indices[idx.id];
        let rows = ix.values.len();
        // Every row is copied whole.
        let mut out = self.pool.for_overwrite(rows * cols);
        gather_rows(&self.nodes[x.id].value, cols, &ix.values, &mut out);
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: "gather".into(),
            rows,
            cols,
            domain: ix.domain,
            fresh: true,
            replicated: nx.replicated
                && ix.domain != RowDomain::Atom
                && ix.domain != RowDomain::Edge,
        };
        // The backward scatters the output gradient: it reads no value.
        self.push_op_reading(
            spec,
            out,
            &[x],
            &[idx],
            handler,
            Box::new(move |ctx, g| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let node = ctx.index_node(idx);
                let csr = scatter_map(node, g.len(), || ctx.pool.take_indices());
                ctx.accumulate_with(x, |gx| {
                    scatter_rows(g, cols, &node.values, csr.as_deref(), gx)
                });
                Ok(())
            }),
            &[],
        )
    }

    /// Sums rows of `src` into the rows `idx` points at (Edge → Atom, Atom → System).
    ///
    /// Distributed, onto Atom rows, the spec's scatter mode applies:
    /// `halo_correction` (reverse-sum ghost partials to owners, then refresh),
    /// `refresh` (refresh ghosts from owners), or `local` (no exchange).
    pub fn scatter_add(&mut self, src: Tensor, idx: Index) -> Result<Tensor, EngineError> {
        let target = self.indices[idx.id].target;
        let target_rows = self.indices[idx.id].target_rows;
        let mode = match &self.dist {
            Some(d) if target == RowDomain::Atom && target_rows == d.n_local() => {
                Some(d.spec().policy.scatter)
            }
            _ => None,
        };
        let handler = mode.map(scatter_handler);
        let y = match self.device_for_op() {
            Some(backend) => {
                let landing = (handler, mode.is_none());
                self.scatter_device(backend, src, idx, "scatter_add", landing)?
            }
            None => self.scatter_local(src, idx, handler, mode.is_none())?,
        };
        match mode {
            Some(mode) => self.land_scatter(y, idx, mode),
            None => Ok(y),
        }
    }

    /// Lands `y`, this rank's local sums onto the Atom rows `idx` points
    /// at, as the scatter mode asks: `halo_correction` reverse-sums ghost
    /// partials to their owners (skipped when `idx` targets owned rows only:
    /// the ghost rows then hold nothing to add) and refreshes, `refresh`
    /// refreshes, `local` leaves the rows as they are.
    pub(crate) fn land_scatter(
        &mut self,
        y: Tensor,
        idx: Index,
        mode: ScatterMode,
    ) -> Result<Tensor, EngineError> {
        match mode {
            ScatterMode::HaloCorrection if self.targets_owned_rows_only(idx) => {
                self.halo_refresh(y, "halo:refresh")
            }
            ScatterMode::HaloCorrection => {
                let y = self.halo_reverse_sum(y, "halo:reverse_sum")?;
                self.halo_refresh(y, "halo:refresh")
            }
            ScatterMode::Refresh => self.halo_refresh(y, "halo:refresh"),
            ScatterMode::Local => Ok(y),
        }
    }

    fn scatter_local(
        &mut self,
        src: Tensor,
        idx: Index,
        handler: Option<&str>,
        fresh: bool,
    ) -> Result<Tensor, EngineError> {
        self.ensure_host(&[src])?;
        self.check_live(&[src])?;
        let (rows_src, cols) = self.shape(src);
        let ix = &self.indices[idx.id];
        if ix.values.len() != rows_src {
            return Err(EngineError::shape(
                "scatter_add",
                format!(
                    "index `{}` has {} entries but the source has {} rows",
                    ix.role,
                    ix.values.len(),
                    rows_src
                ),
            ));
        }
        let rows = ix.target_rows;
        let domain = ix.target;
        let csr = scatter_map(ix, rows_src * cols, || self.pool.take_indices());
        let mut out = self.pool.zeroed(rows * cols);
        scatter_rows(
            &self.nodes[src.id].value,
            cols,
            &ix.values,
            csr.as_deref(),
            &mut out,
        );
        let spec = NodeSpec {
            op: "scatter_add".into(),
            rows,
            cols,
            domain,
            fresh,
            replicated: false,
        };
        // The backward gathers the output gradient: it reads no value.
        self.push_op_reading(
            spec,
            out,
            &[src],
            &[idx],
            handler,
            Box::new(move |ctx, g| {
                if !ctx.wants(src) {
                    return Ok(());
                }
                let ids = ctx.index(idx);
                ctx.accumulate_map(src, |i| g[ids[i / cols] as usize * cols + i % cols]);
                Ok(())
            }),
            &[],
        )
    }

    /// Per-system sums of Atom rows (`idx`: atom → system).
    ///
    /// Distributed with `system_reductions` on: sum owned rows only, then
    /// all-reduce, so every rank holds the full (replicated) sum. Off: sum
    /// every local row (ghosts included) — what a halo-unaware model does.
    pub fn segment_sum(&mut self, x: Tensor, idx: Index) -> Result<Tensor, EngineError> {
        self.check_live(&[x])?;
        self.check_index_rows("segment_sum", x, idx)?;
        // Decomposed, the owned rows' sums meet in an all-reduce on the host.
        if let (Some(backend), None) = (self.device_for_op(), &self.dist) {
            return self.scatter_device(backend, x, idx, "segment_sum", (None, true));
        }
        self.ensure_host(&[x])?;
        let (reduce, limit) = match &self.dist {
            Some(d) if self.nodes[x.id].rows == d.n_local() => {
                if d.spec().system_reductions {
                    (true, d.n_owned())
                } else {
                    (false, d.n_local())
                }
            }
            _ => (false, self.nodes[x.id].rows),
        };
        let handler = if self.dist.is_some() {
            Some(if reduce {
                "reduce:system(owned+all_reduce)"
            } else {
                "reduce:system(local)"
            })
        } else {
            None
        };
        let (_, cols) = self.shape(x);
        let ix = &self.indices[idx.id];
        let out_rows = ix.target_rows;
        let mut out = self.pool.zeroed(out_rows * cols);
        {
            // Sums over many rows (a system's energy over its atoms) are
            // accumulated in f64 and rounded once: in f32 a running sum of
            // thousands of eV-sized terms would lose several ulps of the
            // total. For f64 the additions are the same as in place.
            let xv = &self.nodes[x.id].value;
            let mut acc = vec![0.0f64; out_rows * cols];
            for (r, &s) in ix.values.iter().enumerate().take(limit) {
                let o = &mut acc[s as usize * cols..(s as usize + 1) * cols];
                for (a, &b) in o.iter_mut().zip(&xv[r * cols..(r + 1) * cols]) {
                    *a += b.to_f64_lossless();
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                *o = T::from_f64(a);
            }
        }
        let spec = NodeSpec {
            op: "segment_sum".into(),
            rows: out_rows,
            cols,
            domain: ix.target,
            fresh: true,
            replicated: false,
        };
        let y = self.push_op(
            spec,
            out,
            &[x],
            &[idx],
            handler,
            Box::new(move |ctx, g| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let ids = ctx.index(idx);
                ctx.accumulate_with(x, |gx| {
                    for (r, &s) in ids.iter().enumerate().take(limit) {
                        let src = &g[s as usize * cols..(s as usize + 1) * cols];
                        for (a, &b) in gx[r * cols..(r + 1) * cols].iter_mut().zip(src) {
                            *a += b;
                        }
                    }
                });
                Ok(())
            }),
        )?;
        if reduce {
            self.all_reduce(y, "reduce:all_reduce")
        } else {
            Ok(y)
        }
    }

    fn check_index_rows(&self, op: &str, x: Tensor, idx: Index) -> Result<(), EngineError> {
        let ix = &self.indices[idx.id];
        if ix.values.len() != self.nodes[x.id].rows {
            return Err(EngineError::shape(
                op,
                format!(
                    "index `{}` has {} entries but the tensor has {} rows",
                    ix.role,
                    ix.values.len(),
                    self.nodes[x.id].rows
                ),
            ));
        }
        Ok(())
    }

    /// Overwrites ghost rows with their owners' rows. Adjoint: reverse-sum.
    pub(crate) fn halo_refresh(&mut self, x: Tensor, handler: &str) -> Result<Tensor, EngineError> {
        self.collective(x, Collective::Refresh, handler)
    }

    /// Adds ghost rows into their owners and zeroes them. Adjoint: refresh.
    pub(crate) fn halo_reverse_sum(
        &mut self,
        x: Tensor,
        handler: &str,
    ) -> Result<Tensor, EngineError> {
        self.collective(x, Collective::ReverseSum, handler)
    }

    /// Element-wise sum over ranks (replicated result). Adjoint: all-reduce of
    /// the gradient — the transpose of the map (x₁…x_P) ↦ (Σx, …, Σx).
    pub(crate) fn all_reduce(&mut self, x: Tensor, handler: &str) -> Result<Tensor, EngineError> {
        self.collective(x, Collective::AllReduce, handler)
    }

    /// Records one communication step as a node whose backward runs the
    /// step's transpose; every rank runs both (requires_grad is rank-independent).
    fn collective(
        &mut self,
        x: Tensor,
        step: Collective,
        handler: &str,
    ) -> Result<Tensor, EngineError> {
        self.ensure_host(&[x])?;
        let (rows, cols) = self.shape(x);
        let mut v = self.pool.for_overwrite(self.nodes[x.id].value.len());
        v.copy_from_slice(&self.nodes[x.id].value);
        let d = self
            .dist
            .as_deref_mut()
            .ok_or_else(|| EngineError::shape(step.op(), "not distributed"))?;
        let deferred =
            matches!(step, Collective::AllReduce) && self.defer_all_reduces && self.trace.is_none();
        if !deferred {
            step.apply(d, T::data_mut(&mut v), cols)?;
        }
        let (domain, fresh, replicated) = match step {
            Collective::Refresh => (RowDomain::Atom, true, false),
            Collective::ReverseSum => (RowDomain::Atom, false, false),
            Collective::AllReduce => (self.nodes[x.id].domain, true, true),
        };
        let spec = NodeSpec {
            op: step.op().into(),
            rows,
            cols,
            domain,
            fresh,
            replicated,
        };
        let adjoint = step.adjoint();
        let me = self.nodes.len();
        let y = self.push_op(
            spec,
            v,
            &[x],
            &[],
            Some(handler),
            Box::new(move |ctx, g| {
                let mut gx = ctx.copy_of(g);
                // The seed of a replicated output, on a sum that was never
                // consumed: already the gradient of every rank's partial.
                if ctx.replicated_root != Some(me) {
                    ctx.count(adjoint.adjoint_handler());
                    adjoint.apply(ctx.dist(adjoint.op())?, T::data_mut(&mut gx), cols)?;
                }
                ctx.accumulate(x, gx);
                Ok(())
            }),
        )?;
        if deferred {
            self.pending.push(y.id);
        }
        Ok(y)
    }

    /// Public all-reduce for models that need a global sum of a per-rank
    /// partial (a no-op copy in a single process).
    pub fn all_reduce_sum(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        if self.dist.is_some() {
            self.all_reduce(x, "reduce:all_reduce(explicit)")
        } else {
            Ok(x)
        }
    }
}

/// The communication steps of the distributed handlers, as linear maps on a
/// rank's rows; each one's adjoint is another step.
#[derive(Debug, Clone, Copy)]
enum Collective {
    /// Owners → ghosts (overwrite).
    Refresh,
    /// Ghosts → owners (add), ghosts zeroed.
    ReverseSum,
    /// Sum over ranks.
    AllReduce,
}

impl Collective {
    fn op(self) -> &'static str {
        match self {
            Collective::Refresh => "halo_refresh",
            Collective::ReverseSum => "halo_reverse_sum",
            Collective::AllReduce => "all_reduce",
        }
    }

    /// The transpose: refresh ↔ reverse-sum, all-reduce ↔ all-reduce.
    fn adjoint(self) -> Self {
        match self {
            Collective::Refresh => Collective::ReverseSum,
            Collective::ReverseSum => Collective::Refresh,
            Collective::AllReduce => Collective::AllReduce,
        }
    }

    /// Handler name counted when this step runs as an adjoint.
    fn adjoint_handler(self) -> &'static str {
        match self {
            Collective::Refresh => "halo:refresh(adjoint)",
            Collective::ReverseSum => "halo:reverse_sum(adjoint)",
            Collective::AllReduce => "reduce:all_reduce(adjoint)",
        }
    }

    fn apply(
        self,
        d: &mut dyn Distributor,
        data: DataMut<'_>,
        cols: usize,
    ) -> Result<(), EngineError> {
        match self {
            Collective::Refresh => d.refresh(data, cols),
            Collective::ReverseSum => d.reverse_sum(data, cols),
            Collective::AllReduce => d.all_reduce_sum(data),
        }
    }
}
