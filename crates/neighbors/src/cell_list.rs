//! O(N) cell-list search in fractional bins, parallel over centres.
//!
//! Atoms are wrapped into the cell along periodic axes and counting-sorted
//! into a grid of parallelepiped bins whose perpendicular widths are at least
//! `cutoff / BINS_PER_CUTOFF`. Since `|Δfrac_k| ≤ |Δr| / height_k`, a
//! neighbour's bin index differs from its centre's by at most
//! `ceil(cutoff · nbins_k / height_k)` along axis k, which is the stencil
//! half-width; along periodic axes the stencil wraps and each wrap adds one
//! image shift, so cells smaller than the cutoff simply get wider stencils.

use crate::frame::{pair_vector, Frame};
use crate::{keep_in_half, prepare, NeighborError, NeighborList, NeighborOptions};
use ddmlip_atoms::Cell;
use rayon::prelude::*;

/// Bins per cutoff length: 2 (half-cutoff bins, ±2 stencil) scans about 0.58×
/// the volume of cutoff-sized bins with a ±1 stencil.
const BINS_PER_CUTOFF: f64 = 2.0;

/// Builds the neighbour list of `positions` (Å, one row per atom) in `cell`
/// (rows are lattice vectors; may be `None` when no axis is periodic) with
/// periodicity `pbc`.
///
/// Returns every pair `(i, j, S)` with `|r_j + S·cell − r_i| < cutoff`, except
/// the self pair `i == j, S == 0`; an atom's own images (`i == j, S ≠ 0`) are
/// included. `S` is zero on open axes and refers to the positions as given
/// (atoms outside the cell are allowed). Output is sorted by `(i, j, S)` and
/// identical for any number of rayon threads (the current pool is used).
///
/// Errors: invalid cutoff, non-finite positions, missing/degenerate cell on a
/// periodic axis, atoms absurdly far outside the cell, or an estimated pair
/// count above [`crate::MAX_ESTIMATED_PAIRS`].
pub fn neighbor_list(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
) -> Result<NeighborList, NeighborError> {
    let prepared = prepare(positions, cell, pbc, opts)?;
    let n_atoms = positions.len();
    if n_atoms == 0 {
        return Ok(NeighborList::default());
    }
    let frame = &prepared.frame;

    // The bin search and the prefilter run on wrapped coordinates, which differ
    // from the exact pair vector by rounding; widen the search radius so that
    // every pair the exact test accepts is a candidate.
    let max_coordinate = positions
        .iter()
        .flatten()
        .fold(0.0_f64, |m, x| m.max(x.abs()));
    let max_lattice = (0..3)
        .filter(|&k| pbc[k])
        .map(|k| frame.basis[k].iter().fold(0.0_f64, |m, x| m.max(x.abs())))
        .sum::<f64>();
    let search_radius = opts.cutoff * (1.0 + 1e-9) + 1e-12 * (max_coordinate + max_lattice);

    let grid = Grid::new(frame, &prepared, search_radius, n_atoms);
    let bins = Bins::new(positions, &prepared, &grid, frame);

    let search = Search {
        grid: &grid,
        bins: &bins,
        frame,
        positions,
        half: opts.half,
        cutoff2: opts.cutoff * opts.cutoff,
        search2: search_radius * search_radius,
    };

    // Chunks of consecutive centres keep the output order independent of the
    // thread count; several chunks per thread balance uneven densities.
    let threads = rayon::current_num_threads().max(1);
    let chunk_size = (n_atoms / (threads * 16)).clamp(64, 4096);
    let n_chunks = n_atoms.div_ceil(chunk_size);
    let pairs_per_center = prepared.estimated_pairs / n_atoms as f64;
    let chunks: Vec<NeighborList> = (0..n_chunks)
        .into_par_iter()
        .map(|c| {
            let start = c * chunk_size;
            let end = (start + chunk_size).min(n_atoms);
            let capacity = ((end - start) as f64 * (pairs_per_center * 1.1 + 8.0)) as usize;
            search.run(start..end, capacity)
        })
        .collect();
    Ok(concatenate(chunks))
}

/// Bin layout: counts, stencil half-widths and the map from fractional
/// coordinate to bin index, per axis.
struct Grid {
    nbins: [usize; 3],
    stencil: [i64; 3],
    /// Fractional coordinate of the lower edge of bin 0 (0 on periodic axes).
    origin: [f64; 3],
    /// Bins per unit of fractional coordinate.
    bins_per_frac: [f64; 3],
    pbc: [bool; 3],
}

impl Grid {
    fn new(frame: &Frame, prepared: &crate::Prepared, search_radius: f64, n_atoms: usize) -> Self {
        let mut nbins = [1usize; 3];
        let mut extent = [1.0; 3];
        let mut origin = [0.0; 3];
        for k in 0..3 {
            if !frame.pbc[k] {
                origin[k] = prepared.frac_range[k].0;
                extent[k] = prepared.frac_range[k].1 - prepared.frac_range[k].0;
            }
            let length = extent[k] * frame.heights[k];
            let wanted = (length * BINS_PER_CUTOFF / search_radius).floor();
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
        while nbins.iter().product::<usize>() > max_bins {
            let widest = (0..3).max_by_key(|&k| nbins[k]).unwrap_or(0);
            nbins[widest] = nbins[widest].div_ceil(2);
        }
        let mut stencil = [0i64; 3];
        let mut bins_per_frac = [0.0; 3];
        for k in 0..3 {
            if extent[k] > 0.0 {
                bins_per_frac[k] = nbins[k] as f64 / extent[k];
            }
            // Bin width along k is extent/nbins in fractional units, i.e.
            // height·extent/nbins in Å perpendicular to the bin faces.
            let reach = (search_radius * nbins[k] as f64 / (frame.heights[k] * extent[k])).ceil();
            stencil[k] = if frame.pbc[k] {
                reach as i64
            } else if nbins[k] == 1 {
                0
            } else {
                (reach as i64).min(nbins[k] as i64 - 1)
            };
        }
        Self {
            nbins,
            stencil,
            origin,
            bins_per_frac,
            pbc: frame.pbc,
        }
    }

    fn linear(&self, b: [usize; 3]) -> usize {
        (b[0] * self.nbins[1] + b[1]) * self.nbins[2] + b[2]
    }
}

/// Atoms counting-sorted by bin, with everything the inner loop reads stored
/// contiguously in bin order.
struct Bins {
    /// `start[b]..start[b + 1]` are the slots of bin `b`.
    start: Vec<u32>,
    /// Original atom index per slot (increasing within a bin).
    atom: Vec<u32>,
    /// Wrapped Cartesian position per slot.
    wrapped: Vec<[f64; 3]>,
    /// Integer wrap `n` (wrapped = r − n·cell) per slot.
    wrap: Vec<[i32; 3]>,
    /// Position as given per slot.
    original: Vec<[f64; 3]>,
    /// Per atom (original order): bin coordinates, wrap and wrapped position.
    atom_bin: Vec<[usize; 3]>,
    atom_wrap: Vec<[i32; 3]>,
    atom_wrapped: Vec<[f64; 3]>,
}

impl Bins {
    fn new(positions: &[[f64; 3]], prepared: &crate::Prepared, grid: &Grid, frame: &Frame) -> Self {
        let n_atoms = positions.len();
        let mut atom_bin = Vec::with_capacity(n_atoms);
        let mut atom_wrap = Vec::with_capacity(n_atoms);
        let mut atom_wrapped = Vec::with_capacity(n_atoms);
        for (&r, f) in positions.iter().zip(&prepared.fractional) {
            let mut bin = [0usize; 3];
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
                let b = (local * grid.bins_per_frac[k]).floor();
                bin[k] = if b > 0.0 {
                    (b as usize).min(grid.nbins[k] - 1)
                } else {
                    0
                };
            }
            let s = frame.shift_cartesian(wrap);
            atom_bin.push(bin);
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
        let mut wrapped = vec![[0.0; 3]; n_atoms];
        let mut wrap = vec![[0i32; 3]; n_atoms];
        let mut original = vec![[0.0; 3]; n_atoms];
        for i in 0..n_atoms {
            let b = grid.linear(atom_bin[i]);
            let slot = fill[b] as usize;
            fill[b] += 1;
            atom[slot] = i as u32;
            wrapped[slot] = atom_wrapped[i];
            wrap[slot] = atom_wrap[i];
            original[slot] = positions[i];
        }
        Self {
            start,
            atom,
            wrapped,
            wrap,
            original,
            atom_bin,
            atom_wrap,
            atom_wrapped,
        }
    }
}

/// A pair found for the current centre, before sorting by (j, S).
#[derive(Clone, Copy)]
struct Candidate {
    j: u32,
    shift: [i32; 3],
    vector: [f64; 3],
    d2: f64,
}

struct Search<'a> {
    grid: &'a Grid,
    bins: &'a Bins,
    frame: &'a Frame,
    positions: &'a [[f64; 3]],
    half: bool,
    cutoff2: f64,
    search2: f64,
}

impl Search<'_> {
    /// Pairs of centres `centers`, in output order.
    fn run(&self, centers: std::ops::Range<usize>, capacity: usize) -> NeighborList {
        let mut out = NeighborList {
            centers: Vec::with_capacity(capacity),
            neighbors: Vec::with_capacity(capacity),
            shifts: Vec::with_capacity(capacity),
            vectors: Vec::with_capacity(capacity),
            distances: Vec::with_capacity(capacity),
        };
        let mut found: Vec<Candidate> = Vec::with_capacity(256);
        for i in centers {
            found.clear();
            self.center(i, &mut found);
            found.sort_unstable_by(|a, b| (a.j, a.shift).cmp(&(b.j, b.shift)));
            for c in &found {
                out.centers.push(i as u32);
                out.neighbors.push(c.j);
                out.shifts.push(c.shift);
                out.vectors.push(c.vector);
                out.distances.push(c.d2.sqrt());
            }
        }
        out
    }

    /// Target bin along `axis` for stencil offset `offset` from bin `b`, with
    /// the image shift that wrapping adds; `None` past an open boundary.
    #[inline]
    fn target(&self, axis: usize, b: usize, offset: i64) -> Option<(usize, i32)> {
        let n = self.grid.nbins[axis] as i64;
        let t = b as i64 + offset;
        if self.grid.pbc[axis] {
            Some((t.rem_euclid(n) as usize, t.div_euclid(n) as i32))
        } else if (0..n).contains(&t) {
            Some((t as usize, 0))
        } else {
            None
        }
    }

    fn center(&self, i: usize, found: &mut Vec<Candidate>) {
        let bins = self.bins;
        let basis = &self.frame.basis;
        let bin_i = bins.atom_bin[i];
        let wrap_i = bins.atom_wrap[i];
        let w_i = bins.atom_wrapped[i];
        let r_i = self.positions[i];
        let i32_index = i as u32;
        let st = self.grid.stencil;
        for dx in -st[0]..=st[0] {
            let Some((tx, sx)) = self.target(0, bin_i[0], dx) else {
                continue;
            };
            let shift_x = [
                sx as f64 * basis[0][0],
                sx as f64 * basis[0][1],
                sx as f64 * basis[0][2],
            ];
            for dy in -st[1]..=st[1] {
                let Some((ty, sy)) = self.target(1, bin_i[1], dy) else {
                    continue;
                };
                let shift_xy = [
                    shift_x[0] + sy as f64 * basis[1][0],
                    shift_x[1] + sy as f64 * basis[1][1],
                    shift_x[2] + sy as f64 * basis[1][2],
                ];
                for dz in -st[2]..=st[2] {
                    let Some((tz, sz)) = self.target(2, bin_i[2], dz) else {
                        continue;
                    };
                    // Image of bin (tx, ty, tz) translated by T·cell, seen from w_i.
                    let origin = [
                        w_i[0] - (shift_xy[0] + sz as f64 * basis[2][0]),
                        w_i[1] - (shift_xy[1] + sz as f64 * basis[2][1]),
                        w_i[2] - (shift_xy[2] + sz as f64 * basis[2][2]),
                    ];
                    let image = [sx, sy, sz];
                    let b = self.grid.linear([tx, ty, tz]);
                    let (lo, hi) = (bins.start[b] as usize, bins.start[b + 1] as usize);
                    for slot in lo..hi {
                        let p = bins.wrapped[slot];
                        let d = [p[0] - origin[0], p[1] - origin[1], p[2] - origin[2]];
                        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                        if d2 >= self.search2 {
                            continue;
                        }
                        let j = bins.atom[slot];
                        if self.half && j < i32_index {
                            continue;
                        }
                        let wrap_j = bins.wrap[slot];
                        // wrapped_j + T·cell − wrapped_i = r_j + (T + n_i − n_j)·cell − r_i.
                        let shift = [
                            image[0] + wrap_i[0] - wrap_j[0],
                            image[1] + wrap_i[1] - wrap_j[1],
                            image[2] + wrap_i[2] - wrap_j[2],
                        ];
                        if j == i32_index
                            && (shift == [0, 0, 0] || (self.half && !keep_in_half(j, j, shift)))
                        {
                            continue;
                        }
                        let (vector, exact2) = pair_vector(
                            r_i,
                            bins.original[slot],
                            self.frame.shift_cartesian(shift),
                        );
                        if exact2 < self.cutoff2 {
                            found.push(Candidate {
                                j,
                                shift,
                                vector,
                                d2: exact2,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// Joins per-chunk lists in order, copying in parallel into one allocation.
fn concatenate(mut chunks: Vec<NeighborList>) -> NeighborList {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let total: usize = chunks.iter().map(NeighborList::len).sum();
    let mut out = NeighborList {
        centers: vec![0; total],
        neighbors: vec![0; total],
        shifts: vec![[0; 3]; total],
        vectors: vec![[0.0; 3]; total],
        distances: vec![0.0; total],
    };
    let lengths: Vec<usize> = chunks.iter().map(NeighborList::len).collect();
    let parts: Vec<_> = split_by_lengths(&mut out.centers, &lengths)
        .into_iter()
        .zip(split_by_lengths(&mut out.neighbors, &lengths))
        .zip(split_by_lengths(&mut out.shifts, &lengths))
        .zip(split_by_lengths(&mut out.vectors, &lengths))
        .zip(split_by_lengths(&mut out.distances, &lengths))
        .zip(&chunks)
        .collect();
    parts
        .into_par_iter()
        .for_each(|(((((c, n), s), v), d), chunk)| {
            c.copy_from_slice(&chunk.centers);
            n.copy_from_slice(&chunk.neighbors);
            s.copy_from_slice(&chunk.shifts);
            v.copy_from_slice(&chunk.vectors);
            d.copy_from_slice(&chunk.distances);
        });
    out
}

fn split_by_lengths<'a, T>(mut rest: &'a mut [T], lengths: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        parts.push(head);
        rest = tail;
    }
    parts
}
