//! Fused `uvu` tensor-product convolution with scatter-sum aggregation
//! (NequIP / SevenNet interaction), and its backward pass.
//!
//! For every edge e = (i ← j) (receiver `centers[e]`, sender `neighbors[e]`)
//! and every path p (input block of `mul` copies of l1, filter degree l2,
//! output degree l3):
//!
//! `msg_e[p][u,k] = α_p · w_e[w_p + u] · Σ_{a,b} C_p[a,b,k] · h_j[p][u,a] · Y_e[l2² + b]`
//!
//! and `A_i = Σ_{e: centers[e] = i} msg_e / denominator`. Messages are never
//! materialised: each edge's contribution is accumulated straight into its
//! receiver's row, and the work is split over receiver rows (forward), edges
//! (weight and filter gradients) and sender rows (feature gradient), so no
//! two tasks ever write the same memory.

use crate::error::{check_len, E3nnError};
use crate::irreps::{Irrep, Irreps, MulIr};
use crate::real::Real;
use crate::sh::sh_dim;
use rayon::prelude::*;

/// Largest degree the fused kernels are specialised for.
pub const CONV_LMAX: usize = 3;

/// One tensor-product path, described in the caller's layouts.
#[derive(Clone, Debug)]
pub struct TpPath {
    /// Degree of the input block.
    pub l1: usize,
    /// Degree of the filter (spherical-harmonic) block.
    pub l2: usize,
    /// Degree of the output block.
    pub l3: usize,
    /// Number of copies (u = 0..mul) of the input block.
    pub mul: usize,
    /// Column of `h` where the input block starts.
    pub in_offset: usize,
    /// Column of the per-edge weights `w` for copy u = 0.
    pub weight_offset: usize,
    /// Column of the message (and of `A`) where the output block starts.
    pub out_offset: usize,
    /// Path normalisation α (√(2·l3+1) for e3nn `uvu` with one path per output block).
    pub path_weight: f64,
    /// CG tensor `C[a,b,k]`, `(2l1+1)×(2l2+1)×(2l3+1)` row-major.
    pub cg: Vec<f64>,
}

#[derive(Clone, Debug)]
struct PathData<T> {
    l2: usize,
    d1: usize,
    d2: usize,
    d3: usize,
    mul: usize,
    in_off: usize,
    w_off: usize,
    out_off: usize,
    alpha: f64,
    cg: Vec<T>,
    /// Offset of this path's `(d1 × d3)` filter matrix in per-edge scratch.
    t_off: usize,
}

/// A validated list of [`TpPath`]s with the row widths they address.
#[derive(Clone, Debug)]
pub struct ConvPaths<T> {
    dim_in: usize,
    lmax_sh: usize,
    dim_w: usize,
    dim_msg: usize,
    paths: Vec<PathData<T>>,
    t_size: usize,
}

impl<T: Real> ConvPaths<T> {
    /// Validates the paths against the widths of `h` (`dim_in`), of the SH rows
    /// (`sh_dim(lmax_sh)`), of `w` (`dim_w`) and of the message (`dim_msg`).
    pub fn new(
        dim_in: usize,
        lmax_sh: usize,
        dim_w: usize,
        dim_msg: usize,
        paths: Vec<TpPath>,
    ) -> Result<Self, E3nnError> {
        let mut out = Vec::with_capacity(paths.len());
        let mut t_size = 0;
        for (n, p) in paths.iter().enumerate() {
            let bad = |why: String| E3nnError::Config(format!("TP path {n}: {why}"));
            if p.l1.max(p.l2).max(p.l3) > CONV_LMAX {
                return Err(bad(format!("degrees above {CONV_LMAX}")));
            }
            if p.l2 > lmax_sh {
                return Err(bad(format!(
                    "filter degree {} above lmax_sh {lmax_sh}",
                    p.l2
                )));
            }
            let (d1, d2, d3) = (2 * p.l1 + 1, 2 * p.l2 + 1, 2 * p.l3 + 1);
            if p.cg.len() != d1 * d2 * d3 {
                return Err(bad(format!(
                    "CG tensor has {} entries, expected {}",
                    p.cg.len(),
                    d1 * d2 * d3
                )));
            }
            if p.in_offset + p.mul * d1 > dim_in {
                return Err(bad(format!("input block ends past dim_in {dim_in}")));
            }
            if p.weight_offset + p.mul > dim_w {
                return Err(bad(format!("weights end past dim_w {dim_w}")));
            }
            if p.out_offset + p.mul * d3 > dim_msg {
                return Err(bad(format!("output block ends past dim_msg {dim_msg}")));
            }
            out.push(PathData {
                l2: p.l2,
                d1,
                d2,
                d3,
                mul: p.mul,
                in_off: p.in_offset,
                w_off: p.weight_offset,
                out_off: p.out_offset,
                alpha: p.path_weight,
                cg: p.cg.iter().map(|&v| T::from_f64(v)).collect(),
                t_off: t_size,
            });
            t_size += d1 * d3;
        }
        Ok(Self {
            dim_in,
            lmax_sh,
            dim_w,
            dim_msg,
            paths: out,
            t_size,
        })
    }

    /// e3nn `uvu` paths of `irreps_in ⊗ Y(0..=lmax_sh)` in **sorted** order
    /// (stable sort of the output blocks by irrep, as sevenn ≥ 0.11 uses),
    /// keeping output degrees for which `keep(l3)` holds. The SH of degree l
    /// has parity `sh_parity(l)`. `cg(l1,l2,l3)` supplies each CG tensor and
    /// is called once per path, in sorted order.
    ///
    /// Returns the paths, the message irreps (unsimplified, sorted) and, per
    /// sorted path, its index in e3nn's creation order (input block outer,
    /// filter degree middle, l3 inner).
    pub fn uvu_sorted(
        irreps_in: &Irreps,
        lmax_sh: usize,
        sh_parity: impl Fn(usize) -> i8,
        keep: impl Fn(usize) -> bool,
        cg: impl FnMut(usize, usize, usize) -> Result<Vec<f64>, E3nnError>,
    ) -> Result<(Self, Irreps, Vec<usize>), E3nnError> {
        let (paths, msg, order) = uvu_sorted_paths(irreps_in, lmax_sh, sh_parity, keep, cg)?;
        let dim_w = paths.iter().map(|p| p.mul).sum();
        let me = Self::new(irreps_in.dim(), lmax_sh, dim_w, msg.dim(), paths)?;
        Ok((me, msg, order))
    }

    /// Width of `h` rows.
    pub fn dim_in(&self) -> usize {
        self.dim_in
    }
    /// Width of `w` rows (weights per edge).
    pub fn dim_w(&self) -> usize {
        self.dim_w
    }
    /// Width of message / `A` rows.
    pub fn dim_msg(&self) -> usize {
        self.dim_msg
    }
    /// Width of SH rows, `(lmax_sh+1)²`.
    pub fn dim_sh(&self) -> usize {
        sh_dim(self.lmax_sh)
    }
    /// Number of paths.
    pub fn n_paths(&self) -> usize {
        self.paths.len()
    }

    /// Fills the per-edge filter matrices `T_p[a,k] = s_p Σ_b C[a,b,k] Y[l2²+b]`
    /// with `s_p = α_p / denominator`.
    #[inline]
    fn filters(&self, y: &[T], scales: &[T], t: &mut [T]) {
        for (p, &s) in self.paths.iter().zip(scales) {
            let yl = &y[p.l2 * p.l2..p.l2 * p.l2 + p.d2];
            let tp = &mut t[p.t_off..p.t_off + p.d1 * p.d3];
            for a in 0..p.d1 {
                for k in 0..p.d3 {
                    let mut acc = T::ZERO;
                    for (b, &yb) in yl.iter().enumerate() {
                        acc += p.cg[(a * p.d2 + b) * p.d3 + k] * yb;
                    }
                    tp[a * p.d3 + k] = s * acc;
                }
            }
        }
    }
}

/// The [`TpPath`] list behind [`ConvPaths::uvu_sorted`] (same arguments and
/// order), for callers that want to adjust the paths before validation.
pub fn uvu_sorted_paths(
    irreps_in: &Irreps,
    lmax_sh: usize,
    sh_parity: impl Fn(usize) -> i8,
    keep: impl Fn(usize) -> bool,
    mut cg: impl FnMut(usize, usize, usize) -> Result<Vec<f64>, E3nnError>,
) -> Result<(Vec<TpPath>, Irreps, Vec<usize>), E3nnError> {
    // Creation order: (input block, l2, l3) and the output block.
    let mut created: Vec<(usize, usize, usize, MulIr)> = Vec::new();
    for (b, blk) in irreps_in.blocks.iter().enumerate() {
        for l2 in 0..=lmax_sh {
            for l3 in blk.ir.l.abs_diff(l2)..=blk.ir.l + l2 {
                if keep(l3) {
                    let ir = Irrep {
                        l: l3,
                        p: blk.ir.p * sh_parity(l2),
                    };
                    created.push((b, l2, l3, MulIr { mul: blk.mul, ir }));
                }
            }
        }
    }
    let msg_created = Irreps {
        blocks: created.iter().map(|c| c.3).collect(),
    };
    let (msg_sorted, perm) = msg_created.sort();
    let mut order = vec![0; perm.len()];
    for (old, &new) in perm.iter().enumerate() {
        order[new] = old;
    }
    let in_offs = irreps_in.offsets();
    let out_offs = msg_sorted.offsets();
    let mut paths = Vec::with_capacity(order.len());
    let mut w_off = 0;
    for (pos, &k) in order.iter().enumerate() {
        let (b, l2, l3, out) = created[k];
        let l1 = irreps_in.blocks[b].ir.l;
        paths.push(TpPath {
            l1,
            l2,
            l3,
            mul: out.mul,
            in_offset: in_offs[b],
            weight_offset: w_off,
            out_offset: out_offs[pos],
            // One instruction per output block and mul2 = 1 in uvu mode.
            path_weight: ((2 * l3 + 1) as f64).sqrt(),
            cg: cg(l1, l2, l3)?,
        });
        w_off += out.mul;
    }
    Ok((paths, msg_sorted, order))
}

/// Receiver- and sender-sorted views (CSR) of an edge list over `n_rows` rows.
/// Build it once per graph and reuse it for every layer.
#[derive(Clone, Debug)]
pub struct ConvGraph {
    n_rows: usize,
    centers: Vec<u32>,
    neighbors: Vec<u32>,
    center_offsets: Vec<usize>,
    center_edges: Vec<u32>,
    neighbor_offsets: Vec<usize>,
    neighbor_edges: Vec<u32>,
}

fn csr(n_rows: usize, idx: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let mut offsets = vec![0usize; n_rows + 1];
    for &i in idx {
        offsets[i as usize + 1] += 1;
    }
    for r in 0..n_rows {
        offsets[r + 1] += offsets[r];
    }
    let mut fill = offsets.clone();
    let mut edges = vec![0u32; idx.len()];
    for (e, &i) in idx.iter().enumerate() {
        edges[fill[i as usize]] = e as u32;
        fill[i as usize] += 1;
    }
    (offsets, edges)
}

impl ConvGraph {
    /// Indexes the edges `(centers[e] ← neighbors[e])`; both must be
    /// `< n_rows`. Rows that appear in no edge are allowed (their `A` row is 0).
    pub fn new(n_rows: usize, centers: &[u32], neighbors: &[u32]) -> Result<Self, E3nnError> {
        check_len("neighbors", centers.len(), neighbors.len())?;
        if centers.len() > u32::MAX as usize {
            return Err(E3nnError::Unsupported("more than 2^32 edges".into()));
        }
        for (what, arr) in [("centers", centers), ("neighbors", neighbors)] {
            if let Some((position, &i)) =
                arr.iter().enumerate().find(|(_, &i)| i as usize >= n_rows)
            {
                return Err(E3nnError::Index {
                    what,
                    position,
                    index: i as usize,
                    n_rows,
                });
            }
        }
        let (center_offsets, center_edges) = csr(n_rows, centers);
        let (neighbor_offsets, neighbor_edges) = csr(n_rows, neighbors);
        Ok(Self {
            n_rows,
            centers: centers.to_vec(),
            neighbors: neighbors.to_vec(),
            center_offsets,
            center_edges,
            neighbor_offsets,
            neighbor_edges,
        })
    }
    /// Number of rows (atoms) the indices address.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }
    /// Number of edges.
    pub fn n_edges(&self) -> usize {
        self.centers.len()
    }
    /// Receiver of every edge.
    pub fn centers(&self) -> &[u32] {
        &self.centers
    }
    /// Sender of every edge.
    pub fn neighbors(&self) -> &[u32] {
        &self.neighbors
    }
}

macro_rules! dispatch {
    ($d1:expr, $d3:expr, $f:ident, $($arg:expr),*) => {
        match ($d1, $d3) {
            (1, 1) => $f::<T, 1, 1>($($arg),*),
            (1, 3) => $f::<T, 1, 3>($($arg),*),
            (1, 5) => $f::<T, 1, 5>($($arg),*),
            (1, 7) => $f::<T, 1, 7>($($arg),*),
            (3, 1) => $f::<T, 3, 1>($($arg),*),
            (3, 3) => $f::<T, 3, 3>($($arg),*),
            (3, 5) => $f::<T, 3, 5>($($arg),*),
            (3, 7) => $f::<T, 3, 7>($($arg),*),
            (5, 1) => $f::<T, 5, 1>($($arg),*),
            (5, 3) => $f::<T, 5, 3>($($arg),*),
            (5, 5) => $f::<T, 5, 5>($($arg),*),
            (5, 7) => $f::<T, 5, 7>($($arg),*),
            (7, 1) => $f::<T, 7, 1>($($arg),*),
            (7, 3) => $f::<T, 7, 3>($($arg),*),
            (7, 5) => $f::<T, 7, 5>($($arg),*),
            (7, 7) => $f::<T, 7, 7>($($arg),*),
            // ConvPaths::new rejects degrees above CONV_LMAX.
            _ => unreachable!("degree above CONV_LMAX"),
        }
    };
}

#[inline(always)]
fn load_t<T: Real, const D1: usize, const D3: usize>(t: &[T]) -> [[T; D3]; D1] {
    let mut m = [[T::ZERO; D3]; D1];
    for a in 0..D1 {
        for k in 0..D3 {
            m[a][k] = t[a * D3 + k];
        }
    }
    m
}

/// out[u,k] += w[u] Σ_a h[u,a] T[a,k]
#[inline(always)]
fn fwd_kernel<T: Real, const D1: usize, const D3: usize>(h: &[T], t: &[T], w: &[T], out: &mut [T]) {
    let tm = load_t::<T, D1, D3>(t);
    for ((hu, &wu), ou) in h.chunks_exact(D1).zip(w).zip(out.chunks_exact_mut(D3)) {
        let mut acc = [T::ZERO; D3];
        for a in 0..D1 {
            let x = hu[a];
            for k in 0..D3 {
                acc[k] += x * tm[a][k];
            }
        }
        for k in 0..D3 {
            ou[k] += wu * acc[k];
        }
    }
}

/// grad_w[u] = Σ_k (Σ_a h[u,a] T[a,k]) g[u,k];  gt[a,k] += Σ_u w[u] h[u,a] g[u,k]
#[inline(always)]
fn bwd_edge_kernel<T: Real, const D1: usize, const D3: usize>(
    h: &[T],
    t: &[T],
    w: &[T],
    g: &[T],
    grad_w: &mut [T],
    gt: &mut [T],
) {
    let tm = load_t::<T, D1, D3>(t);
    let mut acc_t = [[T::ZERO; D3]; D1];
    for (((hu, &wu), gu), gw) in h
        .chunks_exact(D1)
        .zip(w)
        .zip(g.chunks_exact(D3))
        .zip(grad_w.iter_mut())
    {
        let mut s = [T::ZERO; D3];
        for a in 0..D1 {
            let x = hu[a];
            for k in 0..D3 {
                s[k] += x * tm[a][k];
            }
        }
        let mut dw = T::ZERO;
        for k in 0..D3 {
            dw += s[k] * gu[k];
        }
        *gw = dw;
        for a in 0..D1 {
            let x = wu * hu[a];
            for k in 0..D3 {
                acc_t[a][k] += x * gu[k];
            }
        }
    }
    for a in 0..D1 {
        for k in 0..D3 {
            gt[a * D3 + k] = acc_t[a][k];
        }
    }
}

/// gh[u,a] += w[u] Σ_k T[a,k] g[u,k]
#[inline(always)]
fn bwd_h_kernel<T: Real, const D1: usize, const D3: usize>(
    t: &[T],
    w: &[T],
    g: &[T],
    gh: &mut [T],
) {
    let tm = load_t::<T, D1, D3>(t);
    for ((ghu, &wu), gu) in gh.chunks_exact_mut(D1).zip(w).zip(g.chunks_exact(D3)) {
        for a in 0..D1 {
            let mut acc = T::ZERO;
            for k in 0..D3 {
                acc += tm[a][k] * gu[k];
            }
            ghu[a] += wu * acc;
        }
    }
}

fn check_inputs<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
) -> Result<Vec<T>, E3nnError> {
    let (n, e) = (graph.n_rows, graph.n_edges());
    check_len("conv h", n * paths.dim_in, h.len())?;
    check_len("conv sh", e * paths.dim_sh(), sh.len())?;
    check_len("conv w", e * paths.dim_w, w.len())?;
    if !(denominator.is_finite() && denominator != 0.0) {
        return Err(E3nnError::Config(format!(
            "conv denominator must be finite and non-zero, got {denominator}"
        )));
    }
    Ok(paths
        .paths
        .iter()
        .map(|p| T::from_f64(p.alpha / denominator))
        .collect())
}

/// Forward: `out` (n_rows × dim_msg, overwritten) = Σ_{edges into i} msg_e / denominator.
/// `h` is n_rows × dim_in (read at senders), `sh` E × dim_sh, `w` E × dim_w.
pub fn conv_forward<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
    out: &mut [T],
) -> Result<(), E3nnError> {
    let scales = check_inputs(paths, graph, h, sh, w, denominator)?;
    let (dm, di, dw, ds) = (paths.dim_msg, paths.dim_in, paths.dim_w, paths.dim_sh());
    check_len("conv out", graph.n_rows * dm, out.len())?;
    if dm == 0 {
        return Ok(());
    }
    out.par_chunks_mut(dm).enumerate().for_each_init(
        || vec![T::ZERO; paths.t_size],
        |t, (i, row)| {
            row.fill(T::ZERO);
            for &e in &graph.center_edges[graph.center_offsets[i]..graph.center_offsets[i + 1]] {
                let e = e as usize;
                let j = graph.neighbors[e] as usize;
                let (hj, we) = (&h[j * di..(j + 1) * di], &w[e * dw..(e + 1) * dw]);
                paths.filters(&sh[e * ds..(e + 1) * ds], &scales, t);
                for p in &paths.paths {
                    dispatch!(
                        p.d1,
                        p.d3,
                        fwd_kernel,
                        &hj[p.in_off..p.in_off + p.mul * p.d1],
                        &t[p.t_off..p.t_off + p.d1 * p.d3],
                        &we[p.w_off..p.w_off + p.mul],
                        &mut row[p.out_off..p.out_off + p.mul * p.d3]
                    );
                }
            }
        },
    );
    Ok(())
}

/// Backward of [`conv_forward`] from `grad_a` (n_rows × dim_msg). Overwrites
/// `grad_h` (n_rows × dim_in; sums over the edges each row sends),
/// `grad_sh` (E × dim_sh) and `grad_w` (E × dim_w).
#[allow(clippy::too_many_arguments)]
pub fn conv_backward<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
    grad_a: &[T],
    grad_h: &mut [T],
    grad_sh: &mut [T],
    grad_w: &mut [T],
) -> Result<(), E3nnError> {
    let scales = check_inputs(paths, graph, h, sh, w, denominator)?;
    let (n, ne) = (graph.n_rows, graph.n_edges());
    let (dm, di, dw, ds) = (paths.dim_msg, paths.dim_in, paths.dim_w, paths.dim_sh());
    check_len("conv grad_a", n * dm, grad_a.len())?;
    check_len("conv grad_h", n * di, grad_h.len())?;
    check_len("conv grad_sh", ne * ds, grad_sh.len())?;
    check_len("conv grad_w", ne * dw, grad_w.len())?;

    // Pass 1, over edges: weight and filter gradients (disjoint rows per edge).
    if dw == 0 {
        grad_sh.fill(T::ZERO);
    } else if ne > 0 {
        grad_w
            .par_chunks_mut(dw)
            .zip(grad_sh.par_chunks_mut(ds))
            .enumerate()
            .for_each_init(
                || (vec![T::ZERO; paths.t_size], vec![T::ZERO; paths.t_size]),
                |(t, gt), (e, (gw, gy))| {
                    let (i, j) = (graph.centers[e] as usize, graph.neighbors[e] as usize);
                    let (hj, we, gi) = (
                        &h[j * di..(j + 1) * di],
                        &w[e * dw..(e + 1) * dw],
                        &grad_a[i * dm..(i + 1) * dm],
                    );
                    paths.filters(&sh[e * ds..(e + 1) * ds], &scales, t);
                    gy.fill(T::ZERO);
                    for (p, &s) in paths.paths.iter().zip(&scales) {
                        let gtp = &mut gt[p.t_off..p.t_off + p.d1 * p.d3];
                        dispatch!(
                            p.d1,
                            p.d3,
                            bwd_edge_kernel,
                            &hj[p.in_off..p.in_off + p.mul * p.d1],
                            &t[p.t_off..p.t_off + p.d1 * p.d3],
                            &we[p.w_off..p.w_off + p.mul],
                            &gi[p.out_off..p.out_off + p.mul * p.d3],
                            &mut gw[p.w_off..p.w_off + p.mul],
                            gtp
                        );
                        // ∂T[a,k]/∂Y[b] = s·C[a,b,k]
                        let yb = &mut gy[p.l2 * p.l2..p.l2 * p.l2 + p.d2];
                        for a in 0..p.d1 {
                            for b in 0..p.d2 {
                                let mut acc = T::ZERO;
                                for k in 0..p.d3 {
                                    acc += p.cg[(a * p.d2 + b) * p.d3 + k] * gtp[a * p.d3 + k];
                                }
                                yb[b] += s * acc;
                            }
                        }
                    }
                },
            );
    }

    // Pass 2, over sender rows: feature gradient.
    if di > 0 {
        grad_h.par_chunks_mut(di).enumerate().for_each_init(
            || vec![T::ZERO; paths.t_size],
            |t, (j, gh)| {
                gh.fill(T::ZERO);
                for &e in
                    &graph.neighbor_edges[graph.neighbor_offsets[j]..graph.neighbor_offsets[j + 1]]
                {
                    let e = e as usize;
                    let i = graph.centers[e] as usize;
                    let (we, gi) = (&w[e * dw..(e + 1) * dw], &grad_a[i * dm..(i + 1) * dm]);
                    paths.filters(&sh[e * ds..(e + 1) * ds], &scales, t);
                    for p in &paths.paths {
                        dispatch!(
                            p.d1,
                            p.d3,
                            bwd_h_kernel,
                            &t[p.t_off..p.t_off + p.d1 * p.d3],
                            &we[p.w_off..p.w_off + p.mul],
                            &gi[p.out_off..p.out_off + p.mul * p.d3],
                            &mut gh[p.in_off..p.in_off + p.mul * p.d1]
                        );
                    }
                }
            },
        );
    }
    Ok(())
}
