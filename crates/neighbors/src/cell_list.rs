//! O(N) cell-list search in fractional bins, parallel over centres.
//!
//! Atoms are wrapped into the cell along periodic axes and counting-sorted
//! into a grid of parallelepiped bins whose perpendicular widths are at least
//! `cutoff / k` (k between 2 and 3, see [`BINS_PER_CUTOFF`]). Since
//! `|Δfrac_k| ≤ |Δr| / height_k`, a neighbour's bin index differs from its
//! centre's by at most `ceil(cutoff · nbins_k / height_k)` along axis k,
//! which is the stencil half-width; along periodic axes the stencil wraps
//! and each wrap adds one image shift, so cells smaller than the cutoff
//! simply get wider stencils. When the frame's axes are the Cartesian axes
//! (orthorhombic cells, open systems such as a rank's local atoms), each
//! centre visits only the bin rows its cutoff sphere reaches.

use crate::frame::{pair_vector, Frame};
use crate::{
    check_pairs_fit, keep_in_half, memory_budget_bytes, prepare, NeighborError, NeighborList,
    NeighborOptions, PairList, MAX_ESTIMATED_PAIRS, MAX_STENCIL_VISITS,
};
use ddmlip_atoms::Cell;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Most pair slots a chunk reserves up front (its vectors grow beyond).
const MAX_CHUNK_RESERVE: usize = 1 << 22;

/// Largest stencil half-width along one axis (bins). Far beyond what
/// [`MAX_STENCIL_VISITS`] allows; it keeps index arithmetic in range.
const MAX_STENCIL_REACH: f64 = (1u64 << 40) as f64;

/// Bins per cutoff length, between these bounds. Finer bins let the
/// trimmed stencil follow the cutoff sphere more closely (half-cutoff bins
/// scan about 2.5× the sphere's volume, third-cutoff bins about 1.9×), but
/// every bin row costs a lookup, so bins stay large enough to hold a few
/// atoms each ([`ATOMS_PER_BIN`]).
const BINS_PER_CUTOFF: (f64, f64) = (2.0, 3.0);

/// The fewest atoms a bin should hold on average at a uniform density.
const ATOMS_PER_BIN: f64 = 3.0;

/// Bins per cutoff for `pairs_per_atom` expected pairs per atom: a bin of
/// `cutoff / k` holds `pairs_per_atom / (4π/3 · k³)` atoms on average.
fn bins_per_cutoff(pairs_per_atom: f64) -> f64 {
    let k = (pairs_per_atom / (4.0 / 3.0 * std::f64::consts::PI * ATOMS_PER_BIN)).cbrt();
    if k.is_finite() {
        k.clamp(BINS_PER_CUTOFF.0, BINS_PER_CUTOFF.1)
    } else {
        BINS_PER_CUTOFF.0
    }
}

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
    let mut out = NeighborList::default();
    neighbor_list_into(positions, cell, pbc, opts, &mut out)?;
    Ok(out)
}

/// [`neighbor_list`] writing into `out`, whose previous content is replaced
/// and whose allocations are reused (repeated calls, e.g. along an MD run,
/// then avoid fresh page faults). On error `out` is left empty.
pub fn neighbor_list_into(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    out: &mut NeighborList,
) -> Result<(), NeighborError> {
    search_into(positions, cell, pbc, opts, positions.len(), out)
}

/// [`neighbor_list`] restricted to the centres `0..n_centers` (neighbours
/// are still any atom). A decomposed run uses it with the owned atoms first:
/// ghost-centred pairs, which it would discard, are never searched.
pub fn neighbor_list_for_centers(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
) -> Result<NeighborList, NeighborError> {
    let mut out = NeighborList::default();
    search_into(
        positions,
        cell,
        pbc,
        opts,
        n_centers.min(positions.len()),
        &mut out,
    )?;
    Ok(out)
}

/// The pairs of [`neighbor_list_for_centers`] without their vectors and
/// distances (only the shortest distance is kept, for sanity checks), and
/// without shifts when no axis is periodic. Same pairs, same order.
pub fn pair_list_for_centers(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
) -> Result<PairList, NeighborError> {
    let mut out = PairList::default();
    pair_list_for_centers_into(
        positions,
        cell,
        pbc,
        opts,
        n_centers,
        &mut PairScratch::default(),
        &mut out,
    )?;
    Ok(out)
}

/// Runs `f(0)`, …, `f(n − 1)`, each once, and returns when all have run,
/// on whatever threads it likes: how a search spreads its chunks of
/// centres. The search's result does not depend on who runs which chunk.
pub type ChunkRunner = Arc<dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Send + Sync>;

/// Memory of a pair search kept for the next one (per-chunk pair lists), so
/// that a search repeated along an MD run maps no fresh pages, and how its
/// chunks run (rayon unless [`PairScratch::set_chunk_runner`] says otherwise).
#[derive(Default)]
pub struct PairScratch {
    chunks: Vec<ChunkPairs>,
    runner: Option<ChunkRunner>,
}

impl PairScratch {
    /// Later searches run their chunks of centres (and of the gather into
    /// centre order) through `runner`, or over rayon when `None`. On a
    /// one-thread pool with a runner the search cuts four times as many
    /// chunks, so that other threads the runner lends have pieces to take.
    pub fn set_chunk_runner(&mut self, runner: Option<ChunkRunner>) {
        self.runner = runner;
    }
}

/// Runs `f(i, part)` for every part, through `runner` when there is one,
/// otherwise over rayon.
fn for_each_part<P: Send>(
    parts: Vec<P>,
    runner: Option<&ChunkRunner>,
    f: impl Fn(usize, P) + Sync,
) {
    match runner {
        None => parts
            .into_par_iter()
            .enumerate()
            .for_each(|(i, part)| f(i, part)),
        Some(run) => {
            let slots: Vec<Mutex<Option<P>>> =
                parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
            run(slots.len(), &|i| {
                let part = slots[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(part) = part {
                    f(i, part);
                }
            });
        }
    }
}

/// [`pair_list_for_centers`] writing into `out`, whose previous content is
/// replaced and whose allocations are reused, with `scratch` reused for the
/// intermediate lists. On error `out` is left empty.
pub fn pair_list_for_centers_into(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
    scratch: &mut PairScratch,
    out: &mut PairList,
) -> Result<(), NeighborError> {
    let fields = Fields {
        geometry: false,
        shifts: pbc.iter().any(|&p| p),
    };
    let mut list = NeighborList {
        centers: std::mem::take(&mut out.centers),
        neighbors: std::mem::take(&mut out.neighbors),
        shifts: std::mem::take(&mut out.shifts),
        ..NeighborList::default()
    };
    out.closest = None;
    let n_centers = n_centers.min(positions.len());
    // The gather overwrites every slot it keeps, so the old lists are not
    // cleared first (that would zero them all again).
    let PairScratch { chunks, runner } = scratch;
    match search_chunks(
        positions,
        cell,
        pbc,
        opts,
        n_centers,
        fields,
        chunks,
        runner.as_ref(),
    )? {
        Some(searched) => {
            out.closest = gather_in_center_order(&searched, fields, &mut list, runner.as_ref())
        }
        None => list.clear(),
    }
    out.centers = list.centers;
    out.neighbors = list.neighbors;
    out.shifts = list.shifts;
    Ok(())
}

/// Which per-pair arrays a search produces.
#[derive(Debug, Clone, Copy)]
struct Fields {
    /// Pair vectors and distances.
    geometry: bool,
    /// Image shifts.
    shifts: bool,
}

const ALL_FIELDS: Fields = Fields {
    geometry: true,
    shifts: true,
};

fn search_into(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
    out: &mut NeighborList,
) -> Result<(), NeighborError> {
    out.clear();
    let mut chunks = Vec::new();
    if let Some(searched) = search_chunks(
        positions,
        cell,
        pbc,
        opts,
        n_centers,
        ALL_FIELDS,
        &mut chunks,
        None,
    )? {
        gather_in_center_order(&searched, ALL_FIELDS, out, None);
    }
    Ok(())
}

/// The pairs of a search, per chunk of centres, before they are put in
/// centre order.
struct SearchedChunks<'s> {
    chunks: &'s [ChunkPairs],
    /// The centres in the order they were searched (`chunk_size` per chunk).
    order: Vec<u32>,
    chunk_size: usize,
}

/// The per-chunk pair lists of the centres `0..n_centers`, in `lists`
/// (reused); `None` when there is nothing to search.
#[allow(clippy::too_many_arguments)]
fn search_chunks<'s>(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
    fields: Fields,
    lists: &'s mut Vec<ChunkPairs>,
    runner: Option<&ChunkRunner>,
) -> Result<Option<SearchedChunks<'s>>, NeighborError> {
    let prepared = prepare(positions, cell, pbc, opts)?;
    let n_atoms = positions.len();
    if n_atoms == 0 {
        return Ok(None);
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

    // Memory: the pairs of the centres searched, at the size of what this
    // search stores per pair, before anything per pair is allocated.
    let n_centers = n_centers.min(n_atoms);
    let half_factor = if opts.half { 0.5 } else { 1.0 };
    let expected_pairs =
        prepared.estimated_pairs * half_factor * (n_centers as f64 / n_atoms as f64);
    let bytes_per_pair =
        8.0 + if fields.shifts { 12.0 } else { 0.0 } + if fields.geometry { 32.0 } else { 0.0 };
    check_pairs_fit(opts.cutoff, expected_pairs, bytes_per_pair)?;

    let grid = Grid::new(frame, &prepared, search_radius, n_atoms);
    // Time: the (bin, image) cells the stencils visit, bounded before the
    // stencil tables are built from them.
    let visits = grid.stencil_cells() * n_centers as f64;
    if visits.is_nan() || visits > MAX_STENCIL_VISITS.max(64.0 * expected_pairs) {
        return Err(NeighborError::SearchTooCostly {
            cutoff: opts.cutoff,
            heights: frame.heights,
            visits,
            limit: MAX_STENCIL_VISITS.max(64.0 * expected_pairs),
        });
    }
    let bins = Bins::new(positions, &prepared, &grid, frame);

    let search = Search::new(
        &grid,
        &bins,
        frame,
        positions,
        opts.half,
        opts.cutoff,
        search_radius,
        fields,
    );

    // Centres are searched in bin order (neighbouring centres touch the same
    // bins, which keeps the search in cache), in chunks that each produce a
    // compact per-centre list; a second pass gathers the lists into centre
    // order. The output is therefore independent of the thread count.
    // Centres in bin order; when only the first `n_centers` atoms are centres,
    // the others are dropped here (they stay in the bins as neighbours).
    let order: Vec<u32> = if n_centers < n_atoms {
        bins.atom
            .iter()
            .copied()
            .filter(|&a| (a as usize) < n_centers)
            .collect()
    } else {
        bins.atom.clone()
    };
    let n_search = order.len();
    if n_search == 0 {
        return Ok(None);
    }
    let threads = rayon::current_num_threads().max(1);
    // A runner may lend other threads to a one-thread search: cut enough
    // chunks for them to share.
    let per_thread = if runner.is_some() && threads == 1 {
        64
    } else {
        16
    };
    let chunk_size = (n_search / (threads * per_thread)).clamp(64, 4096);
    let n_chunks = n_search.div_ceil(chunk_size);
    let pairs_per_center = expected_pairs / n_centers.max(1) as f64;
    if lists.len() < n_chunks {
        lists.resize_with(n_chunks, ChunkPairs::default);
    }
    let chunks = &mut lists[..n_chunks];
    // Pairs found so far by all chunks: the estimate assumes a uniform
    // density, so a search that finds far more (atoms crowded in one corner
    // of a large cell) is stopped here rather than by a failed allocation.
    let found = AtomicUsize::new(0);
    let limit = (memory_budget_bytes() / bytes_per_pair).min(MAX_ESTIMATED_PAIRS) as usize;
    for_each_part(chunks.iter_mut().collect(), runner, |c, out| {
        if found.load(Ordering::Relaxed) > limit {
            return;
        }
        let start = c * chunk_size;
        let end = (start + chunk_size).min(n_search);
        // The estimate only sizes the first allocation, and never beyond a
        // bound: a chunk grows like any vector when it finds more.
        let capacity = ((end - start) as f64 * (pairs_per_center * 1.1 + 8.0))
            .min(MAX_CHUNK_RESERVE as f64) as usize;
        search.run_into(&order[start..end], capacity, out);
        found.fetch_add(out.neighbors.len(), Ordering::Relaxed);
    });
    let found = found.into_inner();
    if found > limit {
        return Err(NeighborError::TooManyPairs {
            cutoff: opts.cutoff,
            estimated_pairs: found as f64,
            estimated_bytes: found as f64 * bytes_per_pair,
            limit_pairs: MAX_ESTIMATED_PAIRS,
            budget_bytes: memory_budget_bytes(),
        });
    }
    Ok(Some(SearchedChunks {
        chunks,
        order,
        chunk_size,
    }))
}

/// Bin layout: counts, stencil half-widths and the map from fractional
/// coordinate to bin index, per axis.
struct Grid {
    nbins: [usize; 3],
    stencil: [i64; 3],
    /// `Π (2·stencil_k + 1)`, the (bin, image) cells one centre may visit;
    /// infinite when a stencil could not be represented.
    stencil_cells: f64,
    /// Fractional coordinate of the lower edge of bin 0 (0 on periodic axes).
    origin: [f64; 3],
    /// Bins per unit of fractional coordinate.
    bins_per_frac: [f64; 3],
    pbc: [bool; 3],
    /// Perpendicular bin width per axis (Å).
    width: [f64; 3],
    /// The frame's axes are the Cartesian axes (orthorhombic cells, open
    /// systems): per-axis gaps between a centre and a bin are Cartesian
    /// distances, so the stencil can be cut to the bins the cutoff sphere
    /// actually reaches.
    trimmed: bool,
}

impl Grid {
    fn new(frame: &Frame, prepared: &crate::Prepared, search_radius: f64, n_atoms: usize) -> Self {
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
            trimmed: axis_aligned && width.iter().all(|w| w.is_finite() && *w > 0.0),
        }
    }

    /// The stencil targets along `axis` (raw, unwrapped bin indices) that can
    /// hold a point within `reach` Å of the centre at bin coordinate `u`
    /// (bins spanning `[t, t + 1)`), inside the stencil around bin `b`.
    #[inline]
    fn targets(&self, axis: usize, b: usize, u: f64, reach: f64) -> (i64, i64) {
        let (mut lo, mut hi) = (b as i64 - self.stencil[axis], b as i64 + self.stencil[axis]);
        if self.trimmed {
            let h = reach / self.width[axis];
            lo = lo.max((u - h).floor() as i64);
            hi = hi.min((u + h).floor() as i64);
        }
        if !self.pbc[axis] {
            lo = lo.max(0);
            hi = hi.min(self.nbins[axis] as i64 - 1);
        }
        (lo, hi)
    }

    /// The (bin, image) cells one centre's stencil may visit.
    fn stencil_cells(&self) -> f64 {
        self.stencil_cells
    }

    /// Distance (Å) along `axis` from bin coordinate `u` to bin `t`.
    #[inline]
    fn gap(&self, axis: usize, t: i64, u: f64) -> f64 {
        let t = t as f64;
        (t - u).max(u - (t + 1.0)).max(0.0) * self.width[axis]
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
    /// Per atom: continuous bin coordinate (bin `t` spans `[t, t + 1)`).
    atom_u: Vec<[f64; 3]>,
    atom_wrap: Vec<[i32; 3]>,
    atom_wrapped: Vec<[f64; 3]>,
}

impl Bins {
    fn new(positions: &[[f64; 3]], prepared: &crate::Prepared, grid: &Grid, frame: &Frame) -> Self {
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
            atom_u,
            atom_wrap,
            atom_wrapped,
        }
    }
}

/// A pair found for the current centre, before sorting by (j, S).
#[derive(Clone, Copy)]
struct Candidate {
    j: u32,
    /// Stencil image code, monotone in the image shift T (and hence in S for
    /// a fixed (i, j), since S = T + n_i − n_j).
    image: u32,
    shift: [i32; 3],
    vector: [f64; 3],
    d2: f64,
}

/// Sort keys pack `j`, the image code and the candidate index into a u64 when
/// they fit, which makes the per-centre sort a plain integer sort.
const INDEX_BITS: u32 = 12;
const IMAGE_BITS: u32 = 20;

struct Search<'a> {
    grid: &'a Grid,
    bins: &'a Bins,
    frame: &'a Frame,
    positions: &'a [[f64; 3]],
    half: bool,
    cutoff2: f64,
    search2: f64,
    /// Squared distance below which a candidate is certainly a pair: the
    /// candidate distance differs from the exact one by less than
    /// `search_radius − cutoff`.
    inside2: f64,
    search_radius: f64,
    /// Without periodic axes the wrapped positions are the positions as
    /// given and every shift is zero, so a candidate's distance is already
    /// the exact pair distance.
    exact_candidates: bool,
    /// Per axis, for stencil target t in [−stencil, nbins − 1 + stencil]
    /// (indexed by t + stencil): the wrapped bin and its image shift. Avoids
    /// integer division in the hot loop.
    wrap_tables: [Vec<(usize, i32)>; 3],
    /// Per axis, the largest |T| any stencil target can have.
    image_reach: [i32; 3],
    /// Whether image codes fit in `IMAGE_BITS`.
    packed_keys: bool,
    fields: Fields,
}

/// Scratch reused across the centres of one chunk.
#[derive(Default)]
struct Scratch {
    found: Vec<Candidate>,
    keys: Vec<u64>,
    /// Runs of consecutive z bins sharing one image shift: (first, last, T_z).
    runs: Vec<(usize, usize, i32)>,
}

impl<'a> Search<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        grid: &'a Grid,
        bins: &'a Bins,
        frame: &'a Frame,
        positions: &'a [[f64; 3]],
        half: bool,
        cutoff: f64,
        search_radius: f64,
        fields: Fields,
    ) -> Self {
        let mut wrap_tables: [Vec<(usize, i32)>; 3] = Default::default();
        let mut image_reach = [0i32; 3];
        for k in 0..3 {
            let n = grid.nbins[k] as i64;
            let d = grid.stencil[k];
            if grid.pbc[k] {
                wrap_tables[k] = (-d..n + d)
                    .map(|t| (t.rem_euclid(n) as usize, t.div_euclid(n) as i32))
                    .collect();
                image_reach[k] = wrap_tables[k]
                    .iter()
                    .map(|&(_, s)| s.abs())
                    .max()
                    .unwrap_or(0);
            } else {
                wrap_tables[k] = (-d..n + d)
                    .map(|t| (t.clamp(0, n - 1) as usize, 0))
                    .collect();
            }
        }
        let codes: u64 = image_reach.iter().map(|&r| 2 * r as u64 + 1).product();
        Self {
            grid,
            bins,
            frame,
            positions,
            half,
            cutoff2: cutoff * cutoff,
            search2: search_radius * search_radius,
            inside2: (cutoff - (search_radius - cutoff)).max(0.0).powi(2),
            search_radius,
            exact_candidates: !grid.pbc.iter().any(|&p| p),
            wrap_tables,
            image_reach,
            packed_keys: codes < (1 << IMAGE_BITS),
            fields,
        }
    }

    /// Pairs of each centre in `centers`, one segment per centre, written
    /// over `out` (whose allocations are reused). With geometry a segment is
    /// sorted by `(j, S)`; without, it is in search order.
    fn run_into(&self, centers: &[u32], capacity: usize, out: &mut ChunkPairs) {
        let Fields { geometry, shifts } = self.fields;
        let sized = |on: bool| if on { capacity } else { 0 };
        out.counts.clear();
        out.neighbors.clear();
        out.shifts.clear();
        out.vectors.clear();
        out.distances.clear();
        out.closest = None;
        out.counts.reserve(centers.len());
        out.neighbors.reserve(capacity);
        out.shifts.reserve(sized(shifts));
        out.vectors.reserve(sized(geometry));
        out.distances.reserve(sized(geometry));
        let mut scratch = Scratch::default();
        if !geometry {
            // Pair lists: straight into the output, no per-centre sort.
            let mut closest = f64::INFINITY;
            for &i in centers {
                let before = out.neighbors.len();
                self.center(i as usize, &mut scratch.runs, |j, _, shift, _, d2| {
                    if d2 < closest {
                        closest = d2;
                        out.closest = Some((out.neighbors.len(), d2));
                    }
                    out.neighbors.push(j);
                    if shifts {
                        out.shifts.push(shift);
                    }
                });
                out.counts.push((out.neighbors.len() - before) as u32);
            }
            return;
        }
        for &i in centers {
            scratch.found.clear();
            let found = &mut scratch.found;
            self.center(
                i as usize,
                &mut scratch.runs,
                |j, image, shift, vector, d2| {
                    found.push(Candidate {
                        j,
                        image,
                        shift,
                        vector,
                        d2,
                    })
                },
            );
            out.counts.push(found.len() as u32);
            let mut emit = |c: &Candidate| {
                out.neighbors.push(c.j);
                if shifts {
                    out.shifts.push(c.shift);
                }
                out.vectors.push(c.vector);
                out.distances.push(c.d2.sqrt());
            };
            if self.packed_keys && found.len() < (1 << INDEX_BITS) {
                scratch.keys.clear();
                scratch
                    .keys
                    .extend(found.iter().enumerate().map(|(index, c)| {
                        ((c.j as u64) << 32) | ((c.image as u64) << INDEX_BITS) | index as u64
                    }));
                scratch.keys.sort_unstable();
                for &key in &scratch.keys {
                    emit(&found[(key & ((1 << INDEX_BITS) - 1)) as usize]);
                }
            } else {
                found.sort_unstable_by_key(|c| (c.j, c.shift));
                found.iter().for_each(&mut emit);
            }
        }
    }

    /// Calls `emit(j, image code, S, r_j + S·cell − r_i, |·|²)` for every
    /// neighbour of centre `i` (in bin order). `runs` is scratch.
    #[inline(always)]
    fn center<F: FnMut(u32, u32, [i32; 3], [f64; 3], f64)>(
        &self,
        i: usize,
        runs: &mut Vec<(usize, usize, i32)>,
        mut emit: F,
    ) {
        let bins = self.bins;
        let grid = self.grid;
        let basis = &self.frame.basis;
        let bin_i = bins.atom_bin[i];
        let u_i = bins.atom_u[i];
        let wrap_i = bins.atom_wrap[i];
        let w_i = bins.atom_wrapped[i];
        let r_i = self.positions[i];
        let index_i = i as u32;
        let st = grid.stencil;
        let reach = self.image_reach;
        let width = [2 * reach[1] as u32 + 1, 2 * reach[2] as u32 + 1];
        let (exact, radius) = (self.exact_candidates, self.search_radius);

        let (x_lo, x_hi) = grid.targets(0, bin_i[0], u_i[0], radius);
        for tx_raw in x_lo..=x_hi {
            let gx = grid.gap(0, tx_raw, u_i[0]);
            let left_x = self.search2 - gx * gx;
            if grid.trimmed && left_x <= 0.0 {
                continue;
            }
            let (tx, sx) = self.wrap_tables[0][(tx_raw + st[0]) as usize];
            let shift_x = [
                sx as f64 * basis[0][0],
                sx as f64 * basis[0][1],
                sx as f64 * basis[0][2],
            ];
            let (y_lo, y_hi) = grid.targets(1, bin_i[1], u_i[1], left_x.max(0.0).sqrt());
            for ty_raw in y_lo..=y_hi {
                let gy = grid.gap(1, ty_raw, u_i[1]);
                let left_y = left_x - gy * gy;
                if grid.trimmed && left_y <= 0.0 {
                    continue;
                }
                let (ty, sy) = self.wrap_tables[1][(ty_raw + st[1]) as usize];
                let shift_xy = [
                    shift_x[0] + sy as f64 * basis[1][0],
                    shift_x[1] + sy as f64 * basis[1][1],
                    shift_x[2] + sy as f64 * basis[1][2],
                ];
                // Along z, consecutive bins are consecutive slot ranges: merge
                // the row's targets into runs that share one image shift.
                let (z_lo, z_hi) = grid.targets(2, bin_i[2], u_i[2], left_y.max(0.0).sqrt());
                runs.clear();
                for t in z_lo..=z_hi {
                    let (tz, sz) = self.wrap_tables[2][(t + st[2]) as usize];
                    match runs.last_mut() {
                        Some(run) if run.2 == sz && run.1 + 1 == tz => run.1 = tz,
                        _ => runs.push((tz, tz, sz)),
                    }
                }
                let row = (tx * grid.nbins[1] + ty) * grid.nbins[2];
                for &(first, last, sz) in runs.iter() {
                    // The image of the run translated by T·cell, seen from w_i.
                    let origin = [
                        w_i[0] - (shift_xy[0] + sz as f64 * basis[2][0]),
                        w_i[1] - (shift_xy[1] + sz as f64 * basis[2][1]),
                        w_i[2] - (shift_xy[2] + sz as f64 * basis[2][2]),
                    ];
                    let image = [sx, sy, sz];
                    let code = (((sx + reach[0]) as u32 * width[0]) + (sy + reach[1]) as u32)
                        * width[1]
                        + (sz + reach[2]) as u32;
                    let lo = bins.start[row + first] as usize;
                    let hi = bins.start[row + last + 1] as usize;
                    for slot in lo..hi {
                        let p = bins.wrapped[slot];
                        let d = [p[0] - origin[0], p[1] - origin[1], p[2] - origin[2]];
                        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                        if d2 >= self.search2 {
                            continue;
                        }
                        let j = bins.atom[slot];
                        if self.half && j < index_i {
                            continue;
                        }
                        let wrap_j = bins.wrap[slot];
                        // wrapped_j + T·cell − wrapped_i = r_j + (T + n_i − n_j)·cell − r_i.
                        let shift = [
                            image[0] + wrap_i[0] - wrap_j[0],
                            image[1] + wrap_i[1] - wrap_j[1],
                            image[2] + wrap_i[2] - wrap_j[2],
                        ];
                        if j == index_i
                            && (shift == [0, 0, 0] || (self.half && !keep_in_half(j, j, shift)))
                        {
                            continue;
                        }
                        if exact || (!self.fields.geometry && d2 < self.inside2) {
                            // The candidate distance decides (exact, or far
                            // enough inside the cutoff that rounding cannot).
                            if d2 < self.cutoff2 {
                                emit(j, code, shift, d, d2);
                            }
                            continue;
                        }
                        let (vector, exact2) = pair_vector(
                            r_i,
                            bins.original[slot],
                            self.frame.shift_cartesian(shift),
                        );
                        if exact2 < self.cutoff2 {
                            emit(j, code, shift, vector, exact2);
                        }
                    }
                }
            }
        }
    }
}

/// The pairs of one chunk of centres (in bin order): `counts[c]` pairs for
/// its c-th centre, stored consecutively.
#[derive(Default)]
struct ChunkPairs {
    counts: Vec<u32>,
    neighbors: Vec<u32>,
    /// Empty unless `Fields::shifts`.
    shifts: Vec<[i32; 3]>,
    /// Empty unless `Fields::geometry`.
    vectors: Vec<[f64; 3]>,
    distances: Vec<f64>,
    /// Without geometry: the chunk's shortest pair (index in the chunk, d²).
    closest: Option<(usize, f64)>,
}

/// Copies the per-centre segments of the searched chunks into one list
/// sorted by centre, in parallel over ranges of centres; arrays not in
/// `fields` stay empty. Returns the shortest pair (index in `out`, distance)
/// of a search without geometry.
fn gather_in_center_order(
    searched: &SearchedChunks<'_>,
    fields: Fields,
    out: &mut NeighborList,
    runner: Option<&ChunkRunner>,
) -> Option<(usize, f64)> {
    let SearchedChunks {
        chunks,
        order,
        chunk_size,
    } = searched;
    let chunk_size = *chunk_size;
    // `order` is a permutation of the centres 0..n.
    let n_atoms = order.len();
    // For each centre: (chunk, first pair in the chunk, count).
    let mut location = vec![(0u32, 0u32, 0u32); n_atoms];
    // The closest pair: (chunk, index in chunk, d²).
    let mut closest: Option<(usize, usize, f64)> = None;
    for (c, chunk) in chunks.iter().enumerate() {
        let mut offset = 0u32;
        for (k, &count) in chunk.counts.iter().enumerate() {
            location[order[c * chunk_size + k] as usize] = (c as u32, offset, count);
            offset += count;
        }
        if let Some((p, d2)) = chunk.closest {
            if closest.is_none_or(|(_, _, best)| d2 < best) {
                closest = Some((c, p, d2));
            }
        }
    }
    let ranges: Vec<std::ops::Range<usize>> = (0..n_atoms)
        .step_by(chunk_size)
        .map(|s| s..(s + chunk_size).min(n_atoms))
        .collect();
    let lengths: Vec<usize> = ranges
        .iter()
        .map(|r| location[r.clone()].iter().map(|l| l.2 as usize).sum())
        .collect();
    let total: usize = lengths.iter().sum();
    let sized = |on: bool| if on { total } else { 0 };
    // Fresh zeroed allocations come straight from the OS and are first
    // touched by the parallel copy below; reused ones are only resized.
    resize_for_overwrite(&mut out.centers, total, 0);
    resize_for_overwrite(&mut out.neighbors, total, 0);
    resize_for_overwrite(&mut out.shifts, sized(fields.shifts), [0; 3]);
    resize_for_overwrite(&mut out.vectors, sized(fields.geometry), [0.0; 3]);
    resize_for_overwrite(&mut out.distances, sized(fields.geometry), 0.0);
    let part_lengths = |on: bool| -> Vec<usize> {
        if on {
            lengths.clone()
        } else {
            vec![0; lengths.len()]
        }
    };
    let parts: Vec<_> = split_by_lengths(&mut out.centers, &lengths)
        .into_iter()
        .zip(split_by_lengths(&mut out.neighbors, &lengths))
        .zip(split_by_lengths(
            &mut out.shifts,
            &part_lengths(fields.shifts),
        ))
        .zip(split_by_lengths(
            &mut out.vectors,
            &part_lengths(fields.geometry),
        ))
        .zip(split_by_lengths(
            &mut out.distances,
            &part_lengths(fields.geometry),
        ))
        .zip(ranges.clone())
        .collect();
    for_each_part(
        parts,
        runner,
        |_, (((((centers, neighbors), shifts), vectors), distances), range)| {
            let mut at = 0;
            for i in range {
                let (c, first, count) = location[i];
                let (chunk, first, count) = (&chunks[c as usize], first as usize, count as usize);
                let src = first..first + count;
                let dst = at..at + count;
                centers[dst.clone()].fill(i as u32);
                neighbors[dst.clone()].copy_from_slice(&chunk.neighbors[src.clone()]);
                if fields.shifts {
                    shifts[dst.clone()].copy_from_slice(&chunk.shifts[src.clone()]);
                }
                if fields.geometry {
                    vectors[dst.clone()].copy_from_slice(&chunk.vectors[src.clone()]);
                    distances[dst].copy_from_slice(&chunk.distances[src]);
                }
                at += count;
            }
        },
    );
    // Where the closest pair landed: its centre's first output slot plus its
    // offset within that centre's segment.
    closest.map(|(c, p, d2)| {
        let chunk = &chunks[c];
        let (mut first, mut k) = (0usize, 0usize);
        while first + chunk.counts[k] as usize <= p {
            first += chunk.counts[k] as usize;
            k += 1;
        }
        let center = order[c * chunk_size + k] as usize;
        let before: usize = location[..center].iter().map(|l| l.2 as usize).sum();
        (before + (p - first), d2.sqrt())
    })
}

/// Sets `v` to length `len`, reusing its allocation when large enough and
/// otherwise taking a fresh zeroed one (no copy of old content). Reused
/// slots keep stale values: the caller overwrites every slot.
fn resize_for_overwrite<T: Clone>(v: &mut Vec<T>, len: usize, zero: T) {
    if v.capacity() >= len {
        v.resize(len, zero);
    } else {
        *v = vec![zero; len];
    }
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
