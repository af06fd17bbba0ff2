//! O(N) cell-list search in fractional bins, parallel over centres.
//!
//! Atoms are wrapped into the cell along periodic axes and counting-sorted
//! into a grid of parallelepiped bins whose perpendicular widths are at least
//! `cutoff / k` (k = 1 or 2, see [`bins_per_cutoff`]). Since
//! `|Δfrac_k| ≤ |Δr| / height_k`, a neighbour's bin index differs from its
//! centre's by at most `ceil(cutoff · nbins_k / height_k)` along axis k,
//! which is the stencil half-width; along periodic axes the stencil wraps
//! and each wrap adds one image shift, so cells smaller than the cutoff
//! simply get wider stencils. When the frame's axes are the Cartesian axes
//! (orthorhombic cells, open systems such as a rank's local atoms), the
//! stencil keeps only the bin rows within the cutoff of the centre's bin,
//! and each centre cuts every row along z to the reach of its sphere.
//!
//! Each centre tests the atoms of its stencil against the search radius
//! without a branch per atom, then resolves the few candidates (index,
//! image shift, exact vector) and sorts them by `(j, S)`. Neighbour lists
//! walk the centres in index order and write straight into the caller's
//! list ([`center_order`]); pair lists walk them in bin order, in chunks
//! gathered into centre order afterwards ([`gather`]).

use crate::frame::{pair_vector, Frame};
use crate::{
    check_pairs_fit, keep_in_half, memory_budget_bytes, prepare, NeighborError, NeighborList,
    NeighborOptions, PairList, MAX_ESTIMATED_PAIRS, MAX_STENCIL_VISITS,
};
use ddmlip_atoms::Cell;
use gather::{gather_in_center_order, ChunkPairs};
use grid::{Bins, Grid};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

mod center_order;
mod gather;
mod grid;

/// Most pair slots a chunk reserves up front (its vectors grow beyond).
const MAX_CHUNK_RESERVE: usize = 1 << 22;

/// Largest stencil half-width along one axis (bins). Far beyond what
/// [`MAX_STENCIL_VISITS`] allows; it keeps index arithmetic in range.
const MAX_STENCIL_REACH: f64 = (1u64 << 40) as f64;

/// Up to this many expected pairs per atom, bins are as wide as the
/// cutoff; beyond, half as wide.
///
/// A centre tests every atom of the bin rows its stencil reaches, and each
/// row costs about as much as testing a couple of dozen atoms (lookups,
/// and cache misses when atoms are not numbered in space order). Cutoff-wide
/// bins give 9 rows per centre and test about 6× the atoms in the cutoff
/// sphere; half-cutoff bins give 25 rows and test about 3.5×. Measured on
/// FCC copper and a random liquid: cutoff-wide bins are 20–40 % faster at
/// 10–40 pairs per atom and even at about 140.
const WIDE_BINS_UP_TO_PAIRS_PER_ATOM: f64 = 150.0;

/// Bins per cutoff length for `pairs_per_atom` expected pairs per atom
/// (see [`WIDE_BINS_UP_TO_PAIRS_PER_ATOM`]).
fn bins_per_cutoff(pairs_per_atom: f64) -> f64 {
    if pairs_per_atom > WIDE_BINS_UP_TO_PAIRS_PER_ATOM {
        2.0
    } else {
        1.0
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
/// without shifts when no axis is periodic. Same pairs, grouped by centre
/// in increasing order (within a centre in search order).
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
    center_order::search_in_center_order(positions, cell, pbc, opts, n_centers, out)
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
    let Some(plan) = Plan::new(positions, cell, pbc, opts, n_centers, fields)? else {
        return Ok(None);
    };
    let Plan {
        ref bins,
        expected_pairs,
        bytes_per_pair,
        ..
    } = plan;
    let n_centers = n_centers.min(positions.len());
    let n_atoms = positions.len();
    let search = plan.search(positions, opts, fields);

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

/// What a search needs before it walks the centres: the validated input,
/// the bin grid with the atoms sorted into it, and the size estimates.
struct Plan {
    prepared: crate::Prepared,
    grid: Grid,
    bins: Bins,
    /// The cutoff widened by the rounding margin of wrapped coordinates (Å).
    search_radius: f64,
    /// Uniform-density estimate of the pairs of the centres searched.
    expected_pairs: f64,
    /// Bytes stored per pair by this search.
    bytes_per_pair: f64,
}

impl Plan {
    /// Validates the input, refuses searches too large for memory or time,
    /// and bins the atoms; `None` without atoms.
    fn new(
        positions: &[[f64; 3]],
        cell: Option<&Cell>,
        pbc: [bool; 3],
        opts: &NeighborOptions,
        n_centers: usize,
        fields: Fields,
    ) -> Result<Option<Self>, NeighborError> {
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

        Ok(Some(Self {
            prepared,
            grid,
            bins,
            search_radius,
            expected_pairs,
            bytes_per_pair,
        }))
    }

    /// The search over this plan's bins.
    fn search<'a>(
        &'a self,
        positions: &'a [[f64; 3]],
        opts: &NeighborOptions,
        fields: Fields,
    ) -> Search<'a> {
        Search::new(
            &self.grid,
            &self.bins,
            &self.prepared.frame,
            positions,
            opts.half,
            opts.cutoff,
            self.search_radius,
            fields,
        )
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
    /// The stencil rows every centre walks, when the stencil is narrow
    /// enough for a table ([`stencil_rows`]).
    rows: Option<Vec<StencilRow>>,
    fields: Fields,
}

/// Scratch reused across the centres of one chunk.
#[derive(Default)]
struct Scratch {
    /// The pairs of the current centre, in search order.
    found: Vec<Candidate>,
    /// Packed sort keys of `found`.
    keys: Vec<u64>,
    /// Indices into `found` in `(j, S)` order.
    order: Vec<u32>,
    probe: Probe,
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
            rows: stencil_rows(grid, search_radius),
            fields,
        }
    }

    /// Pairs (without geometry) of each centre in `centers`, one segment
    /// per centre in search order, written over `out` (whose allocations
    /// are reused).
    fn run_into(&self, centers: &[u32], capacity: usize, out: &mut ChunkPairs) {
        let shifts = self.fields.shifts;
        out.counts.clear();
        out.neighbors.clear();
        out.shifts.clear();
        out.vectors.clear();
        out.distances.clear();
        out.closest = None;
        out.counts.reserve(centers.len());
        out.neighbors.reserve(capacity);
        out.shifts.reserve(if shifts { capacity } else { 0 });
        let mut probe = Probe::default();
        let mut closest = f64::INFINITY;
        for &i in centers {
            let before = out.neighbors.len();
            self.center(i as usize, &mut probe, |j, _, shift, _, d2| {
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
    }

    /// Finds the pairs of centre `i` into `scratch.found` and leaves in
    /// `scratch.order` the indices into it in `(j, S)` order.
    #[inline]
    fn sorted_pairs(&self, i: usize, scratch: &mut Scratch) {
        let Scratch {
            found,
            keys,
            order,
            probe,
        } = scratch;
        found.clear();
        order.clear();
        self.center(i, probe, |j, image, shift, vector, d2| {
            found.push(Candidate {
                j,
                image,
                shift,
                vector,
                d2,
            })
        });
        if self.packed_keys && found.len() < (1 << INDEX_BITS) {
            keys.clear();
            keys.extend(found.iter().enumerate().map(|(index, c)| {
                ((c.j as u64) << 32) | ((c.image as u64) << INDEX_BITS) | index as u64
            }));
            keys.sort_unstable();
            order.extend(
                keys.iter()
                    .map(|&key| (key & ((1 << INDEX_BITS) - 1)) as u32),
            );
        } else {
            order.extend(0..found.len() as u32);
            order.sort_unstable_by_key(|&k| (found[k as usize].j, found[k as usize].shift));
        }
    }

    /// Calls `emit(j, image code, S, r_j + S·cell − r_i, |·|²)` for every
    /// neighbour of centre `i` (in bin order). `probe` is scratch.
    ///
    /// Two passes: the stencil walk tests every slot of every bin run
    /// against the search radius with a branch-free compress (a
    /// mispredicted branch per slot cost more than the test itself), then
    /// the few candidates get their index, shift and exact vector.
    #[inline(always)]
    fn center<F: FnMut(u32, u32, [i32; 3], [f64; 3], f64)>(
        &self,
        i: usize,
        probe: &mut Probe,
        mut emit: F,
    ) {
        let bins = self.bins;
        let index_i = i as u32;
        let wrap_i = bins.atom_wrap[i];
        let r_i = self.positions[i];
        self.collect_candidates(i, probe, |slots, slot_image, images| {
            for (&slot, &image_index) in slots.iter().zip(slot_image) {
                let slot = slot as usize;
                let j = bins.atom[slot];
                // Half lists: the compress already dropped j < i.
                let image = &images[image_index as usize];
                let wrap_j = bins.wrap[slot];
                // wrapped_j + T·cell − wrapped_i = r_j + (T + n_i − n_j)·cell − r_i.
                let shift = [
                    image.shift[0] + wrap_i[0] - wrap_j[0],
                    image.shift[1] + wrap_i[1] - wrap_j[1],
                    image.shift[2] + wrap_i[2] - wrap_j[2],
                ];
                if j == index_i && (shift == [0, 0, 0] || (self.half && !keep_in_half(j, j, shift)))
                {
                    continue;
                }
                // The same operations as the compress, hence the same d².
                let d = [
                    bins.wrapped_x[slot] - image.origin[0],
                    bins.wrapped_y[slot] - image.origin[1],
                    bins.wrapped_z[slot] - image.origin[2],
                ];
                let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if self.exact_candidates || (!self.fields.geometry && d2 < self.inside2) {
                    // The candidate distance decides (exact, or far enough
                    // inside the cutoff that rounding cannot).
                    if d2 < self.cutoff2 {
                        emit(j, image.code, shift, d, d2);
                    }
                    continue;
                }
                // Atoms wrapped alike (all of them when inside the cell)
                // have S = T, whose Cartesian shift the image holds.
                let shift_cart = if wrap_j == wrap_i {
                    image.shift_cartesian
                } else {
                    self.frame.shift_cartesian(shift)
                };
                let (vector, exact2) = pair_vector(r_i, bins.original[slot], shift_cart);
                if exact2 < self.cutoff2 {
                    emit(j, image.code, shift, vector, exact2);
                }
            }
        });
    }

    /// Walks the stencil of centre `i` and hands `process(slots, images of
    /// the slots, images)` the slots within the search radius of its wrapped
    /// position (for half lists only those with atom index ≥ `i`), in bin
    /// order, in batches of about [`PROBE_BATCH`] so that a centre with
    /// millions of images (tiny cells) needs no more scratch than any other.
    #[inline(always)]
    fn collect_candidates(
        &self,
        i: usize,
        probe: &mut Probe,
        mut process: impl FnMut(&[u32], &[u32], &[Image]),
    ) {
        let bins = self.bins;
        let grid = self.grid;
        let basis = &self.frame.basis;
        let bin_i = bins.atom_bin[i];
        let u_i = bins.atom_u[i];
        let w_i = bins.atom_wrapped[i];
        let index_i = i as u32;
        let st = grid.stencil;
        let reach = self.image_reach;
        let width = [2 * reach[1] as u32 + 1, 2 * reach[2] as u32 + 1];
        let search2 = self.search2;
        let half = self.half;
        let Probe {
            slots,
            slot_image,
            images,
        } = probe;
        images.clear();
        let mut n = 0usize;

        // Scans the z targets `z_lo..=z_hi` (raw) of the bin row (tx, ty)
        // seen through the image shifts (sx, sy) along x and y.
        let mut scan_row = |tx: usize, sx: i32, ty: usize, sy: i32, z_lo: i64, z_hi: i64| {
            let shift_xy = [
                sx as f64 * basis[0][0] + sy as f64 * basis[1][0],
                sx as f64 * basis[0][1] + sy as f64 * basis[1][1],
                sx as f64 * basis[0][2] + sy as f64 * basis[1][2],
            ];
            // Along z, consecutive bins are consecutive slot ranges: the
            // row's targets form runs that each share one image shift (one
            // run unless the row wraps around the cell).
            let row = (tx * grid.nbins[1] + ty) * grid.nbins[2];
            let mut t = z_lo;
            while t <= z_hi {
                let (first, sz) = self.wrap_tables[2][(t + st[2]) as usize];
                let extra = ((z_hi - t) as usize).min(grid.nbins[2] - 1 - first);
                let last = first + extra;
                t += extra as i64 + 1;
                let lo = bins.start[row + first] as usize;
                let hi = bins.start[row + last + 1] as usize;
                if lo == hi {
                    continue;
                }
                // The image of the run translated by T·cell, seen from w_i.
                let origin = [
                    w_i[0] - (shift_xy[0] + sz as f64 * basis[2][0]),
                    w_i[1] - (shift_xy[1] + sz as f64 * basis[2][1]),
                    w_i[2] - (shift_xy[2] + sz as f64 * basis[2][2]),
                ];
                let code = (((sx + reach[0]) as u32 * width[0]) + (sy + reach[1]) as u32)
                    * width[1]
                    + (sz + reach[2]) as u32;
                let start = n;
                // Tests the slots `from..to` (only atoms ≥ i in half lists).
                let mut scan = |from: usize, to: usize| {
                    if slots.len() < n + (to - from) {
                        slots.resize(n + (to - from), 0);
                    }
                    let room = &mut slots[n..n + (to - from)];
                    let (xs, ys, zs) = (
                        &bins.wrapped_x[from..to],
                        &bins.wrapped_y[from..to],
                        &bins.wrapped_z[from..to],
                    );
                    n += if half {
                        let atoms = &bins.atom[from..to];
                        compress_within(xs, ys, zs, origin, search2, from as u32, room, |k| {
                            atoms[k] >= index_i
                        })
                    } else {
                        compress_within(xs, ys, zs, origin, search2, from as u32, room, |_| true)
                    };
                };
                if half {
                    // A bin's atoms are in index order: bins whose last atom
                    // is below i hold none of the half list.
                    let mut from = lo;
                    for b in row + first..=row + last {
                        let to = bins.start[b + 1] as usize;
                        if to > from && bins.atom[to - 1] < index_i {
                            if bins.start[b] as usize > from {
                                scan(from, bins.start[b] as usize);
                            }
                            from = to;
                        }
                    }
                    if hi > from {
                        scan(from, hi);
                    }
                } else {
                    scan(lo, hi);
                }
                if n == start {
                    continue;
                }
                let image_index = images.len() as u32;
                images.push(Image {
                    shift: [sx, sy, sz],
                    code,
                    origin,
                    shift_cartesian: self.frame.shift_cartesian([sx, sy, sz]),
                });
                if slot_image.len() < n {
                    slot_image.resize(n, 0);
                }
                slot_image[start..n].fill(image_index);
                if n >= PROBE_BATCH || images.len() >= PROBE_BATCH {
                    process(&slots[..n], &slot_image[..n], images);
                    n = 0;
                    images.clear();
                }
            }
        };

        if let Some(rows) = &self.rows {
            // The precomputed rows: no per-centre trimming along x and y.
            for row in rows {
                let tx_raw = bin_i[0] as i64 + row.dx;
                let ty_raw = bin_i[1] as i64 + row.dy;
                if !grid.pbc[0] && (tx_raw < 0 || tx_raw >= grid.nbins[0] as i64) {
                    continue;
                }
                if !grid.pbc[1] && (ty_raw < 0 || ty_raw >= grid.nbins[1] as i64) {
                    continue;
                }
                let (tx, sx) = self.wrap_tables[0][(tx_raw + st[0]) as usize];
                let (ty, sy) = self.wrap_tables[1][(ty_raw + st[1]) as usize];
                let (z_lo, z_hi) = grid.targets(2, bin_i[2], u_i[2], row.reach_z);
                scan_row(tx, sx, ty, sy, z_lo, z_hi);
            }
        } else {
            // Stencils too wide for a table (cells far smaller than the
            // cutoff): trim each centre's rows to the bins its sphere reaches.
            let (x_lo, x_hi) = grid.targets(0, bin_i[0], u_i[0], self.search_radius);
            for tx_raw in x_lo..=x_hi {
                let gx = grid.gap(0, tx_raw, u_i[0]);
                let left_x = search2 - gx * gx;
                if grid.trimmed && left_x <= 0.0 {
                    continue;
                }
                let (tx, sx) = self.wrap_tables[0][(tx_raw + st[0]) as usize];
                let (y_lo, y_hi) = grid.targets(1, bin_i[1], u_i[1], left_x.max(0.0).sqrt());
                for ty_raw in y_lo..=y_hi {
                    let gy = grid.gap(1, ty_raw, u_i[1]);
                    let left_y = left_x - gy * gy;
                    if grid.trimmed && left_y <= 0.0 {
                        continue;
                    }
                    let (ty, sy) = self.wrap_tables[1][(ty_raw + st[1]) as usize];
                    let (z_lo, z_hi) = grid.targets(2, bin_i[2], u_i[2], left_y.max(0.0).sqrt());
                    scan_row(tx, sx, ty, sy, z_lo, z_hi);
                }
            }
        }
        process(&slots[..n], &slot_image[..n], images);
    }
}

/// Writes to the front of `room` the slots `first_slot + k` of the points
/// `(xs[k], ys[k], zs[k])` closer than `sqrt(radius2)` to `origin` for which
/// `keep(k)` holds, in order, and returns how many. Branch-free: every
/// point's slot is written and only those inside advance the count (a
/// mispredicted branch per point would cost more than its test), with the
/// count in a register rather than behind a captured reference.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn compress_within(
    xs: &[f64],
    ys: &[f64],
    zs: &[f64],
    origin: [f64; 3],
    radius2: f64,
    first_slot: u32,
    room: &mut [u32],
    keep: impl Fn(usize) -> bool,
) -> usize {
    let mut n = 0;
    for (k, ((&x, &y), &z)) in xs.iter().zip(ys).zip(zs).enumerate() {
        let d = [x - origin[0], y - origin[1], z - origin[2]];
        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
        room[n] = first_slot + k as u32;
        n += ((d2 < radius2) & keep(k)) as usize;
    }
    n
}

/// Largest stencil row table [`Search`] precomputes; wider stencils (cells
/// far smaller than the cutoff) trim each centre's rows on the fly.
const MAX_ROW_TABLE: usize = 4096;

/// One row of bins of the precomputed stencil, relative to the centre's
/// bin: offsets `dx`, `dy`, and how far along z (Å) from the centre the
/// row can hold a neighbour.
#[derive(Clone, Copy)]
struct StencilRow {
    dx: i64,
    dy: i64,
    reach_z: f64,
}

/// The rows of the stencil around a bin that can hold a point within
/// `radius` of some point of that bin. With axis-aligned bins the gap
/// between bins `d` apart is `(|d| − 1)·width` per axis, which cuts the
/// rows to a disc and gives each its reach along z; otherwise it is every
/// row of the box of half-widths `grid.stencil`. `None` when the table
/// would exceed [`MAX_ROW_TABLE`] rows.
fn stencil_rows(grid: &Grid, radius: f64) -> Option<Vec<StencilRow>> {
    let st = grid.stencil;
    let rows = (2 * st[0] + 1).checked_mul(2 * st[1] + 1)?;
    if rows as usize > MAX_ROW_TABLE {
        return None;
    }
    let r2 = radius * radius;
    let gap2 = |d: i64, axis: usize| {
        let g = (d.abs() - 1).max(0) as f64 * grid.width[axis];
        g * g
    };
    let mut table = Vec::with_capacity(rows as usize);
    for dx in -st[0]..=st[0] {
        for dy in -st[1]..=st[1] {
            let left = r2 - gap2(dx, 0) - gap2(dy, 1);
            if grid.trimmed && left <= 0.0 {
                continue;
            }
            // Unused by `Grid::targets` on untrimmed grids.
            let reach_z = left.max(0.0).sqrt();
            table.push(StencilRow { dx, dy, reach_z });
        }
    }
    Some(table)
}

/// Candidates (or images) after which a centre's stencil walk hands its
/// batch on.
const PROBE_BATCH: usize = 1024;

/// One periodic image of a bin run as a centre sees it.
#[derive(Clone, Copy)]
struct Image {
    /// The image shift T (bins of the run translated by T·cell).
    shift: [i32; 3],
    /// Stencil image code, monotone in T.
    code: u32,
    /// The centre's wrapped position minus T·cell: a slot's candidate vector
    /// is its wrapped position minus this.
    origin: [f64; 3],
    /// `T·cell` as [`Frame::shift_cartesian`] computes it (Å).
    shift_cartesian: [f64; 3],
}

/// Scratch of one centre's stencil walk, reused across centres.
#[derive(Default)]
struct Probe {
    /// Candidate slots (the first `n` entries are valid; the rest is room
    /// for the branch-free compress, which writes every slot it tests).
    slots: Vec<u32>,
    /// Per candidate, the index of its image in `images`.
    slot_image: Vec<u32>,
    /// The images of the runs walked for the current centre.
    images: Vec<Image>,
}
