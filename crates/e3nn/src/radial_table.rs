//! A layer's radial network `r ↦ W(r)` (the edge embedding, then the
//! radial MLP) as a piecewise quintic table over `[0, r_c]`.
//!
//! The per-edge weights depend on the edge length alone, so the whole
//! network is a smooth function of one variable. `W`, `W′` and `W″` are
//! computed in f64 from the network itself (forward-mode derivatives
//! through the embedding and the MLP) at the ends of short intervals; on
//! each interval an edge's weights are the quintic that matches all three
//! at both ends (C² across interval ends), and their gradient is that
//! quintic's derivative, so forces stay the exact gradient of the
//! (interpolated) energy. The table stores each interval's quintic in
//! powers of the position t ∈ [0, 1] within it, so rounding the entries to
//! f32 costs the derivative only f32's relative rounding of each term (a
//! difference of two rounded node values would lose a factor 1/h). Per
//! edge this costs `6·W` multiply-adds forward and backward, against the
//! MLP's `2·(8·64 + 64·64 + 64·W)` per pass (three passes per step).
//!
//! `[0, r_c]` is cut into equal cells (the cutoff function's switch point,
//! XPLOR's `r_on` where its second derivative jumps, on a cell end), and
//! each cell into 2^level equal intervals, halved until the interpolant's
//! errors — in value at the intervals' midpoints and in derivative at
//! their quarter points, near where each peaks — against the network
//! evaluated there in f64 are below a tolerance relative to each weight's
//! scale. Short lengths, where the network varies fastest, get the finest
//! intervals.

use crate::error::{check_len, E3nnError};
use crate::gemm::matmul;
use crate::radial::{nsilu, nsilu_grad, EdgeEmbedding, RadialMlp, SILU_NORM};
use crate::real::Real;
use rayon::prelude::*;

/// Fewest cells a table has.
const MIN_CELLS: usize = 64;
/// Most cells a table may have while searching for a number of them that
/// puts the switch points on cell ends.
const MAX_CELLS: usize = 1024;
/// Most intervals one cell may be split into.
const MAX_CELL_INTERVALS: usize = 256;
/// Coefficients per weight and interval (a quintic).
const TERMS: usize = 6;
/// Weights per group in the evaluation loops (and partial sums of the
/// backward's dot product, summed in a fixed order).
const LANES: usize = 8;

/// Error bound the f32 path builds its tables to, relative to each
/// weight's scale: 1/8 of f32's unit roundoff (2⁻²⁴) for values, the unit
/// roundoff for derivatives. Measured on SevenNet-0: looser derivatives
/// (4× this) leave a coherent stress error on a rattled crystal 2.7× the
/// f32 network's; from this bound down the f32 results' own rounding
/// dominates.
pub const F32_TABLE_TOLERANCE: TableTolerance = TableTolerance {
    value: 0.125 / 16_777_216.0,
    derivative: 1.0 / 16_777_216.0,
};

/// How close a [`RadialTable`] must come to its network, relative to each
/// weight's scale (its largest |W_w|, resp. |W′_w|, over `[0, r_c]`,
/// floored at 1e-3 of the largest over all weights).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TableTolerance {
    /// Bound on the value error.
    pub value: f64,
    /// Bound on the derivative error (forces).
    pub derivative: f64,
}

/// Columns of a length as the table reads it: `hi` (the length rounded to
/// `T`) and `lo` (the rest, rounded to `T`), so that an f32 table sees the
/// length of an edge as exactly as its f32 vector gives it. Rounded to f32
/// alone, a length's error would move `W` coherently by `W′·δr`, several
/// times the rounding of the weights themselves.
pub const LENGTH_COLUMNS: usize = 2;

/// The columns [`LENGTH_COLUMNS`] of a length `r` (Å) in precision `T`.
#[inline]
pub fn split_length<T: Real>(r: f64) -> [T; 2] {
    let hi = T::from_f64(r);
    [hi, T::from_f64(r - hi.to_f64_lossless())]
}

/// `W(r)` of one layer as quintic pieces over `[0, cutoff]` (Å): equal
/// cells, each split into 2^level equal intervals (finer where the network
/// varies faster, at short lengths).
#[derive(Clone, Debug)]
pub struct RadialTable<T> {
    /// Cells per Å.
    inv_cell: f64,
    /// Per cell: its first interval's index and log2 of its intervals.
    cells: Vec<(u32, u32)>,
    dim_out: usize,
    /// Interval k at `k·TERMS·dim_out`: its quintic's coefficients
    /// `a0..a5` of `Σ a_j t^j`, t ∈ [0, 1] across the interval (dim_out
    /// each).
    coeffs: Vec<T>,
    /// Largest error found while building (f64, before rounding to `T`),
    /// as a fraction of the tolerance asked (≤ 1).
    max_error: f64,
}

/// The network's values and derivatives at some lengths, in f64: rows ×
/// dim_out each.
struct Samples {
    value: Vec<f64>,
    d1: Vec<f64>,
    d2: Vec<f64>,
}

/// φ″ of the normalised SiLU.
fn nsilu_grad2(s: f64) -> f64 {
    let sig = 1.0 / (1.0 + (-s).exp());
    SILU_NORM * sig * (1.0 - sig) * (2.0 + s * (1.0 - 2.0 * sig))
}

/// `W`, `W′` and `W″` of the network at `radii`.
fn network_samples(embedding: &EdgeEmbedding, mlp: &RadialMlp<f64>, radii: &[f64]) -> Samples {
    let n = radii.len();
    let nb = embedding.n_basis();
    // Rows 0..n: the embedding; n..2n: its first derivative along r;
    // 2n..3n: its second. Every layer's product is linear, so the three
    // share one GEMM.
    let mut x = vec![0.0; 3 * n * nb];
    {
        let (v, rest) = x.split_at_mut(n * nb);
        let (t1, t2) = rest.split_at_mut(n * nb);
        for (k, &r) in radii.iter().enumerate() {
            let span = k * nb..(k + 1) * nb;
            embedding.derivatives(
                r,
                &mut v[span.clone()],
                &mut t1[span.clone()],
                &mut t2[span],
            );
        }
    }
    let layers = mlp.layers();
    let last = layers.len() - 1;
    for (k, (i, o, w)) in layers.into_iter().enumerate() {
        let mut z = vec![0.0; 3 * n * o];
        matmul(3 * n, i, o, &x, w, &mut z);
        if k < last {
            let (zv, rest) = z.split_at_mut(n * o);
            let (z1, z2) = rest.split_at_mut(n * o);
            for ((v, a), b) in zv.iter_mut().zip(z1.iter_mut()).zip(z2.iter_mut()) {
                let (g1, g2) = (nsilu_grad(*v), nsilu_grad2(*v));
                *b = g2 * *a * *a + g1 * *b;
                *a *= g1;
                *v = nsilu(*v);
            }
        }
        x = z;
    }
    let dw = mlp.dim_out();
    let d2 = x.split_off(2 * n * dw);
    let d1 = x.split_off(n * dw);
    Samples { value: x, d1, d2 }
}

/// Per interval, the quintic `Σ a_j t^j` (t ∈ [0, 1]) matching value,
/// first and second derivative (per Å) of `nodes` at both ends, the nodes
/// `h` apart: `a0..a5` (dim_out each) per interval.
fn quintic_coefficients(nodes: &Samples, h: f64, dw: usize) -> Vec<f64> {
    let n = nodes.value.len() / dw.max(1) - 1;
    let mut coeffs = vec![0.0; n * TERMS * dw];
    for (k, c) in coeffs.chunks_exact_mut(TERMS * dw.max(1)).enumerate() {
        for w in 0..dw {
            let (i0, i1) = (k * dw + w, (k + 1) * dw + w);
            let (y0, y1) = (nodes.value[i0], nodes.value[i1]);
            let (d0, d1) = (h * nodes.d1[i0], h * nodes.d1[i1]);
            let (s0, s1) = (h * h * nodes.d2[i0], h * h * nodes.d2[i1]);
            // What the quadratic a0 + a1 t + a2 t² leaves at t = 1.
            let dy = y1 - y0 - d0 - 0.5 * s0;
            let dd = d1 - d0 - s0;
            let ds = s1 - s0;
            c[w] = y0;
            c[dw + w] = d0;
            c[2 * dw + w] = 0.5 * s0;
            c[3 * dw + w] = 10.0 * dy - 4.0 * dd + 0.5 * ds;
            c[4 * dw + w] = -15.0 * dy + 7.0 * dd - ds;
            c[5 * dw + w] = 6.0 * dy - 3.0 * dd + 0.5 * ds;
        }
    }
    coeffs
}

/// Value and derivative (per unit t) of `Σ a_j t^j` at `t` for weight `w`
/// of one interval's coefficients `c`.
fn poly_at(c: &[f64], dw: usize, w: usize, t: f64) -> (f64, f64) {
    let (mut p, mut dp) = (0.0, 0.0);
    for j in (0..TERMS).rev() {
        p = p * t + c[j * dw + w];
        if j > 0 {
            dp = dp * t + j as f64 * c[j * dw + w];
        }
    }
    (p, dp)
}

/// Each weight's largest |value| over `rows` (rows × dw), floored at 1e-3
/// of the largest over all weights: a weight that is nearly zero
/// everywhere would otherwise be held to the f64 rounding of the others.
fn column_scales(rows: &[f64], dw: usize) -> Vec<f64> {
    let mut sc = vec![0.0f64; dw];
    for row in rows.chunks_exact(dw.max(1)) {
        for (s, v) in sc.iter_mut().zip(row) {
            *s = s.max(v.abs());
        }
    }
    let top = sc.iter().fold(0.0f64, |m, &v| m.max(v));
    sc.iter_mut().for_each(|s| *s = s.max(1e-3 * top));
    sc
}

fn all_finite(s: &Samples) -> bool {
    s.value
        .iter()
        .chain(&s.d1)
        .chain(&s.d2)
        .all(|x| x.is_finite())
}

/// One cell `[r0, r0 + width]` of a table: its level (log2 of its
/// intervals), the intervals' coefficients (as [`quintic_coefficients`])
/// and the largest error as a fraction of the tolerance, halving the
/// intervals until that is at most 1.
fn refine_cell(
    embedding: &EdgeEmbedding,
    mlp: &RadialMlp<f64>,
    (r0, width): (f64, f64),
    (scale, dscale): (&[f64], &[f64]),
    tol: TableTolerance,
) -> Result<(u32, Vec<f64>, f64), E3nnError> {
    let dw = mlp.dim_out();
    let (mut n, mut level) = (1usize, 0u32);
    let mut nodes = network_samples(embedding, mlp, &[r0, r0 + width]);
    loop {
        let h = width / n as f64;
        let at = |t: f64| -> Vec<f64> { (0..n).map(|k| r0 + h * (k as f64 + t)).collect() };
        let mid = network_samples(embedding, mlp, &at(0.5));
        let (q0, q1) = (
            network_samples(embedding, mlp, &at(0.25)),
            network_samples(embedding, mlp, &at(0.75)),
        );
        if ![&nodes, &mid, &q0, &q1].into_iter().all(all_finite) {
            return Err(E3nnError::Config(format!(
                "radial table: the radial network is not finite between {r0:.4} and {:.4} Å",
                r0 + width
            )));
        }
        let coeffs = quintic_coefficients(&nodes, h, dw);
        let mut err = 0.0f64;
        for (k, c) in coeffs.chunks_exact(TERMS * dw.max(1)).enumerate() {
            for w in 0..dw {
                let i = k * dw + w;
                let (p, _) = poly_at(c, dw, w, 0.5);
                let (_, dp0) = poly_at(c, dw, w, 0.25);
                let (_, dp1) = poly_at(c, dw, w, 0.75);
                err = err.max((p - mid.value[i]).abs() / (tol.value * scale[w]));
                let de = (dp0 / h - q0.d1[i]).abs().max((dp1 / h - q1.d1[i]).abs());
                err = err.max(de / (tol.derivative * dscale[w]));
            }
        }
        if err <= 1.0 {
            return Ok((level, coeffs, err));
        }
        if 2 * n > MAX_CELL_INTERVALS {
            return Err(E3nnError::Config(format!(
                "radial table: {n} intervals between {r0:.4} and {:.4} Å leave {err:.1}× the error asked",
                r0 + width
            )));
        }
        // The midpoints become nodes of the finer split.
        let merge = |a: &[f64], b: &[f64]| {
            let mut out = Vec::with_capacity((2 * n + 1) * dw);
            for k in 0..=n {
                out.extend_from_slice(&a[k * dw..(k + 1) * dw]);
                if k < n {
                    out.extend_from_slice(&b[k * dw..(k + 1) * dw]);
                }
            }
            out
        };
        nodes = Samples {
            value: merge(&nodes.value, &mid.value),
            d1: merge(&nodes.d1, &mid.d1),
            d2: merge(&nodes.d2, &mid.d2),
        };
        (n, level) = (2 * n, level + 1);
    }
}

/// The smallest number of cells in `MIN_CELLS..=MAX_CELLS` whose ends
/// include every breakpoint (within 1e-12 of a cell width), if any.
fn first_cells(cutoff: f64, breakpoints: &[f64]) -> Option<usize> {
    (MIN_CELLS..=MAX_CELLS).find(|&n| {
        breakpoints.iter().all(|&b| {
            let s = b / cutoff * n as f64;
            (s - s.round()).abs() <= 1e-12 * n as f64
        })
    })
}

impl<T: Real> RadialTable<T> {
    /// Tabulates `mlp(embedding(r))` over `[0, embedding.cutoff]`: the
    /// fewest cells (at least 64) that put the cutoff function's switch
    /// points on cell ends, each split until its errors (computed in f64)
    /// are within `tol`; the entries are then rounded to `T` cell by cell
    /// (no f64 copy of the whole table exists). An error names the cell
    /// where 256 intervals do not suffice, or where the network is not
    /// finite.
    pub fn build(
        embedding: &EdgeEmbedding,
        mlp: &RadialMlp<f64>,
        tol: TableTolerance,
    ) -> Result<Self, E3nnError> {
        let (nb, dw) = (embedding.n_basis(), mlp.dim_out());
        if mlp.dim_in() != nb {
            return Err(E3nnError::Config(format!(
                "radial table: the MLP reads {} inputs, the embedding has {nb}",
                mlp.dim_in()
            )));
        }
        let cutoff = embedding.cutoff;
        if !(cutoff.is_finite() && cutoff > 0.0 && tol.value > 0.0 && tol.derivative > 0.0) {
            return Err(E3nnError::Config(format!(
                "radial table: cutoff {cutoff} Å and tolerances {tol:?} must be positive"
            )));
        }
        let breakpoints = embedding.breakpoints();
        let n_cells = first_cells(cutoff, &breakpoints).ok_or_else(|| {
            E3nnError::Config(format!(
                "radial table: no grid of {MIN_CELLS} to {MAX_CELLS} cells over {cutoff} Å has the cutoff function's switch points {breakpoints:?} on cell ends"
            ))
        })?;
        let cell = cutoff / n_cells as f64;
        // The weights' scales, from 8 samples per cell.
        let grid: Vec<f64> = (0..=8 * n_cells)
            .map(|k| cutoff * k as f64 / (8 * n_cells) as f64)
            .collect();
        let samples = network_samples(embedding, mlp, &grid);
        if !all_finite(&samples) {
            return Err(E3nnError::Config(
                "radial table: the radial network is not finite on [0, cutoff]".into(),
            ));
        }
        let scale = column_scales(&samples.value, dw);
        let dscale = column_scales(&samples.d1, dw);
        let pieces: Vec<(u32, Vec<T>, f64)> = (0..n_cells)
            .into_par_iter()
            .map(|c| {
                refine_cell(
                    embedding,
                    mlp,
                    (c as f64 * cell, cell),
                    (&scale, &dscale),
                    tol,
                )
                .map(|(level, c, err)| (level, c.iter().map(|&v| T::from_f64(v)).collect(), err))
            })
            .collect::<Result<_, _>>()?;
        let mut cells = Vec::with_capacity(n_cells);
        let (mut coeffs, mut max_error, mut start) = (Vec::new(), 0.0f64, 0u32);
        for (level, c, err) in pieces {
            cells.push((start, level));
            start += 1 << level;
            coeffs.extend_from_slice(&c);
            max_error = max_error.max(err);
        }
        Ok(Self {
            inv_cell: n_cells as f64 / cutoff,
            cells,
            dim_out: dw,
            coeffs,
            max_error,
        })
    }
}

impl<T: Real> RadialTable<T> {
    /// Weights per edge (columns of the output).
    pub fn dim_out(&self) -> usize {
        self.dim_out
    }

    /// Number of intervals over `[0, cutoff]`.
    pub fn intervals(&self) -> usize {
        self.coeffs.len() / (TERMS * self.dim_out.max(1))
    }

    /// Number of cells (each split into a power of two of intervals).
    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    /// The largest error found while building, as a fraction of the
    /// tolerance asked (in f64, before rounding to `T`; at most 1).
    pub fn error_fraction(&self) -> f64 {
        self.max_error
    }

    /// Bytes of the table's entries.
    pub fn bytes(&self) -> usize {
        self.coeffs.len() * std::mem::size_of::<T>()
    }

    /// Interval index, position t ∈ [0, 1] within it, and intervals per Å
    /// there, for the length `r` (its [`LENGTH_COLUMNS`], Å). Lengths at or
    /// past the cutoff (within rounding: the neighbour list keeps r ≤ r_c)
    /// use the last interval's quintic; a NaN length gives NaN.
    #[inline(always)]
    fn locate(&self, r: &[T]) -> (usize, T, f64) {
        let s = (r[0].to_f64_lossless() + r[1].to_f64_lossless()) * self.inv_cell;
        let c = (s.max(0.0) as usize).min(self.cells.len() - 1);
        let (start, level) = self.cells[c];
        let m = (1u32 << level) as f64;
        let u = (s - c as f64) * m;
        let j = (u.max(0.0) as usize).min((1usize << level) - 1);
        (
            start as usize + j,
            T::from_f64(u - j as f64),
            self.inv_cell * m,
        )
    }

    /// The coefficients `a0..a5` of interval `k`'s quintic.
    #[inline(always)]
    fn quintic(&self, k: usize) -> [&[T]; TERMS] {
        let dw = self.dim_out;
        let a = &self.coeffs[k * TERMS * dw..(k + 1) * TERMS * dw];
        std::array::from_fn(|j| &a[j * dw..(j + 1) * dw])
    }

    /// `out` (rows × dim_out) from edge lengths `r` (rows × [`LENGTH_COLUMNS`]), Å.
    #[inline(always)]
    pub(crate) fn forward_rows(&self, r: &[T], out: &mut [T]) {
        let dw = self.dim_out;
        for (re, o) in r
            .chunks_exact(LENGTH_COLUMNS)
            .zip(out.chunks_exact_mut(dw.max(1)))
        {
            let (k, t, _) = self.locate(re);
            let a = self.quintic(k);
            let p = powers(t);
            // Whole groups of LANES weights, slices of a constant length so
            // that the loop has no bounds checks and vectorises.
            let full = dw / LANES * LANES;
            for w0 in (0..full).step_by(LANES) {
                let s = w0..w0 + LANES;
                let (o, b) = (&mut o[s.clone()], a.map(|x| &x[s.clone()]));
                for l in 0..LANES {
                    o[l] = value(&p, b, l);
                }
            }
            for w in full..dw {
                o[w] = value(&p, a, w);
            }
        }
    }

    /// [`Self::forward_rows`] (the same `out`, bit for bit) that also
    /// writes each weight's slope `∂W/∂t` within its interval into `slope`
    /// (rows × dim_out), for [`Self::backward_rows_from_slope`]: one read
    /// of the coefficients serves the weights and their gradient.
    #[inline(always)]
    pub(crate) fn forward_rows_with_slope(&self, r: &[T], out: &mut [T], slope: &mut [T]) {
        let dw = self.dim_out;
        for ((re, o), d) in r
            .chunks_exact(LENGTH_COLUMNS)
            .zip(out.chunks_exact_mut(dw.max(1)))
            .zip(slope.chunks_exact_mut(dw.max(1)))
        {
            let (k, t, _) = self.locate(re);
            let a = self.quintic(k);
            let (p, c) = (powers(t), slope_factors(t));
            let full = dw / LANES * LANES;
            for w0 in (0..full).step_by(LANES) {
                let s = w0..w0 + LANES;
                let b = a.map(|x| &x[s.clone()]);
                let (o, d) = (&mut o[s.clone()], &mut d[s]);
                for l in 0..LANES {
                    o[l] = value(&p, b, l);
                    d[l] = slope_at(&c, b, l);
                }
            }
            for w in full..dw {
                o[w] = value(&p, a, w);
                d[w] = slope_at(&c, a, w);
            }
        }
    }

    /// `grad_r[e, 0] = Σ_w grad_out[e,w]·∂W_w/∂r` and `grad_r[e, 1] = 0`
    /// (overwrites; rows × [`LENGTH_COLUMNS`]), the derivative of the
    /// quintic [`Self::forward_rows`] evaluates. The sums run in eight
    /// lanes in a fixed order, so every instruction set gives the same bits.
    #[inline(always)]
    pub(crate) fn backward_rows(&self, r: &[T], grad_out: &[T], grad_r: &mut [T]) {
        let dw = self.dim_out;
        for ((re, g), gr) in r
            .chunks_exact(LENGTH_COLUMNS)
            .zip(grad_out.chunks_exact(dw.max(1)))
            .zip(grad_r.chunks_exact_mut(LENGTH_COLUMNS))
        {
            let (k, t, inv_h) = self.locate(re);
            // g·∂W/∂t in LANES partial sums, ∂W_w/∂t = Σ_{j≥1} j·t^(j−1)·a_j[w].
            let c = slope_factors(t);
            let a = self.quintic(k);
            let mut acc = [T::ZERO; LANES];
            let full = dw / LANES * LANES;
            for w0 in (0..full).step_by(LANES) {
                let s = w0..w0 + LANES;
                let (g, b) = (&g[s.clone()], a.map(|x| &x[s.clone()]));
                for l in 0..LANES {
                    acc[l] += g[l] * slope_at(&c, b, l);
                }
            }
            for w in full..dw {
                acc[w - full] += g[w] * slope_at(&c, a, w);
            }
            length_gradient(&acc, inv_h, gr);
        }
    }

    /// [`Self::backward_rows`] (the same `grad_r`, bit for bit) from the
    /// slopes that [`Self::forward_rows_with_slope`] wrote for the same
    /// lengths: a dot product per edge, no coefficient read.
    #[inline(always)]
    pub(crate) fn backward_rows_from_slope(
        &self,
        r: &[T],
        grad_out: &[T],
        slope: &[T],
        grad_r: &mut [T],
    ) {
        let dw = self.dim_out;
        for (((re, g), d), gr) in r
            .chunks_exact(LENGTH_COLUMNS)
            .zip(grad_out.chunks_exact(dw.max(1)))
            .zip(slope.chunks_exact(dw.max(1)))
            .zip(grad_r.chunks_exact_mut(LENGTH_COLUMNS))
        {
            let (_, _, inv_h) = self.locate(re);
            let mut acc = [T::ZERO; LANES];
            let full = dw / LANES * LANES;
            for w0 in (0..full).step_by(LANES) {
                let s = w0..w0 + LANES;
                let (g, d) = (&g[s.clone()], &d[s]);
                for l in 0..LANES {
                    acc[l] += g[l] * d[l];
                }
            }
            for w in full..dw {
                acc[w - full] += g[w] * d[w];
            }
            length_gradient(&acc, inv_h, gr);
        }
    }

    /// `out` (E × dim_out) from edge lengths `r` (E × [`LENGTH_COLUMNS`],
    /// [`split_length`]), over rows in parallel.
    pub fn forward(&self, r: &[T], out: &mut [T]) -> Result<(), E3nnError> {
        let ne = r.len() / LENGTH_COLUMNS;
        check_len("radial table lengths", ne * LENGTH_COLUMNS, r.len())?;
        check_len("radial table output", ne * self.dim_out, out.len())?;
        out.par_chunks_mut(256 * self.dim_out.max(1))
            .zip(r.par_chunks(256 * LENGTH_COLUMNS))
            .for_each(|(o, r)| self.forward_rows(r, o));
        Ok(())
    }

    /// Gradient w.r.t. the lengths (`grad_r`, E × [`LENGTH_COLUMNS`], the
    /// length's in column 0, zero in column 1; overwritten) from `grad_out`
    /// (E × dim_out).
    pub fn backward(&self, r: &[T], grad_out: &[T], grad_r: &mut [T]) -> Result<(), E3nnError> {
        let ne = r.len() / LENGTH_COLUMNS;
        check_len("radial table lengths", ne * LENGTH_COLUMNS, r.len())?;
        check_len("radial table grad_out", ne * self.dim_out, grad_out.len())?;
        check_len("radial table grad_r", r.len(), grad_r.len())?;
        grad_r
            .par_chunks_mut(256 * LENGTH_COLUMNS)
            .zip(r.par_chunks(256 * LENGTH_COLUMNS))
            .zip(grad_out.par_chunks(256 * self.dim_out.max(1)))
            .for_each(|((gr, r), g)| self.backward_rows(r, g, gr));
        Ok(())
    }
}

/// `t, t², …, t⁵` for [`value`].
#[inline(always)]
fn powers<T: Real>(t: T) -> [T; 5] {
    let (t2, t3) = (t * t, t * t * t);
    [t, t2, t3, t2 * t2, t2 * t3]
}

/// Weight `l` of the quintic with coefficient groups `b` at the powers `p`.
#[inline(always)]
fn value<T: Real>(p: &[T; 5], b: [&[T]; TERMS], l: usize) -> T {
    b[0][l]
        + ((p[0] * b[1][l] + p[1] * b[2][l]) + (p[2] * b[3][l] + (p[3] * b[4][l] + p[4] * b[5][l])))
}

/// `2t, 3t², 4t³, 5t⁴` for [`slope_at`].
#[inline(always)]
fn slope_factors<T: Real>(t: T) -> [T; 4] {
    let (t2, t3) = (t * t, t * t * t);
    [
        T::from_f64(2.0) * t,
        T::from_f64(3.0) * t2,
        T::from_f64(4.0) * t3,
        T::from_f64(5.0) * t2 * t2,
    ]
}

/// `∂W_l/∂t = Σ_{j≥1} j·t^(j−1)·a_j[l]` of the quintic with coefficient
/// groups `b`, at the factors `c` of [`slope_factors`].
#[inline(always)]
fn slope_at<T: Real>(c: &[T; 4], b: [&[T]; TERMS], l: usize) -> T {
    b[1][l] + ((c[0] * b[2][l] + c[1] * b[3][l]) + (c[2] * b[4][l] + c[3] * b[5][l]))
}

/// The length's gradient from the lanes of `Σ_w g_w·∂W_w/∂t`, summed in a
/// fixed order, times the intervals per Å: in the `hi` column, as `lo` is
/// a constant correction (the gradient with respect to the edge vector
/// goes through `hi`'s).
#[inline(always)]
fn length_gradient<T: Real>(acc: &[T; LANES], inv_h: f64, gr: &mut [T]) {
    let s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    gr[0] = s * T::from_f64(inv_h);
    gr[1] = T::ZERO;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::radial::CutoffFunction;

    /// Lengths as the table reads them.
    fn split<T: Real>(r: &[f64]) -> Vec<T> {
        r.iter().flat_map(|&v| split_length::<T>(v)).collect()
    }

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// `n` random lengths in [0.05, 5) Å.
    fn lengths(n: usize, seed: &mut u64) -> Vec<f64> {
        (0..n)
            .map(|_| 0.05 + 4.95 * (0.5 + 0.5 * lcg(seed)))
            .collect()
    }

    /// SevenNet-0's embedding shape: 8 Bessel functions, polynomial
    /// envelope p = 6, 5 Å.
    pub(crate) fn sevennet0_like_embedding() -> EdgeEmbedding {
        EdgeEmbedding {
            freqs: (1..=8)
                .map(|n| n as f64 * std::f64::consts::PI / 5.0)
                .collect(),
            cutoff: 5.0,
            envelope: CutoffFunction::Polynomial { p: 6 },
        }
    }

    /// [`sevennet0_like_embedding`] and a random 8 → 64 → 64 → 40 MLP.
    fn network(seed: u64) -> (EdgeEmbedding, RadialMlp<f64>) {
        network_of_width(seed, 40)
    }

    /// [`sevennet0_like_embedding`] and a random 8 → 64 → 64 → `dw` MLP.
    fn network_of_width(seed: u64, dw: usize) -> (EdgeEmbedding, RadialMlp<f64>) {
        let emb = sevennet0_like_embedding();
        let widths = [8, 64, 64, dw];
        let mut s = seed;
        let mats: Vec<Vec<f64>> = (0..3)
            .map(|k| {
                (0..widths[k] * widths[k + 1])
                    .map(|_| 2.0 * lcg(&mut s))
                    .collect()
            })
            .collect();
        (emb, RadialMlp::new(&widths, &mats).expect("mlp"))
    }

    /// The network at `r` through the crate's own embedding and MLP forward.
    fn exact(emb: &EdgeEmbedding, mlp: &RadialMlp<f64>, r: &[f64]) -> Vec<f64> {
        let mut e = vec![0.0; r.len() * emb.n_basis()];
        emb.forward(r, &mut e).expect("embedding");
        let mut w = vec![0.0; r.len() * mlp.dim_out()];
        mlp.forward(&e, r.len(), &mut w).expect("mlp");
        w
    }

    /// The backward's one-read path — weights with their slopes, then the
    /// length gradient from the slopes — gives the bits of the separate
    /// forward and backward, in f32 and f64, with a width that leaves a
    /// tail after the whole lane groups (40 = 5·8 is whole; 44 is not).
    fn slopes_agree<T: Real>(tol: TableTolerance) {
        let mut s = 17u64;
        for (emb, mlp) in [network(3), network_of_width(4, 44)] {
            let table = RadialTable::<T>::build(&emb, &mlp, tol).expect("table");
            let dw = table.dim_out();
            let r: Vec<f64> = (0..500).map(|_| 2.5 + 2.5 * lcg(&mut s)).collect();
            let r = split::<T>(&r);
            let g: Vec<T> = (0..500 * dw).map(|_| T::from_f64(lcg(&mut s))).collect();
            let (mut w, mut w2, mut slope) = (
                vec![T::ZERO; g.len()],
                vec![T::ZERO; g.len()],
                vec![T::ZERO; g.len()],
            );
            let (mut gr, mut gr2) = (vec![T::ZERO; r.len()], vec![T::ZERO; r.len()]);
            table.forward_rows(&r, &mut w);
            table.backward_rows(&r, &g, &mut gr);
            table.forward_rows_with_slope(&r, &mut w2, &mut slope);
            table.backward_rows_from_slope(&r, &g, &slope, &mut gr2);
            let bits = |v: &[T]| {
                v.iter()
                    .map(|x| x.to_f64_lossless().to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&w), bits(&w2), "weights, width {dw}");
            assert_eq!(bits(&gr), bits(&gr2), "length gradients, width {dw}");
            assert!(gr.iter().step_by(2).any(|x| x.to_f64_lossless() != 0.0));
        }
    }

    #[test]
    fn the_slope_path_gives_the_bits_of_forward_and_backward() {
        slopes_agree::<f32>(F32_TABLE_TOLERANCE);
        slopes_agree::<f64>(TableTolerance {
            value: 1e-9,
            derivative: 1e-9,
        });
    }

    /// At random lengths the table equals the network (computed by the
    /// embedding's and the MLP's own forward, not the builder's) within
    /// the tolerance it was built to; its gradient equals the network's
    /// (the embedding's and MLP's own backward) within the
    /// tolerance it was built to.
    #[test]
    fn the_table_equals_the_network_and_its_gradient() {
        let (emb, mlp) = network(11);
        let tol = 1e-9;
        let table = RadialTable::build(
            &emb,
            &mlp,
            TableTolerance {
                value: tol,
                derivative: tol,
            },
        )
        .expect("table");
        assert!(table.cells() >= MIN_CELLS && table.error_fraction() <= 1.0);
        let mut s = 5u64;
        let r = lengths(3000, &mut s);
        let want = exact(&emb, &mlp, &r);
        let mut got = vec![0.0; want.len()];
        table.forward(&split(&r), &mut got).expect("forward");
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 2.0 * tol * scale, "table error {err:e} of {scale:e}");
        // Gradient: a random upstream gradient through both.
        let g: Vec<f64> = (0..want.len()).map(|_| lcg(&mut s)).collect();
        let mut ge = vec![0.0; r.len() * 8];
        mlp.backward(&exact_emb(&emb, &r), r.len(), &g, &mut ge)
            .expect("mlp backward");
        let mut gr_want = vec![0.0; r.len()];
        emb.backward(&r, &ge, &mut gr_want).expect("emb backward");
        let mut gr2 = vec![0.0; 2 * r.len()];
        table
            .backward(&split(&r), &g, &mut gr2)
            .expect("table backward");
        assert!(gr2.iter().skip(1).step_by(2).all(|&v| v == 0.0));
        let gr: Vec<f64> = gr2.iter().step_by(2).copied().collect();
        let gscale = gr_want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let gerr = gr
            .iter()
            .zip(&gr_want)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            gerr <= 1e-6 * gscale,
            "gradient error {gerr:e} of {gscale:e}"
        );
    }

    fn exact_emb(emb: &EdgeEmbedding, r: &[f64]) -> Vec<f64> {
        let mut e = vec![0.0; r.len() * emb.n_basis()];
        emb.forward(r, &mut e).expect("embedding");
        e
    }

    /// The gradient is the derivative of the values the table gives
    /// (central differences of the table itself), so forces stay the
    /// gradient of the interpolated energy, across interval ends too.
    #[test]
    fn the_gradient_is_the_derivative_of_the_interpolant() {
        let (emb, mlp) = network(3);
        let tol = TableTolerance {
            value: 1e-8,
            derivative: 1e-8,
        };
        let table = RadialTable::build(&emb, &mlp, tol).expect("table");
        let dw = table.dim_out();
        let h = 5.0 / table.intervals() as f64;
        let cell = 5.0 / table.cells() as f64;
        let mut s = 9u64;
        let g: Vec<f64> = (0..dw).map(|_| lcg(&mut s)).collect();
        // Random points and the nodes themselves.
        let mut points: Vec<f64> = (0..50)
            .map(|_| 0.1 + 4.8 * (0.5 + 0.5 * lcg(&mut s)))
            .collect();
        points.extend((1..table.cells()).step_by(7).map(|k| k as f64 * cell));
        for r in points {
            let d = 1e-6 * h;
            let (mut wp, mut wm) = (vec![0.0; dw], vec![0.0; dw]);
            table.forward(&[r + d, 0.0], &mut wp).expect("forward");
            table.forward(&[r - d, 0.0], &mut wm).expect("forward");
            let fd: f64 = (0..dw).map(|w| g[w] * (wp[w] - wm[w]) / (2.0 * d)).sum();
            let mut gr = [0.0; 2];
            table.backward(&[r, 0.0], &g, &mut gr).expect("backward");
            assert!(
                (gr[0] - fd).abs() <= 1e-5 * (1.0 + fd.abs()),
                "r {r}: analytic {} against central difference {fd}",
                gr[0]
            );
        }
    }

    /// The f32 table's weights are within f32 rounding of the network.
    #[test]
    fn the_f32_table_is_within_f32_rounding() {
        let (emb, mlp) = network(7);
        let t32 = RadialTable::<f32>::build(&emb, &mlp, F32_TABLE_TOLERANCE).expect("table");
        let mut s = 1u64;
        let r = lengths(2000, &mut s);
        let want = exact(&emb, &mlp, &r);
        // The table reads each length as its f32 pair, as exact as f64.
        let mut got = vec![0.0f32; want.len()];
        t32.forward(&split::<f32>(&r), &mut got).expect("forward");
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
        assert!(
            err <= 4.0 * f32::EPSILON as f64 * scale,
            "f32 table error {err:e} of {scale:e}"
        );
    }

    /// The builder's forward-mode derivatives of the network (through the
    /// embedding's series and closed forms, the envelope and the MLP)
    /// equal central differences of its values, for both cutoff functions
    /// and on both sides of the Bessel series' switch.
    #[test]
    fn network_derivatives_match_finite_differences() {
        let (mut emb, mlp) = network(4);
        for envelope in [
            CutoffFunction::Polynomial { p: 6 },
            CutoffFunction::Xplor { cutoff_on: 4.5 },
        ] {
            emb.envelope = envelope;
            for r in [0.003, 0.05, 0.31, 1.2, 2.7, 4.2, 4.71] {
                let d = 1e-4;
                let s = network_samples(&emb, &mlp, &[r - d, r, r + d]);
                let dw = mlp.dim_out();
                for w in 0..dw {
                    let (m, c, p) = (s.value[w], s.value[dw + w], s.value[2 * dw + w]);
                    let fd1 = (p - m) / (2.0 * d);
                    let fd2 = (p - 2.0 * c + m) / (d * d);
                    let (d1, d2) = (s.d1[dw + w], s.d2[dw + w]);
                    assert!(
                        (d1 - fd1).abs() <= 1e-6 * (1.0 + d1.abs()),
                        "{envelope:?} r {r}: W′ {d1} against {fd1}"
                    );
                    assert!(
                        (d2 - fd2).abs() <= 1e-3 * (1.0 + d2.abs()),
                        "{envelope:?} r {r}: W″ {d2} against {fd2}"
                    );
                }
            }
        }
    }

    /// A network that is not finite on [0, r_c] is refused, not tabulated.
    #[test]
    fn a_non_finite_network_is_refused() {
        let (emb, _) = network(1);
        let widths = [8, 4, 2];
        let mats = vec![vec![f64::NAN; 32], vec![1.0; 8]];
        let mlp = RadialMlp::new(&widths, &mats).expect("mlp");
        assert!(RadialTable::<f32>::build(&emb, &mlp, F32_TABLE_TOLERANCE).is_err());
    }
}
