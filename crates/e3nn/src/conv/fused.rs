//! Radial MLP (or its table) fused with the convolution.
//!
//! The per-edge weights `w = radial(emb)` (E × dim_w, up to ~1000 values per
//! edge) dominate memory if materialised for all edges. The fused kernels
//! split the rows into blocks of about `FUSED_BLOCK_EDGES` edges
//! (`TABLE_BLOCK_EDGES` with a radial table; receiver rows in the forward,
//! sender rows in the backward), compute the weights of just that block's
//! edges into per-task scratch, and consume them at once. Each block writes
//! only its own rows (and its own range of sender-CSR positions), so the
//! results are race-free and independent of scheduling.

use super::*;
use crate::radial_table::{RadialTable, LENGTH_COLUMNS};
use std::borrow::Cow;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

/// Target number of edges per fused block with a radial MLP (rows of the
/// block's MLP GEMMs).
const FUSED_BLOCK_EDGES: usize = 256;
/// The same with a radial table, which needs no GEMM rows: a smaller block
/// keeps its weights (edges × dim_w) in a nearer cache between being
/// written and read, and its per-task scratch small.
const TABLE_BLOCK_EDGES: usize = 64;

impl<T> EdgeRadial<'_, T> {
    /// Target number of edges per block of the fused kernels.
    fn block_edges(&self) -> usize {
        match self {
            Self::Network(_) => FUSED_BLOCK_EDGES,
            Self::Table(_) => TABLE_BLOCK_EDGES,
        }
    }
}

/// Splits rows into consecutive blocks `(row0, row1)` of about
/// `block_edges` CSR positions each (a single row may exceed it).
fn row_blocks(offsets: &[usize], block_edges: usize) -> Vec<(usize, usize)> {
    let n = offsets.len() - 1;
    let mut blocks = Vec::new();
    let mut r0 = 0;
    while r0 < n {
        let mut r1 = r0 + 1;
        while r1 < n && offsets[r1 + 1] - offsets[r0] <= block_edges {
            r1 += 1;
        }
        blocks.push((r0, r1));
        r0 = r1;
    }
    blocks
}

/// Splits `buf` into consecutive pieces of `width × (b.1 − b.0)` elements,
/// where `b` runs over `bounds` (which must tile `0..buf.len()/width`).
fn split_blocks<T>(
    mut buf: &mut [T],
    bounds: impl Iterator<Item = (usize, usize)>,
    width: usize,
) -> Vec<&mut [T]> {
    let mut out = Vec::new();
    for (a, b) in bounds {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut((b - a) * width);
        out.push(head);
        buf = tail;
    }
    out
}

/// Scratch lent by a call's pool to one rayon task and handed back when the
/// task ends. Rayon runs `for_each_init`'s init once per task, and splits a
/// loop into more tasks the more threads steal work, so scratch made per task
/// (megabytes: the block's per-edge weights and their gradients, zeroed
/// and often freshly mapped) grew with the thread count; from a pool, a call
/// makes one per task that runs at the same time.
struct Pooled<'a, S> {
    item: Option<S>,
    pool: &'a Mutex<Vec<S>>,
}

impl<'a, S> Pooled<'a, S> {
    fn take(pool: &'a Mutex<Vec<S>>, make: impl FnOnce() -> S) -> Self {
        let spare = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        Self {
            item: Some(spare.unwrap_or_else(make)),
            pool,
        }
    }
}

impl<S> Deref for Pooled<'_, S> {
    type Target = S;
    fn deref(&self) -> &S {
        self.item
            .as_ref()
            .expect("pooled scratch is present until dropped")
    }
}

impl<S> DerefMut for Pooled<'_, S> {
    fn deref_mut(&mut self) -> &mut S {
        self.item
            .as_mut()
            .expect("pooled scratch is present until dropped")
    }
}

impl<S> Drop for Pooled<'_, S> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.pool
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(item);
        }
    }
}

/// Where a layer's per-edge weights come from: the radial MLP on each
/// edge's embedding (E × n_basis inputs), or its table on each edge's
/// length (E × [`LENGTH_COLUMNS`] inputs, see [`RadialTable`]).
#[derive(Clone, Copy, Debug)]
pub enum EdgeRadial<'a, T> {
    /// `w = mlp(emb)`, the edge input being the radial embedding.
    Network(&'a RadialMlp<T>),
    /// `w = table(r)`, the edge input being the length (`hi`, `lo`).
    Table(&'a RadialTable<T>),
}

impl<'a, T> From<&'a RadialMlp<T>> for EdgeRadial<'a, T> {
    fn from(m: &'a RadialMlp<T>) -> Self {
        Self::Network(m)
    }
}

impl<'a, T> From<&'a RadialTable<T>> for EdgeRadial<'a, T> {
    fn from(t: &'a RadialTable<T>) -> Self {
        Self::Table(t)
    }
}

impl<T: Real> EdgeRadial<'_, T> {
    /// Columns of the edge input.
    pub fn dim_in(&self) -> usize {
        match self {
            Self::Network(m) => m.dim_in(),
            Self::Table(_) => LENGTH_COLUMNS,
        }
    }

    /// Weights per edge.
    pub fn dim_out(&self) -> usize {
        match self {
            Self::Network(m) => m.dim_out(),
            Self::Table(t) => t.dim_out(),
        }
    }
}

#[inline(always)]
fn table_fwd<T: Real>(table: &RadialTable<T>, r: &[T], out: &mut [T]) {
    table.forward_rows(r, out)
}

#[inline(always)]
fn table_fwd_slope<T: Real>(table: &RadialTable<T>, r: &[T], out: &mut [T], slope: &mut [T]) {
    table.forward_rows_with_slope(r, out, slope)
}

#[inline(always)]
fn table_bwd_slope<T: Real>(table: &RadialTable<T>, r: &[T], g: &[T], slope: &[T], gr: &mut [T]) {
    table.backward_rows_from_slope(r, g, slope, gr)
}

multiversion!(table_fwd_mv, table_fwd_avx512, table_fwd_avx2, table_fwd, (
    table: &RadialTable<T>, r: &[T], out: &mut [T]
));
multiversion!(table_fwd_slope_mv, table_fwd_slope_avx512, table_fwd_slope_avx2, table_fwd_slope, (
    table: &RadialTable<T>, r: &[T], out: &mut [T], slope: &mut [T]
));
multiversion!(table_bwd_slope_mv, table_bwd_slope_avx512, table_bwd_slope_avx2, table_bwd_slope, (
    table: &RadialTable<T>, r: &[T], g: &[T], slope: &[T], gr: &mut [T]
));

/// Per-task scratch of the fused kernels.
struct FusedScratch<T> {
    conv: Scratch<T>,
    /// The MLP's hidden layers (`None` for a table).
    mlp: Option<MlpScratch<T>>,
    /// Gathered edge inputs (embeddings or lengths) of the block's edges.
    emb: Vec<T>,
    /// The block's per-edge weights.
    w: Vec<T>,
    /// Their gradient (the backward; empty in the forward).
    gw: Vec<T>,
    /// The weights' slopes within their table intervals (the backward
    /// with a table; empty otherwise).
    slope: Vec<T>,
}

/// Which pass a [`FusedScratch`] serves.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Forward,
    Backward,
}

fn fused_scratch<T: Real>(
    paths: &ConvPaths<T>,
    radial: EdgeRadial<'_, T>,
    row: usize,
    max_edges: usize,
    pass: Pass,
) -> FusedScratch<T> {
    let per_block = max_edges * paths.dim_w;
    let backward = if pass == Pass::Backward { per_block } else { 0 };
    FusedScratch {
        conv: paths.scratch(row),
        mlp: match radial {
            EdgeRadial::Network(m) => Some(m.scratch(max_edges)),
            EdgeRadial::Table(_) => None,
        },
        emb: vec![T::ZERO; max_edges * radial.dim_in()],
        w: vec![T::ZERO; per_block],
        gw: vec![T::ZERO; backward],
        slope: match radial {
            EdgeRadial::Table(_) => vec![T::ZERO; backward],
            EdgeRadial::Network(_) => Vec::new(),
        },
    }
}

/// Largest number of CSR positions in one block.
fn max_block_edges(offsets: &[usize], blocks: &[(usize, usize)]) -> usize {
    blocks
        .iter()
        .map(|&(a, b)| offsets[b] - offsets[a])
        .max()
        .unwrap_or(0)
}

/// Weights of a block's `edges` (ids, in CSR order) into `sc.w`
/// (their inputs gathered into `sc.emb`); in the backward with a table,
/// their slopes into `sc.slope` too, for [`block_weights_backward`].
fn block_weights<T: Real>(
    isa: Isa,
    radial: EdgeRadial<'_, T>,
    edges: &[u32],
    emb: &[T],
    pass: Pass,
    sc: &mut FusedScratch<T>,
) {
    let (nb, rows) = (radial.dim_in(), edges.len());
    for (dst, &e) in sc.emb.chunks_exact_mut(nb.max(1)).zip(edges) {
        let e = e as usize;
        dst[..nb].copy_from_slice(&emb[e * nb..(e + 1) * nb]);
    }
    match (radial, sc.mlp.as_mut()) {
        (EdgeRadial::Network(m), Some(s)) => m.forward_block(&sc.emb, rows, s, &mut sc.w),
        (EdgeRadial::Table(t), _) => {
            let (r, n) = (&sc.emb[..rows * LENGTH_COLUMNS], rows * t.dim_out());
            match pass {
                Pass::Forward => table_fwd_mv(isa, t, r, &mut sc.w[..n]),
                Pass::Backward => table_fwd_slope_mv(isa, t, r, &mut sc.w[..n], &mut sc.slope[..n]),
            }
        }
        (EdgeRadial::Network(_), None) => unreachable!("a network's scratch has its MLP buffers"),
    }
}

/// Gradient of the block's edge inputs (`gemb`, rows × dim_in) from the
/// weights' gradient in `sc.gw`, after [`block_weights`] on the same block
/// in the backward pass.
fn block_weights_backward<T: Real>(
    isa: Isa,
    radial: EdgeRadial<'_, T>,
    rows: usize,
    sc: &mut FusedScratch<T>,
    gemb: &mut [T],
) {
    match (radial, sc.mlp.as_mut()) {
        (EdgeRadial::Network(m), Some(s)) => m.backward_block(rows, s, &sc.gw, gemb),
        (EdgeRadial::Table(t), _) => {
            let n = rows * t.dim_out();
            table_bwd_slope_mv(
                isa,
                t,
                &sc.emb[..rows * LENGTH_COLUMNS],
                &sc.gw[..n],
                &sc.slope[..n],
                &mut gemb[..rows * LENGTH_COLUMNS],
            )
        }
        (EdgeRadial::Network(_), None) => unreachable!("a network's scratch has its MLP buffers"),
    }
}

/// Backward of sender row `j` with the weights of its edges in `w` (rows by
/// sender-CSR position minus `p0`): the feature gradient `gh_row`, the weight
/// gradients into `gw` and the SH gradients into `gy` (both by position − p0).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fused_bwd_sender_row<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    ht: &[T],
    sh: &[T],
    w: &[T],
    gat: &[T],
    inv_den: T,
    j: usize,
    p0: usize,
    gh_row: &mut [T],
    gw: &mut [T],
    gy: &mut [T],
    sc: &mut Scratch<T>,
) {
    let (di, dw, ds, dm) = (paths.dim_in, paths.dim_w, paths.dim_sh(), paths.dim_msg);
    let hj = &ht[j * di..(j + 1) * di];
    sc.row.fill(T::ZERO);
    for pos in graph.neighbor_offsets[j]..graph.neighbor_offsets[j + 1] {
        let e = graph.neighbor_edges[pos] as usize;
        let i = graph.centers[e] as usize;
        let r = pos - p0;
        let (we, gi) = (&w[r * dw..(r + 1) * dw], &gat[i * dm..(i + 1) * dm]);
        let gwe = &mut gw[r * dw..(r + 1) * dw];
        paths.filters(&sh[e * ds..(e + 1) * ds], inv_den, &mut sc.t);
        for p in &paths.paths {
            let (tp, wp) = (
                &sc.t[p.t_off..p.t_off + p.d1 * p.d3],
                &we[p.w_off..p.w_off + p.mul],
            );
            let gp = &gi[p.out_off..p.out_off + p.mul * p.d3];
            dispatch!(
                p.d1,
                p.d3,
                bwd_kernel_1pass,
                &hj[p.in_off..p.in_off + p.mul * p.d1],
                tp,
                wp,
                gp,
                &mut gwe[p.w_off..p.w_off + p.mul],
                &mut sc.gtv[p.t_off..p.t_off + p.d1 * p.d3],
                &mut sc.row[p.in_off..p.in_off + p.mul * p.d1]
            );
        }
        paths.filters_adjoint_lanes(&sc.gtv, inv_den, &mut gy[r * ds..(r + 1) * ds]);
    }
    gh_row.fill(T::ZERO);
    transpose_ranges(&paths.in_ranges, &sc.row, gh_row, false);
}

multiversion!(fused_bwd_sender_row_mv, fused_bwd_sender_row_avx512, fused_bwd_sender_row_avx2, fused_bwd_sender_row, (
    paths: &ConvPaths<T>, graph: &ConvGraph, ht: &[T], sh: &[T], w: &[T], gat: &[T], inv_den: T,
    j: usize, p0: usize, gh_row: &mut [T], gw: &mut [T], gy: &mut [T], sc: &mut Scratch<T>
));

fn check_fused<T: Real>(
    paths: &ConvPaths<T>,
    radial: EdgeRadial<'_, T>,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    denominator: f64,
) -> Result<T, E3nnError> {
    if radial.dim_out() != paths.dim_w {
        return Err(E3nnError::Config(format!(
            "the radial network gives {} weights per edge, the TP paths need {}",
            radial.dim_out(),
            paths.dim_w
        )));
    }
    let (n, ne) = (graph.n_rows, graph.n_edges());
    check_len("conv h", n * paths.dim_in, h.len())?;
    check_len("conv sh", ne * paths.dim_sh(), sh.len())?;
    check_len("conv emb", ne * radial.dim_in(), emb.len())?;
    if !(denominator.is_finite() && denominator != 0.0) {
        return Err(E3nnError::Config(format!(
            "conv denominator must be finite and non-zero, got {denominator}"
        )));
    }
    Ok(T::from_f64(1.0 / denominator))
}

/// [`conv_forward`] with `w = radial.forward(emb)` computed block by block
/// and never stored for all edges: `out` (n_rows × dim_msg, overwritten),
/// `h` n_rows × dim_in, `emb` E × radial.dim_in(), `sh` E × dim_sh.
/// `radial.dim_out()` must equal `paths.dim_w()`.
#[allow(clippy::too_many_arguments)]
pub fn radial_conv_forward<'r, T: Real>(
    paths: &ConvPaths<T>,
    radial: impl Into<EdgeRadial<'r, T>>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    out: &mut [T],
) -> Result<(), E3nnError> {
    let layout = BlockLayout::CopyMajor;
    radial_conv_forward_with(paths, radial, denominator, graph, h, emb, sh, layout, out)
}

/// [`radial_conv_forward`] writing each message row's blocks in
/// `out_layout`. [`BlockLayout::ComponentMajor`] is the kernels' own
/// layout (no transposition of the rows), component-major by the parts
/// [`ConvPaths::out_blocks`], which a Linear reads as they are where
/// [`ConvPaths::tiles_blocks_of`] its input irreps. The same values as
/// [`radial_conv_forward`], bit for bit, moved.
#[allow(clippy::too_many_arguments)]
pub fn radial_conv_forward_with<'r, T: Real>(
    paths: &ConvPaths<T>,
    radial: impl Into<EdgeRadial<'r, T>>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    out_layout: BlockLayout,
    out: &mut [T],
) -> Result<(), E3nnError> {
    let isa = Isa::detect();
    radial_conv_forward_on(
        isa,
        paths,
        radial.into(),
        denominator,
        graph,
        h,
        emb,
        sh,
        out_layout,
        out,
    )
}

/// [`radial_conv_forward_with`] with the kernel copy for `isa` (which the
/// running CPU must support).
#[allow(clippy::too_many_arguments)]
fn radial_conv_forward_on<T: Real>(
    isa: Isa,
    paths: &ConvPaths<T>,
    radial: EdgeRadial<'_, T>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    out_layout: BlockLayout,
    out: &mut [T],
) -> Result<(), E3nnError> {
    let inv_den = check_fused(paths, radial, graph, h, emb, sh, denominator)?;
    let dm = paths.dim_msg;
    check_len("conv out", graph.n_rows * dm, out.len())?;
    if dm == 0 {
        return Ok(());
    }
    let ht = rows_to_cm(&paths.in_ranges, h, paths.dim_in);
    let blocks = row_blocks(&graph.center_offsets, radial.block_edges());
    let max_edges = max_block_edges(&graph.center_offsets, &blocks);
    let pieces = split_blocks(out, blocks.iter().copied(), dm);
    let pool = Mutex::new(Vec::new());
    blocks.into_par_iter().zip(pieces).for_each_init(
        || {
            Pooled::take(&pool, || {
                fused_scratch(paths, radial, dm, max_edges, Pass::Forward)
            })
        },
        |sc, ((r0, r1), piece)| {
            let sc = &mut **sc;
            let (p0, p1) = (graph.center_offsets[r0], graph.center_offsets[r1]);
            let edges = &graph.center_edges[p0..p1];
            block_weights(isa, radial, edges, emb, Pass::Forward, sc);
            for (i, row) in (r0..r1).zip(piece.chunks_exact_mut(dm)) {
                fwd_row_mv(
                    isa,
                    paths,
                    graph,
                    &ht,
                    sh,
                    &sc.w,
                    Some(p0),
                    inv_den,
                    i,
                    out_layout,
                    row,
                    &mut sc.conv,
                );
            }
        },
    );
    Ok(())
}

/// Backward of [`radial_conv_forward`] from `grad_a` (n_rows × dim_msg).
/// Overwrites `grad_h` (n_rows × dim_in), `grad_emb` (E × radial.dim_in())
/// and `grad_sh` (E × dim_sh). The weights are recomputed block by block.
#[allow(clippy::too_many_arguments)]
pub fn radial_conv_backward<'r, T: Real>(
    paths: &ConvPaths<T>,
    radial: impl Into<EdgeRadial<'r, T>>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    grad_a: &[T],
    grad_h: &mut [T],
    grad_emb: &mut [T],
    grad_sh: &mut [T],
) -> Result<(), E3nnError> {
    radial_conv_backward_with(
        paths,
        radial,
        denominator,
        graph,
        h,
        emb,
        sh,
        grad_a,
        BlockLayout::CopyMajor,
        grad_h,
        grad_emb,
        grad_sh,
    )
}

/// [`radial_conv_backward`] from a message gradient whose rows' blocks are
/// in `grad_a_layout` (as [`radial_conv_forward_with`] wrote the message):
/// in [`BlockLayout::ComponentMajor`] the kernels read it as it is, with no
/// transposed copy (at 8,000 atoms of SevenNet-0, 100 MB per layer). The
/// same gradients as [`radial_conv_backward`] from the same values, bit
/// for bit.
#[allow(clippy::too_many_arguments)]
pub fn radial_conv_backward_with<'r, T: Real>(
    paths: &ConvPaths<T>,
    radial: impl Into<EdgeRadial<'r, T>>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    grad_a: &[T],
    grad_a_layout: BlockLayout,
    grad_h: &mut [T],
    grad_emb: &mut [T],
    grad_sh: &mut [T],
) -> Result<(), E3nnError> {
    let isa = Isa::detect();
    radial_conv_backward_on(
        isa,
        paths,
        radial.into(),
        denominator,
        graph,
        h,
        emb,
        sh,
        grad_a,
        grad_a_layout,
        grad_h,
        grad_emb,
        grad_sh,
    )
}

/// [`radial_conv_backward_with`] with the kernel copy for `isa` (which the
/// running CPU must support).
#[allow(clippy::too_many_arguments)]
fn radial_conv_backward_on<T: Real>(
    isa: Isa,
    paths: &ConvPaths<T>,
    radial: EdgeRadial<'_, T>,
    denominator: f64,
    graph: &ConvGraph,
    h: &[T],
    emb: &[T],
    sh: &[T],
    grad_a: &[T],
    grad_a_layout: BlockLayout,
    grad_h: &mut [T],
    grad_emb: &mut [T],
    grad_sh: &mut [T],
) -> Result<(), E3nnError> {
    let inv_den = check_fused(paths, radial, graph, h, emb, sh, denominator)?;
    let (n, ne) = (graph.n_rows, graph.n_edges());
    let (dm, di, ds, nb) = (paths.dim_msg, paths.dim_in, paths.dim_sh(), radial.dim_in());
    check_len("conv grad_a", n * dm, grad_a.len())?;
    check_len("conv grad_h", n * di, grad_h.len())?;
    check_len("conv grad_emb", ne * nb, grad_emb.len())?;
    check_len("conv grad_sh", ne * ds, grad_sh.len())?;
    let gat: Cow<[T]> = match grad_a_layout {
        BlockLayout::ComponentMajor => Cow::Borrowed(grad_a),
        BlockLayout::CopyMajor => Cow::Owned(rows_to_cm(&paths.out_ranges, grad_a, dm)),
    };
    let ht = rows_to_cm(&paths.in_ranges, h, di);
    // Edge gradients by sender-CSR position, so that each block's are contiguous.
    let mut gsh_pos = crate::work::zeroed(ne * ds);
    let mut gemb_pos = crate::work::zeroed(ne * nb);
    let blocks = row_blocks(&graph.neighbor_offsets, radial.block_edges());
    let max_edges = max_block_edges(&graph.neighbor_offsets, &blocks);
    let off = &graph.neighbor_offsets;
    let edge_bounds = || blocks.iter().map(|&(a, b)| (off[a], off[b]));
    let gh_pieces = split_blocks(grad_h, blocks.iter().copied(), di);
    let gsh_pieces = split_blocks(&mut gsh_pos, edge_bounds(), ds);
    let gemb_pieces = split_blocks(&mut gemb_pos, edge_bounds(), nb);
    let pool = Mutex::new(Vec::new());
    blocks
        .par_iter()
        .zip(gh_pieces)
        .zip(gsh_pieces)
        .zip(gemb_pieces)
        .for_each_init(
            || {
                Pooled::take(&pool, || {
                    fused_scratch(paths, radial, di, max_edges, Pass::Backward)
                })
            },
            |sc, (((&(r0, r1), gh), gy), gemb)| {
                let sc = &mut **sc;
                let (p0, p1) = (off[r0], off[r1]);
                let edges = &graph.neighbor_edges[p0..p1];
                block_weights(isa, radial, edges, emb, Pass::Backward, sc);
                // Every path overwrites its own weights' gradient (paths share
                // no weight columns); columns no path reads keep the zero the
                // scratch was made with, as nothing else writes `gw`. So no
                // zeroing pass over the block's gradient (about 1 MB).
                for j in r0..r1 {
                    fused_bwd_sender_row_mv(
                        isa,
                        paths,
                        graph,
                        &ht,
                        sh,
                        &sc.w,
                        &gat,
                        inv_den,
                        j,
                        p0,
                        &mut gh[(j - r0) * di..(j - r0 + 1) * di],
                        &mut sc.gw,
                        gy,
                        &mut sc.conv,
                    );
                }
                block_weights_backward(isa, radial, p1 - p0, sc, gemb);
            },
        );
    // Back to edge order.
    if ds > 0 {
        grad_sh
            .par_chunks_mut(ds)
            .zip(graph.neighbor_pos.par_iter())
            .for_each(|(g, &p)| {
                g.copy_from_slice(&gsh_pos[p as usize * ds..(p as usize + 1) * ds])
            });
    }
    if nb > 0 {
        grad_emb
            .par_chunks_mut(nb)
            .zip(graph.neighbor_pos.par_iter())
            .for_each(|(g, &p)| {
                g.copy_from_slice(&gemb_pos[p as usize * nb..(p as usize + 1) * nb])
            });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::values;
    use crate::sh::sh_forward;
    use crate::wigner::wigner_3j;

    /// The kernel copies the running CPU supports, the baseline first.
    fn supported_copies() -> Vec<Isa> {
        match Isa::detect() {
            Isa::Avx512 => vec![Isa::Base, Isa::Avx2, Isa::Avx512],
            Isa::Avx2 => vec![Isa::Base, Isa::Avx2],
            Isa::Base => vec![Isa::Base],
        }
    }

    /// One fused convolution's inputs: the edge input `x` is what `radial`
    /// reads (embedding rows or length columns).
    struct FusedCase<'a, T> {
        paths: &'a ConvPaths<T>,
        radial: EdgeRadial<'a, T>,
        denominator: f64,
        graph: &'a ConvGraph,
        h: &'a [T],
        x: &'a [T],
        sh: &'a [T],
    }

    impl<T: Real> FusedCase<'_, T> {
        /// Forward, then backward from the message gradient `g`, with the
        /// kernel copy for `isa`, the message and `g` in `layout`:
        /// `[message, grad_h, grad_x, grad_sh]`.
        fn run(&self, isa: Isa, g: &[T], layout: BlockLayout) -> [Vec<T>; 4] {
            let c = self;
            let mut out = vec![T::ZERO; c.graph.n_rows * c.paths.dim_msg()];
            radial_conv_forward_on(
                isa,
                c.paths,
                c.radial,
                c.denominator,
                c.graph,
                c.h,
                c.x,
                c.sh,
                layout,
                &mut out,
            )
            .expect("forward");
            let (mut gh, mut gx, mut gsh) = (
                vec![T::ZERO; c.h.len()],
                vec![T::ZERO; c.x.len()],
                vec![T::ZERO; c.sh.len()],
            );
            radial_conv_backward_on(
                isa,
                c.paths,
                c.radial,
                c.denominator,
                c.graph,
                c.h,
                c.x,
                c.sh,
                g,
                layout,
                &mut gh,
                &mut gx,
                &mut gsh,
            )
            .expect("backward");
            [out, gh, gx, gsh]
        }
    }

    /// Every copy of the fused kernels this CPU runs (AVX-512, AVX2+FMA,
    /// the baseline) gives the baseline's bits, forward and backward, over
    /// channel counts that fill the kernels' groups of copies and that leave
    /// a tail after them; and so does each with the message in the kernels'
    /// component-major layout (written so, its gradient read so).
    fn copies_agree<T: Real>() {
        let mut seed = 3u64;
        let mut next = move || values(&mut seed, 1)[0];
        let ir = Irreps::parse("48x0e+24x1e+13x2e+8x3e").expect("irreps");
        let (paths, _, _) =
            ConvPaths::<T>::uvu_sorted(&ir, 3, |_| 1, |ir| ir.l <= 3, wigner_3j).expect("paths");
        let (n, ne, nb) = (60usize, 700usize, 8usize);
        let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
        for e in 0..ne {
            let c = if e % 7 == 0 { 11 } else { e * 31 % n };
            centers.push(c as u32);
            neighbors.push(((e * 17 + 5) % n) as u32);
        }
        let graph = ConvGraph::new(n, &centers, &neighbors).expect("graph");
        let widths = [nb, 16, paths.dim_w()];
        let mats: Vec<Vec<f64>> = (0..2)
            .map(|k| (0..widths[k] * widths[k + 1]).map(|_| next()).collect())
            .collect();
        let radial = RadialMlp::<T>::new(&widths, &mats).expect("radial");
        let vecs: Vec<[T; 3]> = (0..ne)
            .map(|_| std::array::from_fn(|_| T::from_f64(next() * 3.0)))
            .collect();
        let mut sh = vec![T::ZERO; ne * sh_dim(3)];
        sh_forward(&vecs, 3, &mut sh).expect("sh");
        let mut vals = |len: usize| -> Vec<T> { (0..len).map(|_| T::from_f64(next())).collect() };
        let (h, emb, g) = (vals(n * ir.dim()), vals(ne * nb), vals(n * paths.dim_msg()));
        let cm = BlockLayout::ComponentMajor;
        let dm = paths.dim_msg();
        let g_cm = rows_to_cm(&paths.out_ranges, &g, dm);
        let case = FusedCase {
            paths: &paths,
            radial: (&radial).into(),
            denominator: 2.5,
            graph: &graph,
            h: &h,
            x: &emb,
            sh: &sh,
        };
        let run = |isa: Isa, layout: BlockLayout| {
            let ga = if layout == cm { &g_cm } else { &g };
            let mut got = case.run(isa, ga, layout);
            if layout == cm {
                // Back to e3nn's layout, to compare with the other runs.
                let mut moved = vec![T::ZERO; got[0].len()];
                for (dst, src) in moved.chunks_exact_mut(dm).zip(got[0].chunks_exact(dm)) {
                    transpose_ranges(&paths.out_ranges, src, dst, false);
                }
                got[0] = moved;
            }
            got
        };
        let base = run(Isa::Base, BlockLayout::CopyMajor);
        assert!(base[0].iter().any(|v| v.to_f64_lossless().abs() > 1e-3));
        let runs = supported_copies()
            .into_iter()
            .flat_map(|isa| [(isa, BlockLayout::CopyMajor), (isa, cm)]);
        for (isa, layout) in runs {
            let got = run(isa, layout);
            for (name, a, b) in ["out", "grad_h", "grad_emb", "grad_sh"]
                .iter()
                .zip(&got)
                .zip(&base)
                .map(|((n, a), b)| (n, a, b))
            {
                assert!(
                    a == b,
                    "{isa:?} {layout:?} {name} differs from the baseline copy"
                );
            }
        }
    }

    /// Every copy of the table's kernels gives the baseline's bits, in
    /// the fused convolution's forward and backward.
    fn table_copies_agree<T: Real>() {
        use crate::radial_table::{split_length, TableTolerance};
        let mut seed = 5u64;
        let mut next = move || values(&mut seed, 1)[0];
        let ir = Irreps::parse("24x0e+13x1e+5x2e").expect("irreps");
        let (paths, _, _) =
            ConvPaths::<T>::uvu_sorted(&ir, 2, |_| 1, |ir| ir.l <= 2, wigner_3j).expect("paths");
        let (n, ne) = (40usize, 500usize);
        let centers: Vec<u32> = (0..ne).map(|e| (e * 13 % n) as u32).collect();
        let neighbors: Vec<u32> = (0..ne).map(|e| ((e * 7 + 3) % n) as u32).collect();
        let graph = ConvGraph::new(n, &centers, &neighbors).expect("graph");
        let emb = crate::radial_table::tests::sevennet0_like_embedding();
        let widths = [8, 16, paths.dim_w()];
        let mats: Vec<Vec<f64>> = (0..2)
            .map(|k| (0..widths[k] * widths[k + 1]).map(|_| next()).collect())
            .collect();
        let mlp = RadialMlp::<f64>::new(&widths, &mats).expect("mlp");
        let tol = TableTolerance {
            value: 1e-7,
            derivative: 1e-6,
        };
        let table = RadialTable::<T>::build(&emb, &mlp, tol).expect("table");
        let vecs: Vec<[T; 3]> = (0..ne)
            .map(|_| std::array::from_fn(|_| T::from_f64(next() * 2.8)))
            .collect();
        let r: Vec<T> = vecs
            .iter()
            .flat_map(|v| {
                let v = v.map(T::to_f64_lossless);
                split_length::<T>((v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            })
            .collect();
        let mut sh = vec![T::ZERO; ne * sh_dim(2)];
        sh_forward(&vecs, 2, &mut sh).expect("sh");
        let h: Vec<T> = (0..n * ir.dim()).map(|_| T::from_f64(next())).collect();
        let g: Vec<T> = (0..n * paths.dim_msg())
            .map(|_| T::from_f64(next()))
            .collect();
        let case = FusedCase {
            paths: &paths,
            radial: (&table).into(),
            denominator: 2.0,
            graph: &graph,
            h: &h,
            x: &r,
            sh: &sh,
        };
        let run = |isa: Isa| case.run(isa, &g, BlockLayout::CopyMajor);
        let base = run(Isa::Base);
        assert!(base[2].iter().any(|v| v.to_f64_lossless().abs() > 1e-6));
        for isa in supported_copies() {
            assert!(run(isa) == base, "{isa:?} differs from the baseline copy");
        }
    }

    #[test]
    fn every_table_kernel_copy_gives_the_baseline_bits() {
        table_copies_agree::<f32>();
        table_copies_agree::<f64>();
    }

    #[test]
    fn every_kernel_copy_gives_the_baseline_bits_f32() {
        copies_agree::<f32>();
    }

    #[test]
    fn every_kernel_copy_gives_the_baseline_bits_f64() {
        copies_agree::<f64>();
    }
}
