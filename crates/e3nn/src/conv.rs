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
use crate::radial::{MlpScratch, RadialMlp};
use crate::real::Real;
use crate::sh::sh_dim;
use rayon::prelude::*;

mod graph;

pub use graph::ConvGraph;

/// Largest degree the fused kernels are specialised for.
pub const CONV_LMAX: usize = 3;

/// How the convolution's message rows are stored: e3nn's layout (each
/// irreps block copy-major: the 2l+1 components of copy 0, then of copy 1,
/// …), or the kernels' own, component-major by path output block (copy u
/// of component c of the block `(offset, mul, dim)` in
/// [`ConvPaths::out_blocks`] at `offset + c·mul + u`), which
/// [`IrrepsLinear::forward_component_major`](crate::IrrepsLinear::forward_component_major)
/// reads without a transposed copy. Blocks of scalars read the same in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockLayout {
    /// e3nn's layout: `u·(2l+1) + c` within a block.
    #[default]
    CopyMajor,
    /// `c·mul + u` within each path output block.
    ComponentMajor,
}

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
struct PathData {
    d1: usize,
    d3: usize,
    mul: usize,
    in_off: usize,
    w_off: usize,
    out_off: usize,
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
    paths: Vec<PathData>,
    t_size: usize,
    /// `(filter index, SH index, α·C)` for every nonzero CG entry of every path.
    nz: Vec<(u32, u32, T)>,
    /// The same entries stably sorted by SH index (in `nz` order within
    /// one), for the lane-wise adjoint; SH index `b`'s entries are
    /// `by_sh[by_sh_start[b]..by_sh_start[b + 1]]`.
    by_sh: Vec<(u32, u32, T)>,
    by_sh_start: Vec<usize>,
    /// Forward FLOPs per edge in the cheapest dense form (see [`ConvPaths::flops_per_edge`]).
    flops_per_edge: usize,
    /// Distinct `(offset, mul, dim)` input blocks the paths read.
    in_ranges: Vec<(usize, usize, usize)>,
    /// Distinct `(offset, mul, dim)` output blocks the paths write.
    out_ranges: Vec<(usize, usize, usize)>,
}

/// Distinct ranges, which must be identical or disjoint (the kernels
/// transpose each range as one block).
fn distinct_ranges(
    mut ranges: Vec<(usize, usize, usize)>,
    what: &str,
) -> Result<Vec<(usize, usize, usize)>, E3nnError> {
    ranges.sort_unstable();
    ranges.dedup();
    if let Some((a, b)) = first_overlap(&ranges) {
        return Err(E3nnError::Config(format!(
            "TP paths use overlapping {what} blocks {a:?} and {b:?} (offset, mul, dim)"
        )));
    }
    Ok(ranges)
}

/// `(offset, mul, dim)`: a block of `mul` copies of a `dim`-wide irrep in a row.
type BlockRange = (usize, usize, usize);

/// The first two neighbours of sorted ranges that overlap, if any.
fn first_overlap(sorted: &[BlockRange]) -> Option<(BlockRange, BlockRange)> {
    sorted
        .windows(2)
        .map(|pair| (pair[0], pair[1]))
        .find(|(a, b)| a.0 + a.1 * a.2 > b.0)
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
        let mut nz = Vec::new();
        let mut flops_per_edge = 0;
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
                d1,
                d3,
                mul: p.mul,
                in_off: p.in_offset,
                w_off: p.weight_offset,
                out_off: p.out_offset,
                t_off: t_size,
            });
            // Nonzero CG entries only (most are zero), pre-multiplied by α.
            for a in 0..d1 {
                for b in 0..d2 {
                    for k in 0..d3 {
                        let c = p.cg[(a * d2 + b) * d3 + k];
                        if c != 0.0 {
                            nz.push((
                                (t_size + a * d3 + k) as u32,
                                (p.l2 * p.l2 + b) as u32,
                                T::from_f64(p.path_weight * c),
                            ));
                        }
                    }
                }
            }
            t_size += d1 * d3;
            flops_per_edge += 2 * d1 * d2 * d3 + 2 * p.mul * d1 * d3 + p.mul * d3;
        }
        let in_ranges = distinct_ranges(
            out.iter().map(|p| (p.in_off, p.mul, p.d1)).collect(),
            "input",
        )?;
        let out_ranges = distinct_ranges(
            out.iter().map(|p| (p.out_off, p.mul, p.d3)).collect(),
            "output",
        )?;
        // Each path overwrites its weights' gradient, so two paths may not
        // share a weight column (identical ranges included).
        let mut w_ranges: Vec<_> = out
            .iter()
            .filter(|p| p.mul > 0)
            .map(|p| (p.w_off, p.mul, 1))
            .collect();
        w_ranges.sort_unstable();
        if let Some((a, b)) = first_overlap(&w_ranges) {
            return Err(E3nnError::Config(format!(
                "TP paths share weight columns: (offset, mul) {:?} and {:?}",
                (a.0, a.1),
                (b.0, b.1)
            )));
        }
        let mut by_sh = nz.clone();
        by_sh.sort_by_key(|&(_, yi, _)| yi);
        let mut by_sh_start = vec![0usize; sh_dim(lmax_sh) + 1];
        for &(_, yi, _) in &by_sh {
            by_sh_start[yi as usize + 1] += 1;
        }
        for b in 1..by_sh_start.len() {
            by_sh_start[b] += by_sh_start[b - 1];
        }
        Ok(Self {
            dim_in,
            lmax_sh,
            dim_w,
            dim_msg,
            paths: out,
            t_size,
            nz,
            by_sh,
            by_sh_start,
            flops_per_edge,
            in_ranges,
            out_ranges,
        })
    }

    /// e3nn `uvu` paths of `irreps_in ⊗ Y(0..=lmax_sh)` in **sorted** order
    /// (stable sort of the output blocks by irrep, as sevenn ≥ 0.11 uses),
    /// keeping the output irreps for which `keep(ir)` holds. The SH of degree l
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
        keep: impl Fn(Irrep) -> bool,
        cg: impl FnMut(usize, usize, usize) -> Result<Vec<f64>, E3nnError>,
    ) -> Result<(Self, Irreps, Vec<usize>), E3nnError> {
        let (paths, msg, order) = uvu_sorted_paths(irreps_in, lmax_sh, sh_parity, keep, cg)?;
        let dim_w = paths.iter().map(|p| p.mul).sum();
        let me = Self::new(irreps_in.dim(), lmax_sh, dim_w, msg.dim(), paths)?;
        Ok((me, msg, order))
    }

    /// Floating-point operations of the tensor products' forward per edge
    /// (a multiply-add is 2), counted in the cheapest dense form of
    /// `bench/sevennet0_flops.py`: per path, `T = C·Y` once per edge
    /// (`2·d1·d2·d3`), then the contraction with the input copies times the
    /// weight (`2·u·d1·d3 + u·d3`). The radial MLP is not included.
    pub fn flops_per_edge(&self) -> usize {
        self.flops_per_edge
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

    /// The paths' output blocks `(offset, mul, dim)` in the message row,
    /// by offset: the parts of [`BlockLayout::ComponentMajor`].
    pub fn out_blocks(&self) -> &[(usize, usize, usize)] {
        &self.out_ranges
    }

    /// Whether the paths' output blocks tile the blocks of `irreps` (the
    /// message irreps a following Linear reads): every block of `irreps`
    /// is covered exactly by consecutive output blocks of its dimension,
    /// so that Linear can read the message in [`BlockLayout::ComponentMajor`].
    pub fn tiles_blocks_of(&self, irreps: &Irreps) -> bool {
        irreps.dim() == self.dim_msg && irreps.tiled_by(&self.out_ranges)
    }
    /// Width of SH rows, `(lmax_sh+1)²`.
    pub fn dim_sh(&self) -> usize {
        sh_dim(self.lmax_sh)
    }
    /// Number of paths.
    pub fn n_paths(&self) -> usize {
        self.paths.len()
    }

    /// Fills the per-edge filter matrices of every path,
    /// `T_p[a,k] = (α_p / denominator) Σ_b C_p[a,b,k] Y[l2²+b]`.
    #[inline(always)]
    fn filters(&self, y: &[T], inv_den: T, t: &mut [T]) {
        t.fill(T::ZERO);
        for &(ti, yi, c) in &self.nz {
            t[ti as usize] += c * y[yi as usize];
        }
        for v in t.iter_mut() {
            *v *= inv_den;
        }
    }

    /// Adjoint of [`Self::filters`]: `gy[b] = Σ ∂T/∂Y[b] · gt` (overwrites).
    #[inline(always)]
    fn filters_adjoint(&self, gt: &[T], inv_den: T, gy: &mut [T]) {
        gy.fill(T::ZERO);
        for &(ti, yi, c) in &self.nz {
            gy[yi as usize] += c * gt[ti as usize];
        }
        for v in gy.iter_mut() {
            *v *= inv_den;
        }
    }

    /// [`Self::filters_adjoint`] of a filter gradient held as `LANES`
    /// partial sums per entry (`gtv[ti]`, whose lanes add up to `gt[ti]`):
    /// the adjoint is applied lane by lane and only the `dim_sh` results
    /// are summed across lanes (in lane order), instead of every one of
    /// the `t_size` filter entries.
    #[inline(always)]
    fn filters_adjoint_lanes(&self, gtv: &[[T; LANES]], inv_den: T, gy: &mut [T]) {
        for (yi, out) in gy.iter_mut().enumerate() {
            let terms = &self.by_sh[self.by_sh_start[yi]..self.by_sh_start[yi + 1]];
            let mut v = [T::ZERO; LANES];
            for &(ti, _, c) in terms {
                let x = &gtv[ti as usize];
                for l in 0..LANES {
                    v[l] += c * x[l];
                }
            }
            let mut s = T::ZERO;
            for x in v {
                s += x;
            }
            *out = s * inv_den;
        }
    }
}

/// The [`TpPath`] list behind [`ConvPaths::uvu_sorted`] (same arguments and
/// order), for callers that want to adjust the paths before validation.
pub fn uvu_sorted_paths(
    irreps_in: &Irreps,
    lmax_sh: usize,
    sh_parity: impl Fn(usize) -> i8,
    keep: impl Fn(Irrep) -> bool,
    mut cg: impl FnMut(usize, usize, usize) -> Result<Vec<f64>, E3nnError>,
) -> Result<(Vec<TpPath>, Irreps, Vec<usize>), E3nnError> {
    // Creation order: (input block, l2, l3) and the output block.
    let mut created: Vec<(usize, usize, usize, MulIr)> = Vec::new();
    for (b, blk) in irreps_in.blocks.iter().enumerate() {
        for l2 in 0..=lmax_sh {
            for l3 in blk.ir.l.abs_diff(l2)..=blk.ir.l + l2 {
                let ir = Irrep {
                    l: l3,
                    p: blk.ir.p * sh_parity(l2),
                };
                if keep(ir) {
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

// The per-edge kernels below work on blocks stored component-major
// (`[c][u]`, copies contiguous), so every inner loop runs over the copies u
// and vectorises; rows are transposed from and to e3nn's mul-major layout
// once per row, not per edge.

/// `y += c·x` elementwise.
#[inline(always)]
fn axpy<T: Real>(c: T, x: &[T], y: &mut [T]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += c * xv;
    }
}

/// Σ a[u]·b[u] with 8 independent partial sums (so it vectorises).
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = T::ZERO;
    for v in acc {
        s += v;
    }
    for (x, y) in ra.iter().zip(rb) {
        s += *x * *y;
    }
    s
}

/// grad_w[u] = Σ_k g[k][u]·Σ_a T[a,k] h[a][u];  gt[a,k] = Σ_u w[u] h[a][u] g[k][u].
/// `s` is scratch of mul, `wh` of D1·mul.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_edge_kernel<T: Real, const D1: usize, const D3: usize>(
    h: &[T],
    t: &[T],
    w: &[T],
    g: &[T],
    grad_w: &mut [T],
    gt: &mut [T],
    s: &mut [T],
    wh: &mut [T],
) {
    let m = w.len();
    let s = &mut s[..m];
    grad_w.fill(T::ZERO);
    for k in 0..D3 {
        s.fill(T::ZERO);
        for a in 0..D1 {
            axpy(t[a * D3 + k], &h[a * m..(a + 1) * m], s);
        }
        for ((gw, &sv), &gv) in grad_w.iter_mut().zip(s.iter()).zip(&g[k * m..(k + 1) * m]) {
            *gw += sv * gv;
        }
    }
    for a in 0..D1 {
        for ((o, &x), &wu) in wh[a * m..(a + 1) * m]
            .iter_mut()
            .zip(&h[a * m..(a + 1) * m])
            .zip(w)
        {
            *o = wu * x;
        }
        for k in 0..D3 {
            gt[a * D3 + k] = dot(&wh[a * m..(a + 1) * m], &g[k * m..(k + 1) * m]);
        }
    }
}

/// gh[a][u] += w[u]·Σ_k T[a,k] g[k][u]. `wg` is scratch of D3·mul.
#[inline(always)]
fn bwd_h_kernel<T: Real, const D1: usize, const D3: usize>(
    t: &[T],
    w: &[T],
    g: &[T],
    wg: &mut [T],
    gh: &mut [T],
) {
    let m = w.len();
    for k in 0..D3 {
        for ((o, &x), &wu) in wg[k * m..(k + 1) * m]
            .iter_mut()
            .zip(&g[k * m..(k + 1) * m])
            .zip(w)
        {
            *o = wu * x;
        }
    }
    for a in 0..D1 {
        let o = &mut gh[a * m..(a + 1) * m];
        for k in 0..D3 {
            axpy(t[a * D3 + k], &wg[k * m..(k + 1) * m], o);
        }
    }
}

/// Copies per step of the single-pass kernels (one AVX2 vector of `f32`).
///
/// The backward kernel accumulates the weight and feature gradients with
/// fused multiply-adds (`mul_add`: one rounding per product and sum), the
/// filter gradient and the forward with separate roundings (with fused
/// ones there too, SevenNet-l3i5's f32 forces on one fixture structure
/// went from within to 1.22× upstream's own f32 gap). The AVX2 and AVX-512
/// copies run `mul_add` as FMA instructions; the baseline copy calls the
/// exactly rounded `fma` of the C library, so every copy gives the same
/// bits (on x86 CPUs without FMA, which predate AVX2, the baseline is
/// slow).
const LANES: usize = 8;

/// `LANES` consecutive values of `x` from `start` (one bounds check for
/// the group, none per element).
#[inline(always)]
fn lanes<T: Real>(x: &[T], start: usize) -> [T; LANES] {
    let group = &x[start..start + LANES];
    std::array::from_fn(|l| group[l])
}

/// The `D` rows of `m` values of a component-major block.
#[inline(always)]
fn rows<T, const D: usize>(x: &[T], m: usize) -> [&[T]; D] {
    std::array::from_fn(|c| &x[c * m..(c + 1) * m])
}

/// `out[k][u] += Σ_a T[a,k]·w[u]·h[a][u]` (`h`: D1·mul, `out`: D3·mul,
/// component-major) in one pass over the copies: per group of `LANES`
/// copies, h and w are read once and every output component is updated
/// while they sit in registers. Products `w[u]·h[a][u]` first, then the sum
/// over a in order.
#[inline(always)]
fn fwd_kernel_1pass<T: Real, const D1: usize, const D3: usize>(
    h: &[T],
    t: &[T],
    w: &[T],
    out: &mut [T],
) {
    let m = w.len();
    let h: [&[T]; D1] = rows(h, m);
    let tt: [[T; D3]; D1] = std::array::from_fn(|a| std::array::from_fn(|k| t[a * D3 + k]));
    let full = m - m % LANES;
    for u0 in (0..full).step_by(LANES) {
        let wv = lanes(w, u0);
        let wh: [[T; LANES]; D1] = std::array::from_fn(|a| {
            let hv = lanes(h[a], u0);
            std::array::from_fn(|l| wv[l] * hv[l])
        });
        for (k, o) in out.chunks_exact_mut(m).take(D3).enumerate() {
            let o = &mut o[u0..u0 + LANES];
            for a in 0..D1 {
                for l in 0..LANES {
                    o[l] += tt[a][k] * wh[a][l];
                }
            }
        }
    }
    for u in full..m {
        for (k, o) in out.chunks_exact_mut(m).take(D3).enumerate() {
            for a in 0..D1 {
                o[u] += tt[a][k] * (w[u] * h[a][u]);
            }
        }
    }
}

/// The whole backward of one edge and one path in one pass over the copies
/// u: with `q[a][u] = Σ_k T[a,k] g[k][u]` (the message gradient pulled
/// back through the filter, shared by two of the three gradients), the
/// weight gradient `grad_w[u] = Σ_a h[a][u]·q[a][u]` (overwritten), the
/// feature gradient `gh[a][u] += w[u]·q[a][u]` (accumulated), and the
/// filter gradient `gt[a,k] = Σ_u w[u] h[a][u] g[k][u]` as `LANES`
/// partial sums per entry, `gtv[a·D3 + k]` (overwritten; copy u adds to
/// lane `u mod LANES`), which [`ConvPaths::filters_adjoint_lanes`] turns
/// into the SH gradient without summing every entry across lanes. `h`,
/// `gh`: D1·mul, `g`: D3·mul, `t`: D1·D3, all component-major. Per group
/// of `LANES` copies, h, g and w are read once. The weight and feature
/// gradients with fused multiply-adds, the filter gradient's products and
/// sums rounded separately.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_kernel_1pass<T: Real, const D1: usize, const D3: usize>(
    h: &[T],
    t: &[T],
    w: &[T],
    g: &[T],
    grad_w: &mut [T],
    gtv: &mut [[T; LANES]],
    gh: &mut [T],
) {
    let m = w.len();
    let (h, g): ([&[T]; D1], [&[T]; D3]) = (rows(h, m), rows(g, m));
    let (grad_w, gtv) = (&mut grad_w[..m], &mut gtv[..D1 * D3]);
    let tt: [[T; D3]; D1] = std::array::from_fn(|a| std::array::from_fn(|k| t[a * D3 + k]));
    let mut acc = [[[T::ZERO; LANES]; D3]; D1];
    let full = m - m % LANES;
    for u0 in (0..full).step_by(LANES) {
        let wv = lanes(w, u0);
        let gv: [[T; LANES]; D3] = std::array::from_fn(|k| lanes(g[k], u0));
        let mut gw = [T::ZERO; LANES];
        for (a, o) in gh.chunks_exact_mut(m).take(D1).enumerate() {
            let hv = lanes(h[a], u0);
            let mut q = [T::ZERO; LANES];
            for k in 0..D3 {
                for l in 0..LANES {
                    q[l] = tt[a][k].mul_add(gv[k][l], q[l]);
                }
            }
            let o = &mut o[u0..u0 + LANES];
            for l in 0..LANES {
                gw[l] = hv[l].mul_add(q[l], gw[l]);
                o[l] = wv[l].mul_add(q[l], o[l]);
            }
            let wh: [T; LANES] = std::array::from_fn(|l| wv[l] * hv[l]);
            for k in 0..D3 {
                for l in 0..LANES {
                    acc[a][k][l] += wh[l] * gv[k][l];
                }
            }
        }
        grad_w[u0..u0 + LANES].copy_from_slice(&gw);
    }
    for u in full..m {
        let l = u - full;
        let mut gw = T::ZERO;
        for (a, o) in gh.chunks_exact_mut(m).take(D1).enumerate() {
            let mut q = T::ZERO;
            for k in 0..D3 {
                q = tt[a][k].mul_add(g[k][u], q);
            }
            gw = h[a][u].mul_add(q, gw);
            o[u] = w[u].mul_add(q, o[u]);
            let wh = w[u] * h[a][u];
            for k in 0..D3 {
                acc[a][k][l] += wh * g[k][u];
            }
        }
        grad_w[u] = gw;
    }
    for a in 0..D1 {
        for k in 0..D3 {
            gtv[a * D3 + k] = acc[a][k];
        }
    }
}

/// Per-task scratch buffers.
struct Scratch<T> {
    /// Filter matrices of every path for one edge.
    t: Vec<T>,
    /// Their gradient.
    gt: Vec<T>,
    /// Their gradient as `LANES` partial sums per entry.
    gtv: Vec<[T; LANES]>,
    /// `max(d1, d3)·mul` products.
    prod: Vec<T>,
    /// `mul` partial sums.
    s: Vec<T>,
    /// One row in component-major layout.
    row: Vec<T>,
}

impl<T: Real> ConvPaths<T> {
    fn scratch(&self, row: usize) -> Scratch<T> {
        let prod = self
            .paths
            .iter()
            .map(|p| p.d1.max(p.d3) * p.mul)
            .max()
            .unwrap_or(0);
        let mul = self.paths.iter().map(|p| p.mul).max().unwrap_or(0);
        Scratch {
            t: vec![T::ZERO; self.t_size],
            gt: vec![T::ZERO; self.t_size],
            gtv: vec![[T::ZERO; LANES]; self.t_size],
            prod: vec![T::ZERO; prod],
            s: vec![T::ZERO; mul],
            row: vec![T::ZERO; row],
        }
    }
}

/// Copies every `(offset, mul, dim)` range of a mul-major row into
/// component-major order (`to_cm`) or back (`!to_cm`).
#[inline(always)]
fn transpose_ranges<T: Real>(
    ranges: &[(usize, usize, usize)],
    src: &[T],
    dst: &mut [T],
    to_cm: bool,
) {
    for &(off, m, d) in ranges {
        for u in 0..m {
            for c in 0..d {
                if to_cm {
                    dst[off + c * m + u] = src[off + u * d + c];
                } else {
                    dst[off + u * d + c] = src[off + c * m + u];
                }
            }
        }
    }
}

/// Rows of `src` (width `dim`) with the given ranges in component-major order.
fn rows_to_cm<T: Real>(ranges: &[(usize, usize, usize)], src: &[T], dim: usize) -> Vec<T> {
    let mut out = crate::work::zeroed(src.len());
    if dim > 0 {
        out.par_chunks_mut(dim)
            .zip(src.par_chunks(dim))
            .for_each(|(o, s)| transpose_ranges(ranges, s, o, true));
    }
    out
}

/// Forward of one receiver row into `out_row` in `out_layout`: its edges
/// summed component-major, in place in the kernels' layout or in scratch
/// and transposed into e3nn's. Row `e` of `w` holds edge e's weights, or
/// with `w_pos0 = Some(p0)`, row `pos − p0` holds the weights of the edge
/// at receiver-CSR position `pos`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fwd_row<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    ht: &[T],
    sh: &[T],
    w: &[T],
    w_pos0: Option<usize>,
    inv_den: T,
    i: usize,
    out_layout: BlockLayout,
    out_row: &mut [T],
    sc: &mut Scratch<T>,
) {
    // Two calls rather than one on a target picked by the layout: with the
    // target chosen at run time the summing loop compiled to code that ran
    // at half the speed.
    match out_layout {
        // In the kernels' own layout the row is summed where it ends up (it
        // stays in cache over the row's edges).
        BlockLayout::ComponentMajor => fwd_row_sum(
            paths, graph, ht, sh, w, w_pos0, inv_den, i, &mut sc.t, out_row,
        ),
        // e3nn's layout: summed in the component-major scratch row (zero
        // where no path writes), then transposed.
        BlockLayout::CopyMajor => {
            fwd_row_sum(
                paths,
                graph,
                ht,
                sh,
                w,
                w_pos0,
                inv_den,
                i,
                &mut sc.t,
                &mut sc.row,
            );
            out_row.fill(T::ZERO);
            transpose_ranges(&paths.out_ranges, &sc.row, out_row, false);
        }
    }
}

/// The message row of receiver `i` in the kernels' component-major layout
/// into `acc` (overwritten), as [`fwd_row`] describes; `t` is filter scratch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fwd_row_sum<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    ht: &[T],
    sh: &[T],
    w: &[T],
    w_pos0: Option<usize>,
    inv_den: T,
    i: usize,
    t: &mut [T],
    acc: &mut [T],
) {
    let (di, dw, ds) = (paths.dim_in, paths.dim_w, paths.dim_sh());
    acc.fill(T::ZERO);
    for pos in graph.center_offsets[i]..graph.center_offsets[i + 1] {
        let e = graph.center_edges[pos] as usize;
        let j = graph.neighbors[e] as usize;
        // `w` is either per edge or per CSR position of a block starting at p0.
        let wr = w_pos0.map_or(e, |p0| pos - p0);
        let (hj, we) = (&ht[j * di..(j + 1) * di], &w[wr * dw..(wr + 1) * dw]);
        paths.filters(&sh[e * ds..(e + 1) * ds], inv_den, t);
        for p in &paths.paths {
            dispatch!(
                p.d1,
                p.d3,
                fwd_kernel_1pass,
                &hj[p.in_off..p.in_off + p.mul * p.d1],
                &t[p.t_off..p.t_off + p.d1 * p.d3],
                &we[p.w_off..p.w_off + p.mul],
                &mut acc[p.out_off..p.out_off + p.mul * p.d3]
            );
        }
    }
}

/// Weight and filter gradients of edge `e` (pass 1 of the backward).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_edge<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    ht: &[T],
    sh: &[T],
    w: &[T],
    gat: &[T],
    inv_den: T,
    e: usize,
    gw: &mut [T],
    gy: &mut [T],
    sc: &mut Scratch<T>,
) {
    let (di, dw, ds, dm) = (paths.dim_in, paths.dim_w, paths.dim_sh(), paths.dim_msg);
    let (i, j) = (graph.centers[e] as usize, graph.neighbors[e] as usize);
    let (hj, we, gi) = (
        &ht[j * di..(j + 1) * di],
        &w[e * dw..(e + 1) * dw],
        &gat[i * dm..(i + 1) * dm],
    );
    paths.filters(&sh[e * ds..(e + 1) * ds], inv_den, &mut sc.t);
    for p in &paths.paths {
        dispatch!(
            p.d1,
            p.d3,
            bwd_edge_kernel,
            &hj[p.in_off..p.in_off + p.mul * p.d1],
            &sc.t[p.t_off..p.t_off + p.d1 * p.d3],
            &we[p.w_off..p.w_off + p.mul],
            &gi[p.out_off..p.out_off + p.mul * p.d3],
            &mut gw[p.w_off..p.w_off + p.mul],
            &mut sc.gt[p.t_off..p.t_off + p.d1 * p.d3],
            &mut sc.s,
            &mut sc.prod
        );
    }
    paths.filters_adjoint(&sc.gt, inv_den, gy);
}

/// Feature gradient of sender row `j` (pass 2 of the backward).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_sender_row<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    sh: &[T],
    w: &[T],
    gat: &[T],
    inv_den: T,
    j: usize,
    gh_row: &mut [T],
    sc: &mut Scratch<T>,
) {
    let (dw, ds, dm) = (paths.dim_w, paths.dim_sh(), paths.dim_msg);
    sc.row.fill(T::ZERO);
    for &e in &graph.neighbor_edges[graph.neighbor_offsets[j]..graph.neighbor_offsets[j + 1]] {
        let e = e as usize;
        let i = graph.centers[e] as usize;
        let (we, gi) = (&w[e * dw..(e + 1) * dw], &gat[i * dm..(i + 1) * dm]);
        paths.filters(&sh[e * ds..(e + 1) * ds], inv_den, &mut sc.t);
        for p in &paths.paths {
            dispatch!(
                p.d1,
                p.d3,
                bwd_h_kernel,
                &sc.t[p.t_off..p.t_off + p.d1 * p.d3],
                &we[p.w_off..p.w_off + p.mul],
                &gi[p.out_off..p.out_off + p.mul * p.d3],
                &mut sc.prod,
                &mut sc.row[p.in_off..p.in_off + p.mul * p.d1]
            );
        }
    }
    gh_row.fill(T::ZERO);
    transpose_ranges(&paths.in_ranges, &sc.row, gh_row, false);
}

use ddmlip_float::Isa;

/// Generates copies of a row kernel compiled for AVX-512 and for AVX2+FMA,
/// and a dispatcher that picks one by [`Isa`]. The arithmetic is identical
/// (no fused multiply-adds are formed from separate `*` and `+`); only the
/// vector width and register count change.
macro_rules! multiversion {
    ($name:ident, $avx512:ident, $avx:ident, $inner:ident, ($($arg:ident : $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $avx512<T: Real>($($arg: $ty),*) {
            $inner($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $avx<T: Real>($($arg: $ty),*) {
            $inner($($arg),*)
        }

        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        fn $name<T: Real>(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            match isa {
                // SAFETY: Isa::detect() returns Avx512 only when the running
                // CPU has AVX-512 F and VL, AVX2 and FMA.
                Isa::Avx512 => return unsafe { $avx512($($arg),*) },
                // SAFETY: Isa::detect() returns Avx2 only when the running
                // CPU has AVX2 and FMA.
                Isa::Avx2 => return unsafe { $avx($($arg),*) },
                Isa::Base => {}
            }
            let _ = isa;
            $inner($($arg),*)
        }
    };
}

multiversion!(fwd_row_mv, fwd_row_avx512, fwd_row_avx2, fwd_row, (
    paths: &ConvPaths<T>, graph: &ConvGraph, ht: &[T], sh: &[T], w: &[T], w_pos0: Option<usize>,
    inv_den: T, i: usize, out_layout: BlockLayout,
    out_row: &mut [T], sc: &mut Scratch<T>
));
multiversion!(bwd_edge_mv, bwd_edge_avx512, bwd_edge_avx2, bwd_edge, (
    paths: &ConvPaths<T>, graph: &ConvGraph, ht: &[T], sh: &[T], w: &[T], gat: &[T], inv_den: T, e: usize,
    gw: &mut [T], gy: &mut [T], sc: &mut Scratch<T>
));
multiversion!(bwd_sender_row_mv, bwd_sender_row_avx512, bwd_sender_row_avx2, bwd_sender_row, (
    paths: &ConvPaths<T>, graph: &ConvGraph, sh: &[T], w: &[T], gat: &[T], inv_den: T, j: usize,
    gh_row: &mut [T], sc: &mut Scratch<T>
));

mod fused;
mod unfused;

pub use fused::{
    radial_conv_backward, radial_conv_backward_with, radial_conv_forward, radial_conv_forward_with,
    EdgeRadial,
};
pub use unfused::{conv_backward, conv_forward};

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed-seed LCG in [-1, 1).
    pub(super) fn values(seed: &mut u64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// The single-pass backward against the multi-pass kernels: the
    /// filter gradient (its lanes summed), the weight and feature
    /// gradients to a few roundings per term (the single pass shares the
    /// filter's pull-back between the weight and feature gradients, fused
    /// multiply-adds, and sums the filter gradient per lane). Every degree
    /// pair, copies below, at and past the lane count, f32 and f64.
    fn single_pass_matches_multi_pass<T: Real, const D1: usize, const D3: usize>(seed: &mut u64) {
        let eps = T::epsilon().to_f64_lossless();
        for m in [1, 7, 8, 13, 32, 64] {
            let conv = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(T::from_f64).collect() };
            let (h, t, w, g) = (
                conv(values(seed, D1 * m)),
                conv(values(seed, D1 * D3)),
                conv(values(seed, m)),
                conv(values(seed, D3 * m)),
            );
            let gh0 = conv(values(seed, D1 * m));
            let (mut gw1, mut gtv, mut gh1) = (
                vec![T::ZERO; m],
                vec![[T::ONE; LANES]; D1 * D3],
                gh0.clone(),
            );
            bwd_kernel_1pass::<T, D1, D3>(&h, &t, &w, &g, &mut gw1, &mut gtv, &mut gh1);
            let gt1: Vec<T> = gtv
                .iter()
                .map(|v| v.iter().fold(T::ZERO, |s, &x| s + x))
                .collect();
            let (mut gw2, mut gt2, mut gh2) = (vec![T::ZERO; m], vec![T::ZERO; D1 * D3], gh0);
            let (mut s, mut wh, mut wg) = (
                vec![T::ZERO; m],
                vec![T::ZERO; D1 * m],
                vec![T::ZERO; D3 * m],
            );
            bwd_edge_kernel::<T, D1, D3>(&h, &t, &w, &g, &mut gw2, &mut gt2, &mut s, &mut wh);
            bwd_h_kernel::<T, D1, D3>(&t, &w, &g, &mut wg, &mut gh2);
            for (name, a, b, terms) in [
                ("filter", &gt1, &gt2, m),
                ("weight", &gw1, &gw2, D1 * D3),
                ("feature", &gh1, &gh2, D3 + 1),
            ] {
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b.iter()) {
                    let (x, y) = (x.to_f64_lossless(), y.to_f64_lossless());
                    assert!(
                        (x - y).abs() <= 4.0 * terms as f64 * eps * (1.0 + y.abs()),
                        "{name} gradient, {D1}x{D3}, mul {m}: {x} vs {y}"
                    );
                }
            }
        }
    }

    /// The filters and both adjoints (entry by entry, and lane-wise with
    /// one sum across lanes per SH component) against a dense f64
    /// contraction with the CG tensors, for every path of features and
    /// spherical harmonics up to l = 3.
    #[test]
    fn filters_and_adjoints_equal_the_dense_contraction() {
        let ir = Irreps::parse("16x0e+8x1o+8x2e+8x3o").expect("irreps");
        let parity = |l: usize| if l.is_multiple_of(2) { 1 } else { -1 };
        let keep = |ir: Irrep| ir.l <= 3;
        let (paths, _, _) =
            ConvPaths::<f64>::uvu_sorted(&ir, 3, parity, keep, crate::wigner::wigner_3j)
                .expect("paths");
        let (raw_paths, _, _) =
            uvu_sorted_paths(&ir, 3, parity, keep, crate::wigner::wigner_3j).expect("raw");
        let mut seed = 11;
        let ds = paths.dim_sh();
        let y = values(&mut seed, ds);
        let gt = values(&mut seed, paths.t_size);
        let inv_den = 0.37;
        // Dense reference from the raw CG tensors, path by path.
        let (mut t_ref, mut gy_ref) = (vec![0.0; paths.t_size], vec![0.0; ds]);
        assert_eq!(raw_paths.len(), paths.paths.len());
        for (raw, p) in raw_paths.iter().zip(&paths.paths) {
            let (d1, d2, d3) = (p.d1, 2 * raw.l2 + 1, p.d3);
            for a in 0..d1 {
                for b in 0..d2 {
                    for k in 0..d3 {
                        let c = raw.path_weight * raw.cg[(a * d2 + b) * d3 + k] * inv_den;
                        let ti = p.t_off + a * d3 + k;
                        t_ref[ti] += c * y[raw.l2 * raw.l2 + b];
                        gy_ref[raw.l2 * raw.l2 + b] += c * gt[ti];
                    }
                }
            }
        }
        let mut t = vec![0.0; paths.t_size];
        paths.filters(&y, inv_den, &mut t);
        let mut gy = vec![0.0; ds];
        paths.filters_adjoint(&gt, inv_den, &mut gy);
        // The same gradient spread over the lanes unevenly.
        let gtv: Vec<[f64; LANES]> = gt
            .iter()
            .map(|&v| std::array::from_fn(|l| v * (l as f64 + 1.0) / 36.0))
            .collect();
        let mut gy_lanes = vec![0.0; ds];
        paths.filters_adjoint_lanes(&gtv, inv_den, &mut gy_lanes);
        let close = |a: &[f64], b: &[f64], what: &str| {
            assert!(
                b.iter().any(|v| v.abs() > 1e-3),
                "{what}: reference all zero"
            );
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-13 * (1.0 + y.abs()),
                    "{what}: {x} vs {y}"
                );
            }
        };
        close(&t, &t_ref, "filters");
        close(&gy, &gy_ref, "adjoint");
        close(&gy_lanes, &gy_ref, "lane-wise adjoint");
    }

    fn every_degree_pair<T: Real>() {
        let mut seed = 7;
        macro_rules! each {
            ($(($a:literal, $b:literal)),*) => {
                $(single_pass_matches_multi_pass::<T, $a, $b>(&mut seed);)*
            };
        }
        each!(
            (1, 1),
            (1, 3),
            (1, 5),
            (1, 7),
            (3, 1),
            (3, 3),
            (3, 5),
            (3, 7),
            (5, 1),
            (5, 3),
            (5, 5),
            (5, 7),
            (7, 1),
            (7, 3),
            (7, 5),
            (7, 7)
        );
    }

    #[test]
    fn single_pass_backward_matches_the_multi_pass_kernels_f64() {
        every_degree_pair::<f64>();
    }

    #[test]
    fn single_pass_backward_matches_the_multi_pass_kernels_f32() {
        every_degree_pair::<f32>();
    }
}
