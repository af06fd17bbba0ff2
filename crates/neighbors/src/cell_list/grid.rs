//! The bin grid of the cell-list search: bin counts and stencils per axis
//! ([`Grid`]) and the atoms sorted into bins ([`Bins`]).

use super::*;

/// Bin layout: counts, stencil half-widths and the map from fractional
/// coordinate to bin index, per axis.
pub(super) struct Grid {
    pub(super) nbins: [usize; 3],
    pub(super) stencil: [i64; 3],
    /// `Π (2·stencil_k + 1)`, the (bin, image) cells one centre may visit;
    /// infinite when a stencil could not be represented.
    pub(super) stencil_cells: f64,
    /// Fractional coordinate of the lower edge of bin 0 (0 on periodic axes).
    pub(super) origin: [f64; 3],
    /// Bins per unit of fractional coordinate.
    pub(super) bins_per_frac: [f64; 3],
    pub(super) pbc: [bool; 3],
    /// Perpendicular bin width per axis (Å).
    pub(super) width: [f64; 3],
    /// `1 / width` per axis (1/Å), so that the per-row stencil trim
    /// multiplies instead of dividing.
    pub(super) inverse_width: [f64; 3],
    /// The frame's axes are the Cartesian axes (orthorhombic cells, open
    /// systems): per-axis gaps between a centre and a bin are Cartesian
    /// distances, so the stencil can be cut to the bins the cutoff sphere
    /// actually reaches.
    pub(super) trimmed: bool,
}

impl Grid {
    pub(super) fn new(
        frame: &Frame,
        prepared: &crate::Prepared,
        search_radius: f64,
        n_atoms: usize,
    ) -> Self {
        let mut nbins = [1usize; 3];
        let mut extent = [1.0; 3];
        let mut origin = [0.0; 3];
        let per_cutoff = bins_per_cutoff(prepared.estimated_pairs / n_atoms.max(1) as f64);
        for k in 0..3 {
            if !frame.pbc[k] {
                origin[k] = prepared.frac_range[k].0;
                extent[k] = prepared.frac_range[k].1 - prepared.frac_range[k].0;
            }
            let length = extent[k] * frame.heights[k];
            let wanted = (length * per_cutoff / search_radius).floor();
            // Clamp before converting: open systems may span astronomically many cutoffs.
            nbins[k] = if wanted >= 1.0 {
                wanted.min(1e9) as usize
            } else {
                1
            };
        }
        // Bins may be wider than needed but never narrower, so cap their total
        // (sparse open systems would otherwise allocate mostly empty bins).
        let max_bins = 2 * n_atoms + 8;
        while nbins.iter().fold(1usize, |a, &b| a.saturating_mul(b)) > max_bins {
            let widest = (0..3).max_by_key(|&k| nbins[k]).unwrap_or(0);
            nbins[widest] = nbins[widest].div_ceil(2);
        }
        let mut stencil = [0i64; 3];
        let mut stencil_cells = 1.0;
        let mut bins_per_frac = [0.0; 3];
        for k in 0..3 {
            if extent[k] > 0.0 {
                bins_per_frac[k] = nbins[k] as f64 / extent[k];
            }
            // Bin width along k is extent/nbins in fractional units, i.e.
            // height·extent/nbins in Å perpendicular to the bin faces.
            let reach = (search_radius * nbins[k] as f64 / (frame.heights[k] * extent[k])).ceil();
            // Saturating conversions: a reach too large for i64 is refused by
            // the caller (`stencil_cells`) before any table is built from it.
            stencil[k] = if frame.pbc[k] {
                reach.min(MAX_STENCIL_REACH) as i64
            } else if nbins[k] == 1 {
                0
            } else {
                (reach.min(MAX_STENCIL_REACH) as i64).min(nbins[k] as i64 - 1)
            };
            stencil_cells *= 2.0 * stencil[k] as f64 + 1.0;
            if frame.pbc[k] && (reach.is_nan() || reach > MAX_STENCIL_REACH) {
                stencil_cells = f64::INFINITY;
            }
        }
        let mut width = [0.0; 3];
        for k in 0..3 {
            width[k] = frame.heights[k] * extent[k] / nbins[k] as f64;
        }
        let inverse_width = width.map(|w| 1.0 / w);
        let axis_aligned = (0..3)
            .all(|k| frame.basis[k][k] > 0.0 && (0..3).all(|m| m == k || frame.basis[k][m] == 0.0));
        Self {
            nbins,
            stencil,
            stencil_cells,
            origin,
            bins_per_frac,
            pbc: frame.pbc,
            width,
            inverse_width,
            trimmed: axis_aligned && width.iter().all(|w| w.is_finite() && *w > 0.0),
        }
    }

    /// The stencil targets along `axis` (raw, unwrapped bin indices) that can
    /// hold a point within `reach` Å of the centre at bin coordinate `u`
    /// (bins spanning `[t, t + 1)`), inside the stencil around bin `b`.
    #[inline]
    pub(super) fn targets(&self, axis: usize, b: usize, u: f64, reach: f64) -> (i64, i64) {
        let (mut lo, mut hi) = (b as i64 - self.stencil[axis], b as i64 + self.stencil[axis]);
        if self.trimmed {
            let h = reach * self.inverse_width[axis];
            lo = lo.max(floor_to_i64(u - h));
            hi = hi.min(floor_to_i64(u + h));
        }
        if !self.pbc[axis] {
            lo = lo.max(0);
            hi = hi.min(self.nbins[axis] as i64 - 1);
        }
        (lo, hi)
    }

    /// The (bin, image) cells one centre's stencil may visit.
    pub(super) fn stencil_cells(&self) -> f64 {
        self.stencil_cells
    }

    /// Distance (Å) along `axis` from bin coordinate `u` to bin `t`.
    #[inline]
    pub(super) fn gap(&self, axis: usize, t: i64, u: f64) -> f64 {
        let t = t as f64;
        (t - u).max(u - (t + 1.0)).max(0.0) * self.width[axis]
    }

    pub(super) fn linear(&self, b: [usize; 3]) -> usize {
        (b[0] * self.nbins[1] + b[1]) * self.nbins[2] + b[2]
    }
}

/// `x.floor() as i64` without the libm call that `floor` compiles to on
/// baseline x86-64 (no SSE4.1 rounding instruction): the conversion
/// truncates towards zero, one less below zero when not already integral.
/// Saturates like `as` for values beyond the `i64` range; NaN gives 0.
#[inline(always)]
fn floor_to_i64(x: f64) -> i64 {
    let t = x as i64;
    t - ((t as f64) > x) as i64
}

/// Atoms counting-sorted by bin, with everything the inner loop reads stored
/// contiguously in bin order.
pub(super) struct Bins {
    /// `start[b]..start[b + 1]` are the slots of bin `b`.
    pub(super) start: Vec<u32>,
    /// Original atom index per slot (increasing within a bin).
    pub(super) atom: Vec<u32>,
    /// Wrapped Cartesian position per slot, one array per axis so that the
    /// distance test over a bin's contiguous slots reads three streams.
    pub(super) wrapped_x: Vec<f64>,
    /// See [`Bins::wrapped_x`].
    pub(super) wrapped_y: Vec<f64>,
    /// See [`Bins::wrapped_x`].
    pub(super) wrapped_z: Vec<f64>,
    /// Integer wrap `n` (wrapped = r − n·cell) per slot.
    pub(super) wrap: Vec<[i32; 3]>,
    /// Position as given per slot.
    pub(super) original: Vec<[f64; 3]>,
    /// Per atom (original order): bin coordinates, wrap and wrapped position.
    pub(super) atom_bin: Vec<[usize; 3]>,
    /// Per atom: continuous bin coordinate (bin `t` spans `[t, t + 1)`).
    pub(super) atom_u: Vec<[f64; 3]>,
    pub(super) atom_wrap: Vec<[i32; 3]>,
    pub(super) atom_wrapped: Vec<[f64; 3]>,
}

impl Bins {
    pub(super) fn new(
        positions: &[[f64; 3]],
        prepared: &crate::Prepared,
        grid: &Grid,
        frame: &Frame,
    ) -> Self {
        let n_atoms = positions.len();
        let mut atom_bin = Vec::with_capacity(n_atoms);
        let mut atom_u = Vec::with_capacity(n_atoms);
        let mut atom_wrap = Vec::with_capacity(n_atoms);
        let mut atom_wrapped = Vec::with_capacity(n_atoms);
        for (&r, f) in positions.iter().zip(&prepared.fractional) {
            let mut bin = [0usize; 3];
            let mut u = [0.0; 3];
            let mut wrap = [0i32; 3];
            for k in 0..3 {
                let local = if grid.pbc[k] {
                    let n = f[k].floor();
                    // |f| ≤ MAX_CELLS_AWAY was checked, so n fits in i32.
                    wrap[k] = n as i32;
                    f[k] - n
                } else {
                    f[k] - grid.origin[k]
                };
                // Rounding can put `local` a hair outside [0, extent]; clamping
                // moves the atom by far less than the search-radius margin.
                u[k] = local * grid.bins_per_frac[k];
                let b = u[k].floor();
                bin[k] = if b > 0.0 {
                    (b as usize).min(grid.nbins[k] - 1)
                } else {
                    0
                };
            }
            let s = frame.shift_cartesian(wrap);
            atom_bin.push(bin);
            atom_u.push(u);
            atom_wrap.push(wrap);
            atom_wrapped.push([r[0] - s[0], r[1] - s[1], r[2] - s[2]]);
        }

        let n_bins = grid.nbins.iter().product::<usize>();
        let mut start = vec![0u32; n_bins + 1];
        for b in &atom_bin {
            start[grid.linear(*b) + 1] += 1;
        }
        for b in 0..n_bins {
            start[b + 1] += start[b];
        }
        let mut fill: Vec<u32> = start[..n_bins].to_vec();
        let mut atom = vec![0u32; n_atoms];
        let mut wrapped_x = vec![0.0; n_atoms];
        let mut wrapped_y = vec![0.0; n_atoms];
        let mut wrapped_z = vec![0.0; n_atoms];
        let mut wrap = vec![[0i32; 3]; n_atoms];
        let mut original = vec![[0.0; 3]; n_atoms];
        for i in 0..n_atoms {
            let b = grid.linear(atom_bin[i]);
            let slot = fill[b] as usize;
            fill[b] += 1;
            atom[slot] = i as u32;
            [wrapped_x[slot], wrapped_y[slot], wrapped_z[slot]] = atom_wrapped[i];
            wrap[slot] = atom_wrap[i];
            original[slot] = positions[i];
        }
        Self {
            start,
            atom,
            wrapped_x,
            wrapped_y,
            wrapped_z,
            wrap,
            original,
            atom_bin,
            atom_u,
            atom_wrap,
            atom_wrapped,
        }
    }
}
