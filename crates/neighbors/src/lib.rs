//! Neighbour lists for atomic systems: all pairs `(i, j, S)` with
//! `|r_j + S·cell − r_i| < cutoff` other than the self pair `(i, i, 0)`, for triclinic cells, mixed periodicity,
//! open systems and cells smaller than the cutoff (many periodic images).
//!
//! [`neighbor_list`] is an O(N) cell-list search parallelised with rayon;
//! [`brute_force_neighbor_list`] is the O(N²·images) reference used in tests.
//! Both return the same pairs in the same order: sorted by `i`, then `j`, then
//! `S` (lexicographically), independent of the number of threads.

#![forbid(unsafe_code)]

mod brute;
mod cell_list;
mod frame;
mod memory;

use ddmlip_atoms::{Cell, System, MAX_ABS_LENGTH};
use thiserror::Error;

pub use brute::brute_force_neighbor_list;
pub use cell_list::{
    neighbor_list, neighbor_list_for_centers, neighbor_list_into, pair_list_for_centers,
    pair_list_for_centers_into, ChunkRunner, PairScratch,
};
pub use frame::Frame;
pub use memory::{format_bytes, memory_budget_bytes, FALLBACK_MEMORY_BUDGET};

/// Inputs whose estimated pair count exceeds this are rejected with
/// [`NeighborError::TooManyPairs`], whatever the memory: per-chunk offsets
/// are `u32`. A search that finds more pairs than this (atoms far denser
/// somewhere than the uniform estimate assumed) stops with the same error.
pub const MAX_ESTIMATED_PAIRS: f64 = 2_147_483_648.0; // 2^31

/// Bytes per pair of a [`NeighborList`]: two `u32` indices, an `[i32; 3]`
/// shift, an `[f64; 3]` vector and an `f64` distance.
pub const NEIGHBOR_LIST_BYTES_PER_PAIR: f64 = 52.0;

/// Bytes per pair of a [`PairList`] with shifts: two `u32` and an `[i32; 3]`.
pub const PAIR_LIST_BYTES_PER_PAIR: f64 = 20.0;

/// A search whose stencil would visit more than this many (bin, image)
/// cells in total is refused with [`NeighborError::SearchTooCostly`]: a
/// cell so skewed (or so small against the cutoff) that the search would
/// run for minutes although the pairs themselves may be few.
pub const MAX_STENCIL_VISITS: f64 = 1.0e8;

/// Atoms farther than this many cell lengths from the cell along a periodic
/// axis are rejected: their image shifts would not fit in `i32`.
pub const MAX_CELLS_AWAY: f64 = 268_435_456.0; // 2^28

/// What to search for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NeighborOptions {
    /// Spherical cutoff (Å), finite and > 0. Pairs at exactly `cutoff` are excluded.
    pub cutoff: f64,
    /// `false`: full list, every pair in both directions. `true`: half list,
    /// each unordered pair once, kept as `(i, j, S)` when `i < j`, or when
    /// `i == j` and `S` is lexicographically positive (e.g. `[0, 0, 1]`,
    /// `[1, -2, 0]`); the mirrored `(j, i, −S)` is dropped.
    pub half: bool,
}

/// A neighbour list in structure-of-arrays form; all vectors have length
/// [`NeighborList::len`], entry `p` describes pair `p`.
///
/// Invariants: sorted by `(centers, neighbors, shifts)`; `shifts[p][k] == 0` on
/// every non-periodic axis `k`; no entry has `i == j` and `S == 0`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NeighborList {
    /// Centre atom `i` of each pair.
    pub centers: Vec<u32>,
    /// Neighbour atom `j` of each pair.
    pub neighbors: Vec<u32>,
    /// Integer cell shift `S` of the neighbour image, relative to the positions
    /// exactly as given (not wrapped).
    pub shifts: Vec<[i32; 3]>,
    /// `r_j + S·cell − r_i` (Å).
    pub vectors: Vec<[f64; 3]>,
    /// `|vectors[p]|` (Å), in `[0, cutoff)`. Zero only for two distinct atoms
    /// at the same point: such pairs are kept (as ASE and vesin do) so that
    /// overlapping atoms stay visible instead of being dropped silently.
    pub distances: Vec<f64>,
}

impl NeighborList {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.centers.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.centers.is_empty()
    }

    /// Number of pairs whose centre is each atom, for atoms `0..n_atoms`
    /// (centres `>= n_atoms` are ignored).
    pub fn counts_per_center(&self, n_atoms: usize) -> Vec<u32> {
        let mut counts = vec![0u32; n_atoms];
        for &i in &self.centers {
            if let Some(c) = counts.get_mut(i as usize) {
                *c += 1;
            }
        }
        counts
    }

    /// Empties the list, keeping its allocations.
    pub fn clear(&mut self) {
        self.centers.clear();
        self.neighbors.clear();
        self.shifts.clear();
        self.vectors.clear();
        self.distances.clear();
    }
}

/// The topology of a neighbour list without its geometry: what a model's
/// runtime graph needs (it recomputes the pair vectors differentiably), at
/// about a third of [`NeighborList`]'s memory.
///
/// The pairs of [`NeighborList`], grouped by centre in increasing order
/// (within a centre in search order, not sorted by `(j, S)`); `shifts` is
/// empty when no axis is periodic (every shift would be zero).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairList {
    /// Centre atom `i` of each pair.
    pub centers: Vec<u32>,
    /// Neighbour atom `j` of each pair.
    pub neighbors: Vec<u32>,
    /// Integer cell shift `S` of each pair (empty without periodic axes).
    pub shifts: Vec<[i32; 3]>,
    /// The shortest pair: (pair index, distance in Å); `None` when empty.
    pub closest: Option<(usize, f64)>,
}

impl PairList {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.centers.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.centers.is_empty()
    }
}

/// Why a neighbour list could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum NeighborError {
    /// The cutoff is zero, negative, NaN or infinite.
    #[error("cutoff must be finite and > 0 Å, got {0}")]
    InvalidCutoff(f64),
    /// An atom has a NaN or infinite coordinate.
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition {
        /// 0-based atom index.
        atom: usize,
        /// The position (Å).
        position: [f64; 3],
    },
    /// A periodic axis was requested without a cell.
    #[error("axis {axis} is periodic but no cell was given")]
    MissingCell {
        /// The periodic axis (0, 1, 2).
        axis: usize,
    },
    /// An atom coordinate beyond [`ddmlip_atoms::MAX_ABS_LENGTH`].
    #[error(
        "atom {atom} has coordinate {axis} = {value:e} Å, beyond the supported {limit:e} Å; \
         positions are probably in the wrong unit"
    )]
    PositionOutOfRange {
        /// 0-based atom index.
        atom: usize,
        /// Cartesian axis (0, 1, 2).
        axis: usize,
        /// The coordinate (Å).
        value: f64,
        /// The largest supported magnitude (Å).
        limit: f64,
    },
    /// A periodic lattice-vector entry beyond [`ddmlip_atoms::MAX_ABS_LENGTH`].
    #[error(
        "cell entry [{row}][{col}] of periodic lattice vector {row} is {value:e} Å, \
         beyond the supported {limit:e} Å; lengths are probably in the wrong unit"
    )]
    CellOutOfRange {
        /// Lattice vector (0, 1, 2).
        row: usize,
        /// Cartesian component (0, 1, 2).
        col: usize,
        /// The entry (Å).
        value: f64,
        /// The largest supported magnitude (Å).
        limit: f64,
    },
    /// A lattice vector of a periodic axis contains NaN or infinity.
    #[error("cell entry [{row}][{col}] of periodic lattice vector {row} is not finite ({value})")]
    NonFiniteCell {
        /// Lattice vector (0, 1, 2).
        row: usize,
        /// Cartesian component (0, 1, 2).
        col: usize,
        /// The entry.
        value: f64,
    },
    /// A periodic axis has a zero lattice vector.
    #[error("lattice vector {axis} is zero but axis {axis} is periodic")]
    ZeroLatticeVector {
        /// The periodic axis (0, 1, 2).
        axis: usize,
    },
    /// The periodic lattice vectors are (nearly) linearly dependent.
    #[error(
        "the periodic lattice vectors are singular or degenerate (normalised volume {measure:.3e}); \
         periodic axes need linearly independent lattice vectors"
    )]
    DegenerateCell {
        /// Volume (area with two periodic axes) over the product of the vectors' lengths: 1 orthogonal, 0 dependent.
        measure: f64,
    },
    /// An atom lies so far outside the cell that its image shift overflows.
    #[error("atom {atom} lies {cells:.3e} cell lengths outside the cell along periodic axis {axis}; wrap it first")]
    PositionTooFar {
        /// 0-based atom index.
        atom: usize,
        /// The periodic axis (0, 1, 2).
        axis: usize,
        /// Distance from the cell in cell heights.
        cells: f64,
    },
    /// More atoms than `u32` indices can address.
    #[error("{0} atoms exceed the u32 index range")]
    TooManyAtoms(usize),
    /// The requested list would not fit in memory (or exceeds
    /// [`MAX_ESTIMATED_PAIRS`]); refused before anything was allocated, or
    /// as soon as the search found more pairs than that.
    #[error(
        "cutoff {cutoff} Å would give about {estimated_pairs:.3e} pairs, {} of memory \
         (limit {limit_pairs:.3e} pairs and {} available); reduce the cutoff or check the cell",
        crate::format_bytes(*.estimated_bytes),
        crate::format_bytes(*.budget_bytes)
    )]
    TooManyPairs {
        /// The cutoff asked for (Å).
        cutoff: f64,
        /// Pairs expected from the density (or found so far).
        estimated_pairs: f64,
        /// Memory those pairs would take (bytes).
        estimated_bytes: f64,
        /// The most pairs accepted.
        limit_pairs: f64,
        /// Memory available for the list (bytes).
        budget_bytes: f64,
    },
    /// The cell is so skewed, or so small against the cutoff, that the
    /// search would visit absurdly many cells per atom.
    #[error(
        "cutoff {cutoff} Å against cell heights {heights:?} Å would make the search visit about \
         {visits:.3e} cells (limit {limit:.1e}); the cell is too skewed or too small: \
         reduce it (e.g. ase.build.niggli_reduce) or replicate it"
    )]
    SearchTooCostly {
        /// The cutoff asked for (Å).
        cutoff: f64,
        /// Perpendicular heights of the cell (Å).
        heights: [f64; 3],
        /// Cells the search would visit per atom.
        visits: f64,
        /// The most visits accepted per atom.
        limit: f64,
    },
}

/// [`neighbor_list`] for a [`System`] (its positions, cell and pbc).
pub fn system_neighbor_list(
    system: &System,
    opts: &NeighborOptions,
) -> Result<NeighborList, NeighborError> {
    neighbor_list(&system.positions, system.cell.as_ref(), system.pbc, opts)
}

/// Validated inputs shared by both algorithms.
pub(crate) struct Prepared {
    pub frame: frame::Frame,
    /// Unwrapped fractional coordinates of every atom in `frame`.
    pub fractional: Vec<[f64; 3]>,
    /// Per axis: (min, max) of the fractional coordinates (open axes only are used).
    pub frac_range: [(f64, f64); 3],
    /// Uniform-density estimate of the number of pairs in the full list.
    pub estimated_pairs: f64,
}

/// Checks every input, builds the frame and the fractional coordinates, and
/// rejects inputs whose estimated pair count is absurd.
pub(crate) fn prepare(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
) -> Result<Prepared, NeighborError> {
    let cutoff = opts.cutoff;
    if !(cutoff.is_finite() && cutoff > 0.0) {
        return Err(NeighborError::InvalidCutoff(cutoff));
    }
    if positions.len() > u32::MAX as usize {
        return Err(NeighborError::TooManyAtoms(positions.len()));
    }
    for (atom, p) in positions.iter().enumerate() {
        if !p.iter().all(|x| x.is_finite()) {
            return Err(NeighborError::NonFinitePosition { atom, position: *p });
        }
        // The rounding margin of the search grows with the largest
        // coordinate; beyond a physical range it would make the stencil, and
        // the work and memory derived from it, explode.
        if let Some(axis) = p.iter().position(|x| x.abs() > MAX_ABS_LENGTH) {
            return Err(NeighborError::PositionOutOfRange {
                atom,
                axis,
                value: p[axis],
                limit: MAX_ABS_LENGTH,
            });
        }
    }
    let frame = frame::Frame::new(cell, pbc)?;
    let mut frac_range = [(f64::INFINITY, f64::NEG_INFINITY); 3];
    let mut fractional = Vec::with_capacity(positions.len());
    for (atom, &p) in positions.iter().enumerate() {
        let f = frame.fractional(p);
        for axis in 0..3 {
            if pbc[axis] && (!f[axis].is_finite() || f[axis].abs() > MAX_CELLS_AWAY) {
                return Err(NeighborError::PositionTooFar {
                    atom,
                    axis,
                    cells: f[axis].abs(),
                });
            }
            let (lo, hi) = &mut frac_range[axis];
            *lo = lo.min(f[axis]);
            *hi = hi.max(f[axis]);
        }
        fractional.push(f);
    }

    let estimated_pairs = estimate_pairs(positions.len(), &frame, &frac_range, cutoff);
    check_pairs_fit(cutoff, estimated_pairs, NEIGHBOR_LIST_BYTES_PER_PAIR)?;
    Ok(Prepared {
        frame,
        fractional,
        frac_range,
        estimated_pairs,
    })
}

/// Uniform-density estimate of the number of pairs of a full list:
/// `N · N · V_sphere / V_region`, with the sphere clipped to the atoms'
/// extent along open axes. The region is the periodic cell (the measure of
/// the periodic lattice vectors, `|det|` of the frame) times the atoms'
/// extent along each open axis; an open axis thinner than the cutoff sphere
/// counts the sphere's slice of that thickness. For cells smaller than the
/// cutoff this is the number of lattice points in the sphere up to surface
/// terms; skewed cells are measured by their volume, not by the box of their
/// heights, which overestimates them by orders of magnitude.
fn estimate_pairs(
    n_atoms: usize,
    frame: &frame::Frame,
    frac_range: &[(f64, f64); 3],
    cutoff: f64,
) -> f64 {
    let n = n_atoms as f64;
    let sphere = 4.0 / 3.0 * std::f64::consts::PI * cutoff.powi(3);
    let mut per_atom_density = n * sphere / frame.measure;
    for (&(lo, hi), periodic) in frac_range.iter().zip(frame.pbc) {
        if !periodic {
            // Open basis rows are unit vectors: fractional extent is Å.
            let extent = hi - lo;
            per_atom_density /= extent.max(2.0 * cutoff);
        }
    }
    n * per_atom_density
}

/// Refuses `estimated_pairs` of `bytes_per_pair` each beyond
/// [`MAX_ESTIMATED_PAIRS`] or the memory budget.
pub(crate) fn check_pairs_fit(
    cutoff: f64,
    estimated_pairs: f64,
    bytes_per_pair: f64,
) -> Result<(), NeighborError> {
    let estimated_bytes = estimated_pairs * bytes_per_pair;
    let budget_bytes = memory_budget_bytes();
    if estimated_pairs.is_nan()
        || estimated_pairs > MAX_ESTIMATED_PAIRS
        || estimated_bytes > budget_bytes
    {
        return Err(NeighborError::TooManyPairs {
            cutoff,
            estimated_pairs,
            estimated_bytes,
            limit_pairs: MAX_ESTIMATED_PAIRS,
            budget_bytes,
        });
    }
    Ok(())
}

/// The half-list rule: keep `(i, j, S)` when `i < j`, or `i == j` and `S > 0`
/// lexicographically.
#[inline]
pub(crate) fn keep_in_half(i: u32, j: u32, shift: [i32; 3]) -> bool {
    i < j || (i == j && shift > [0, 0, 0])
}
