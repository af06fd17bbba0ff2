//! Ownership and ghosts of a spatial domain decomposition.
//!
//! Ranks form a 3-D grid over fractional coordinates (row-major rank ids:
//! `rank = (i_a · n_b + i_b) · n_c + i_c`). Every atom is owned by the rank
//! whose domain contains its wrapped fractional position; every rank also
//! holds ghost copies `(atom j, image shift S)` of every periodic image within
//! `ghost_width` of its domain.
//!
//! Local frame: a rank's rows are its owned atoms (ascending global id) then
//! its ghosts. Owned atom `i` sits at `positions[i] + owned_shift·cell`, where
//! `owned_shift` wraps it into the cell along periodic axes (zero when the
//! input is already wrapped), and ghost `(j, S)` at `positions[j] + S·cell`.
//! All rows of a rank therefore live in one consistent Cartesian frame, so a
//! plain (non-periodic) neighbour search over the local rows finds every pair
//! of an owned atom within `ghost_width`.

mod balance;
mod grid;
mod group;
mod halo;
mod health;
mod map;

pub use balance::Balance;
#[cfg(test)]
use balance::CUT_BINS;
use balance::{axis_histogram, largest_gap_in, weighted_layouts, Layouts};
pub use grid::choose_grid;
pub use halo::{apply_refresh_serial, apply_reverse_sum_serial, halo_plans, HaloError, HaloPlan};
pub use health::{partition_health, AxisHealth, PartitionHealth, RankHealth};
pub use map::{partition_system_mapped, DomainMap, ImageScratch};

use ddmlip_atoms::{to_fractional, Cell, CellError, System, SystemError};
use group::{RankGroups, ATOM_CHUNK};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Upper bound on the number of ghost entries a partition may create; beyond
/// this the request is almost certainly a unit mistake (ghost width far larger
/// than the cell) and would exhaust memory.
pub const MAX_GHOST_ENTRIES: f64 = 2.5e8;

/// Bytes a partition holds per ghost entry at its peak: the candidate
/// `(rank, (atom, shift))` (32 bytes) and the sorted [`Ghost`] (40 bytes)
/// live together while the ghosts are ordered, and a run then keeps a
/// position and a halo-plan row per ghost.
pub const BYTES_PER_GHOST: f64 = 96.0;

/// Upper bound on the number of ranks of one partition. Far beyond any real
/// job; it keeps the grid search (linear in the rank count) and the per-rank
/// tables from hanging or exhausting memory on a mistyped `--ranks`.
pub const MAX_RANKS: usize = 1 << 24;

/// Fractional coordinates beyond this magnitude cannot be wrapped into `i32`
/// image shifts reliably.
const MAX_FRACTIONAL: f64 = 1.0e8;

/// Errors of [`partition_system`].
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PartitionError {
    /// `n_ranks` was zero.
    #[error("the number of ranks must be at least 1")]
    NoRanks,
    /// `n_ranks` exceeded [`MAX_RANKS`].
    #[error("{n_ranks} ranks is more than the supported maximum of {max}")]
    TooManyRanks {
        /// Ranks asked for.
        n_ranks: usize,
        /// The supported maximum.
        max: usize,
    },
    /// The ghost width was zero, negative or not finite.
    #[error("ghost width must be a positive finite length in Å, got {0}")]
    InvalidGhostWidth(f64),
    /// The system has no atoms.
    #[error("the system has no atoms to partition")]
    EmptySystem,
    /// Positions and atomic numbers differ in length.
    #[error("positions ({positions}) and atomic numbers ({numbers}) differ in length")]
    LengthMismatch {
        /// Number of positions.
        positions: usize,
        /// Number of atomic numbers.
        numbers: usize,
    },
    /// The cell cannot be used (non-finite, singular with a periodic axis).
    #[error("invalid cell: {0}")]
    InvalidCell(#[source] CellError),
    /// A periodic axis without any cell.
    #[error("axis {axis} is periodic but the system has no cell")]
    PeriodicWithoutCell {
        /// The periodic axis (0, 1, 2).
        axis: usize,
    },
    /// The per-rank weights of [`Balance::Weighted`] cannot be used.
    #[error("invalid rank weights: {0}")]
    BadRankWeights(String),
    /// An atom position is NaN or infinite.
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition {
        /// 0-based atom index.
        atom: usize,
        /// The position (Å).
        position: [f64; 3],
    },
    /// An atom lies absurdly many cells away from the origin cell.
    #[error("atom {atom} lies {fractional:.3e} cells away along axis {axis}; positions are probably in the wrong unit")]
    PositionTooFar {
        /// 0-based atom index.
        atom: usize,
        /// Lattice axis (0, 1, 2).
        axis: usize,
        /// Its fractional coordinate along that axis.
        fractional: f64,
    },
    /// The ghost width is so large compared with the cell that the ghost set
    /// would not fit in memory; refused before any ghost is made.
    #[error(
        "too many ghost images: about {estimated:.3e} ghost entries, {} of memory \
         (limit {limit:.1e} entries and {} available); ghost width {ghost_width} Å against \
         cell heights {heights:?} Å: use fewer ranks or a smaller cutoff",
        ddmlip_neighbors::format_bytes(*.estimated_bytes),
        ddmlip_neighbors::format_bytes(*.budget_bytes)
    )]
    TooManyGhosts {
        /// Ghost entries expected.
        estimated: f64,
        /// Memory they would take (bytes).
        estimated_bytes: f64,
        /// The most ghost entries accepted.
        limit: f64,
        /// Memory available (bytes).
        budget_bytes: f64,
        /// The ghost width asked for (Å).
        ghost_width: f64,
        /// Perpendicular heights of the cell (Å).
        heights: [f64; 3],
    },
    /// An atom coordinate beyond [`ddmlip_atoms::MAX_ABS_LENGTH`].
    #[error("{0}")]
    PositionOutOfRange(#[source] SystemError),
    /// Any other inconsistency [`System::validate`] reports.
    #[error("{0}")]
    InvalidSystem(#[source] SystemError),
    /// A fixed [`DomainMap`] does not fit the system or the request.
    #[error("the domain map does not fit: {0}")]
    MapMismatch(String),
}

/// One ghost row of a rank: periodic image `S` of global atom `global`,
/// located at `positions[global] + shift·cell`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Ghost {
    /// Global atom id (index into the system's positions).
    pub global: usize,
    /// Integer image shift `S` relative to the unwrapped input position; zero
    /// along non-periodic axes.
    pub shift: [i32; 3],
    /// Rank that owns `global`.
    pub owner_rank: usize,
    /// Row of `global` in the owner's `owned` list.
    pub owner_row: usize,
}

/// What one rank holds. Local rows: `owned` first (`0..n_owned`), then
/// `ghosts` (`n_owned..n_local`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankDomain {
    /// Rank id, `(i_a · n_b + i_b) · n_c + i_c`.
    pub rank: usize,
    /// Position `[i_a, i_b, i_c]` of this rank in the grid.
    pub grid_index: [usize; 3],
    /// Owned global atom ids, ascending.
    pub owned: Vec<usize>,
    /// For each owned atom, the image shift that wraps it into the cell along
    /// periodic axes (its local position is `positions[i] + shift·cell`).
    pub owned_shifts: Vec<[i32; 3]>,
    /// Ghost rows sorted by `(owner_rank, owner_row, shift)`.
    pub ghosts: Vec<Ghost>,
    /// Fractional bounds `[lo, hi]` of the domain per axis (in the cell's
    /// fractional coordinates, or Cartesian Å when the system has no usable cell).
    pub bounds_frac: [[f64; 2]; 3],
}

impl RankDomain {
    /// Number of owned rows.
    pub fn n_owned(&self) -> usize {
        self.owned.len()
    }

    /// Number of local rows (owned + ghosts).
    pub fn n_local(&self) -> usize {
        self.owned.len() + self.ghosts.len()
    }

    /// Global atom id of every local row (owned, then ghosts).
    pub fn local_globals(&self) -> Vec<usize> {
        self.owned
            .iter()
            .copied()
            .chain(self.ghosts.iter().map(|g| g.global))
            .collect()
    }

    /// Image shift of every local row (owned wrap shifts, then ghost shifts).
    pub fn local_shifts(&self) -> Vec<[i32; 3]> {
        self.owned_shifts
            .iter()
            .copied()
            .chain(self.ghosts.iter().map(|g| g.shift))
            .collect()
    }

    /// Cartesian position (Å) of every local row: `positions[j] + S·cell`
    /// with `S` from [`RankDomain::local_shifts`].
    ///
    /// `system` must be the system this partition was built from; a different
    /// system with fewer atoms makes this panic on indexing.
    pub fn local_positions(&self, system: &System) -> Vec<[f64; 3]> {
        let cell = system.cell_or_zero();
        self.local_globals()
            .into_iter()
            .zip(self.local_shifts())
            .map(|(j, s)| add(system.positions[j], cell.shift_vector(s)))
            .collect()
    }
}

/// A decomposition of one system over `grid` ranks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Partition {
    /// Ranks per axis; the product is the number of ranks.
    pub grid: [usize; 3],
    /// Halo width (Å): every image within this distance of a domain is a ghost.
    pub ghost_width: f64,
    /// Periodicity per axis, as in the system.
    pub periodic: [bool; 3],
    /// Rows are the frame vectors of the fractional coordinates: the cell, or
    /// the identity when the system has no usable cell.
    pub frame: [[f64; 3]; 3],
    /// Fractional range `[lo, hi]` split per axis: `[0, 1]` on periodic axes,
    /// the atoms' bounding box on the others.
    pub region_frac: [[f64; 2]; 3],
    /// Perpendicular width (Å) of the split region per axis.
    pub axis_widths: [f64; 3],
    /// One entry per rank, indexed by rank id.
    pub ranks: Vec<RankDomain>,
}

impl Partition {
    /// Number of ranks.
    pub fn n_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Rank id of grid position `[i_a, i_b, i_c]`.
    pub fn rank_of(&self, grid_index: [usize; 3]) -> usize {
        (grid_index[0] * self.grid[1] + grid_index[1]) * self.grid[2] + grid_index[2]
    }
}

/// The coordinate frame the domains are defined in.
struct Frame {
    matrix: [[f64; 3]; 3],
    inverse: [[f64; 3]; 3],
    heights: [f64; 3],
}

impl Frame {
    /// The cell when it is invertible; the identity (Cartesian) when there is
    /// no cell or a singular one on a fully non-periodic system.
    fn of(system: &System) -> Result<Frame, PartitionError> {
        let periodic = system.pbc.iter().any(|&p| p);
        if let Some(cell) = system.cell {
            match cell.inverse() {
                Ok(inverse) => {
                    return Ok(Frame {
                        matrix: cell.matrix,
                        inverse,
                        heights: [cell.height(0), cell.height(1), cell.height(2)],
                    })
                }
                Err(e) if periodic => return Err(PartitionError::InvalidCell(e)),
                Err(_) => {}
            }
        }
        let identity = Cell::orthorhombic(1.0, 1.0, 1.0).matrix;
        Ok(Frame {
            matrix: identity,
            inverse: identity,
            heights: [1.0; 3],
        })
    }
}

/// Per-axis layout of the domains: `n` intervals between `cuts`
/// (`cuts[0] = lo`, `cuts[n] = hi`, non-decreasing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct AxisLayout {
    #[serde(with = "map::vec_bits")]
    cuts: Vec<f64>,
    /// Fractional ghost margin, slightly enlarged so that rounding can only
    /// add ghosts, never drop one.
    #[serde(with = "map::scalar_bits")]
    margin: f64,
    periodic: bool,
}

impl AxisLayout {
    /// `n` equal intervals of `[lo, hi]`; the last one ends exactly at `hi`.
    fn even(lo: f64, hi: f64, n: usize, margin: f64, periodic: bool) -> Self {
        let step = (hi - lo) / n as f64;
        let mut cuts: Vec<f64> = (0..n).map(|d| lo + step * d as f64).collect();
        cuts.push(hi);
        Self {
            cuts,
            margin,
            periodic,
        }
    }

    fn n(&self) -> usize {
        self.cuts.len() - 1
    }

    fn lo(&self) -> f64 {
        self.cuts[0]
    }

    fn hi(&self) -> f64 {
        self.cuts[self.n()]
    }

    /// `[lo, hi]` of domain `d`.
    fn bounds(&self, d: usize) -> [f64; 2] {
        [self.cuts[d], self.cuts[d + 1]]
    }

    /// Domain containing `f`: half-open `[lo_d, hi_d)`, the last one closed;
    /// values outside the region are clamped to the end domains.
    fn owner(&self, f: f64) -> usize {
        self.cuts[1..self.n()].partition_point(|&c| c <= f)
    }

    /// Pushes every domain whose expanded interval contains `g` as `(m, d)`.
    fn push_domains(&self, g: f64, m: i32, out: &mut Vec<(i32, usize)>) {
        let n = self.n();
        // First domain whose upper end reaches g; the cuts only grow after it.
        let first = self.cuts[1..=n].partition_point(|&c| c + self.margin < g);
        for d in first..n {
            let [lo, hi] = self.bounds(d);
            if lo - self.margin > g {
                break;
            }
            if g <= hi + self.margin {
                out.push((m, d));
            }
        }
    }

    /// All `(image offset m, domain d)` pairs for an atom at (wrapped)
    /// fractional coordinate `f` on this axis.
    fn images(&self, f: f64, out: &mut Vec<(i32, usize)>) {
        out.clear();
        if self.periodic {
            let m_lo = (self.lo() - self.margin - f).ceil() as i32;
            let m_hi = (self.hi() + self.margin - f).floor() as i32;
            for m in m_lo..=m_hi {
                self.push_domains(f + m as f64, m, out);
            }
        } else {
            self.push_domains(f, 0, out);
        }
    }

    /// Rough mean number of `(m, d)` pairs per atom, for the memory guard.
    fn mean_images(&self) -> f64 {
        let n = self.n();
        let span = self.hi() - self.lo();
        let per_domain_fraction = if span > 0.0 {
            2.0 * self.margin * n as f64 / span
        } else {
            f64::INFINITY
        };
        if self.periodic {
            1.0 + per_domain_fraction + 2.0 * self.margin
        } else {
            (1.0 + per_domain_fraction).min(n as f64)
        }
    }
}

/// Splits `system` over `n_ranks` ranks with halos of `ghost_width` Å.
///
/// The grid comes from [`choose_grid`], given the width the atoms fill along
/// each axis (a periodic axis counts without a vacuum gap wider than
/// `ghost_width`, so slabs are not cut into sheets). Periodic axes are split evenly over
/// the wrapped fractional range `[0, 1)`; non-periodic axes (and all axes of a
/// system without cell) over the atoms' bounding box, atoms on the upper face
/// going to the last domain. Ghosts of a rank are every `(j, S)` whose image
/// `positions[j] + S·cell` lies inside the domain expanded by `ghost_width`
/// along each axis normal (a superset of the images within `ghost_width`),
/// except the rank's own owned rows. Ranks may own nothing. Cost is
/// O(N · images) plus a sort of each rank's ghosts; ranks run in parallel.
pub fn partition_system(
    system: &System,
    n_ranks: usize,
    ghost_width: f64,
) -> Result<Partition, PartitionError> {
    partition_system_balanced(system, n_ranks, ghost_width, Balance::Geometric)
}

/// [`partition_system`] with the domain boundaries placed by `balance`.
/// Ownership and ghost rules are the same; only the cuts move.
pub fn partition_system_balanced(
    system: &System,
    n_ranks: usize,
    ghost_width: f64,
    balance: Balance<'_>,
) -> Result<Partition, PartitionError> {
    partition_impl(system, n_ranks, ghost_width, balance, MapUse::Plain).map(|(p, _)| p)
}

/// How [`partition_impl`] treats the domain boundaries.
#[derive(Clone, Copy)]
pub(crate) enum MapUse<'m> {
    /// Place them from the atoms (`balance`); the ends of non-periodic axes
    /// are the atoms' bounding box.
    Plain,
    /// Place them from the atoms, then open the end domains of non-periodic
    /// axes to infinity, so that the map stays valid as atoms move out.
    Open,
    /// Use these boundaries.
    Fixed(&'m DomainMap),
}

/// The partition and the domain map it used.
pub(crate) fn partition_impl(
    system: &System,
    n_ranks: usize,
    ghost_width: f64,
    balance: Balance<'_>,
    map_use: MapUse<'_>,
) -> Result<(Partition, DomainMap), PartitionError> {
    if let Balance::Weighted(w) = balance {
        if w.len() != n_ranks {
            return Err(PartitionError::BadRankWeights(format!(
                "{} weights for {n_ranks} ranks",
                w.len()
            )));
        }
        if let Some((rank, x)) = w
            .iter()
            .enumerate()
            .find(|(_, x)| !(x.is_finite() && **x > 0.0))
        {
            return Err(PartitionError::BadRankWeights(format!(
                "rank {rank} has weight {x}; weights must be positive and finite"
            )));
        }
    }
    if n_ranks == 0 {
        return Err(PartitionError::NoRanks);
    }
    if n_ranks > MAX_RANKS {
        return Err(PartitionError::TooManyRanks {
            n_ranks,
            max: MAX_RANKS,
        });
    }
    if !(ghost_width.is_finite() && ghost_width > 0.0) {
        return Err(PartitionError::InvalidGhostWidth(ghost_width));
    }
    if system.positions.is_empty() {
        return Err(PartitionError::EmptySystem);
    }
    system.validate().map_err(|e| match e {
        SystemError::LengthMismatch { positions, numbers } => {
            PartitionError::LengthMismatch { positions, numbers }
        }
        SystemError::NonFinitePosition { atom, position } => {
            PartitionError::NonFinitePosition { atom, position }
        }
        SystemError::PeriodicWithoutCell { axis } => PartitionError::PeriodicWithoutCell { axis },
        SystemError::Cell(c) => PartitionError::InvalidCell(c),
        e @ SystemError::PositionOutOfRange { .. } => PartitionError::PositionOutOfRange(e),
        e => PartitionError::InvalidSystem(e),
    })?;
    let periodic = system.pbc;
    let frame = Frame::of(system)?;
    if let MapUse::Fixed(map) = map_use {
        map.check_fits(n_ranks, ghost_width, periodic, &frame.matrix)?;
    }

    // Fractional coordinates, wrapped along periodic axes, with the wrap shift
    // w such that positions[i] + w·cell is the wrapped position.
    let n_atoms = system.positions.len();
    let mut wrapped = vec![[0.0; 3]; n_atoms];
    let mut wrap_shift = vec![[0i32; 3]; n_atoms];
    wrapped
        .par_iter_mut()
        .zip(wrap_shift.par_iter_mut())
        .zip(system.positions.par_iter())
        .for_each(|((f_out, w_out), &r)| {
            (*f_out, *w_out) = wrap_fractional(&frame.inverse, periodic, r);
        });
    // Huge finite positions can overflow the fractional transform.
    let too_far = |x: &f64| !x.is_finite() || x.abs() >= MAX_FRACTIONAL;
    if let Some(atom) = wrapped.par_iter().position_first(|f| f.iter().any(too_far)) {
        if let Some((axis, &fractional)) =
            wrapped[atom].iter().enumerate().find(|(_, x)| too_far(x))
        {
            return Err(PartitionError::PositionTooFar {
                atom,
                axis,
                fractional,
            });
        }
    }

    // Region split per axis.
    let mut region = [[0.0, 1.0]; 3];
    for k in 0..3 {
        if !periodic[k] {
            let (lo, hi) = wrapped.par_iter().map(|f| (f[k], f[k])).reduce(
                || (f64::INFINITY, f64::NEG_INFINITY),
                |a, b| (a.0.min(b.0), a.1.max(b.1)),
            );
            region[k] = [lo, hi];
        }
    }
    let axis_widths: [f64; 3] =
        std::array::from_fn(|k| (region[k][1] - region[k][0]) * frame.heights[k]);
    // The grid is chosen for the extent the atoms fill: a periodic axis with
    // a vacuum gap wider than the halo (a slab) is split as if it were only
    // as wide as its atoms, so slabs are not cut into thin sheets.
    let filled_widths: [f64; 3] = std::array::from_fn(|k| {
        if !periodic[k] {
            return axis_widths[k];
        }
        let gap = largest_gap_in(&axis_histogram(&wrapped, k, 0.0, 1.0));
        if gap * frame.heights[k] > ghost_width {
            axis_widths[k] * (1.0 - gap)
        } else {
            axis_widths[k]
        }
    });
    let grid = match map_use {
        MapUse::Fixed(map) => map.grid,
        _ => choose_grid(filled_widths, periodic, n_ranks),
    };
    let margins: [f64; 3] = std::array::from_fn(|k| {
        let [lo, hi] = region[k];
        let exact = ghost_width / frame.heights[k];
        exact * (1.0 + 1e-9) + 1e-9 * (1.0 + lo.abs().max(hi.abs()))
    });
    let even =
        |k: usize| AxisLayout::even(region[k][0], region[k][1], grid[k], margins[k], periodic[k]);
    let layouts = match (map_use, balance) {
        (MapUse::Fixed(map), _) => map.layouts.clone(),
        (_, Balance::Geometric) => Layouts {
            a: even(0),
            b: vec![even(1)],
            c: vec![even(2)],
            regular: true,
        },
        (_, Balance::Weighted(_) | Balance::EvenCounts) => {
            let weight = |r: usize| match balance {
                Balance::Weighted(w) => w[r],
                _ => 1.0,
            };
            weighted_layouts(&wrapped, grid, region, weight, |k, cuts| AxisLayout {
                cuts,
                margin: margins[k],
                periodic: periodic[k],
            })
        }
    };

    let estimated = n_atoms as f64
        * [&layouts.a, &layouts.b[0], &layouts.c[0]]
            .iter()
            .map(|l| l.mean_images())
            .product::<f64>();
    let estimated_bytes = estimated * BYTES_PER_GHOST;
    let budget_bytes = ddmlip_neighbors::memory_budget_bytes();
    if estimated.is_nan() || estimated > MAX_GHOST_ENTRIES || estimated_bytes > budget_bytes {
        return Err(PartitionError::TooManyGhosts {
            estimated,
            estimated_bytes,
            limit: MAX_GHOST_ENTRIES,
            budget_bytes,
            ghost_width,
            heights: frame.heights,
        });
    }
    let mut layouts = layouts;
    if let MapUse::Open = map_use {
        layouts.open_non_periodic_ends();
    }

    let rank_of = |d: [usize; 3]| (d[0] * grid[1] + d[1]) * grid[2] + d[2];
    let owner: Vec<usize> = wrapped
        .par_iter()
        .map(|&f| rank_of(layouts.owner(f)))
        .collect();

    // Owned lists (ascending global id) and each atom's row in its owner.
    let owners = RankGroups::new(
        owner
            .par_chunks(ATOM_CHUNK)
            .enumerate()
            .map(|(c, part)| {
                let first = c * ATOM_CHUNK;
                part.iter()
                    .enumerate()
                    .map(|(k, &r)| (r, first + k))
                    .collect()
            })
            .collect(),
        n_ranks,
    );
    let owned = owners.per_rank();
    let mut owner_row = vec![0usize; n_atoms];
    owners.fill_positions(&mut owner_row, ATOM_CHUNK, |part, row, j| {
        part[j % ATOM_CHUNK] = row;
    });
    drop(owners);

    // Ghost candidates per atom chunk, in ascending (atom, shift) order: the
    // image offsets below are visited upwards on every axis.
    let chunks: Vec<Vec<(usize, GhostImage)>> = (0..n_atoms.div_ceil(ATOM_CHUNK))
        .into_par_iter()
        .map(|c| {
            // Sized for the atoms this chunk holds (all of them when the
            // system is smaller than a chunk), not for a full chunk.
            let atoms_here = ATOM_CHUNK.min(n_atoms - c * ATOM_CHUNK);
            let mut out =
                Vec::with_capacity((atoms_here as f64 * estimated / n_atoms as f64) as usize);
            let mut scratch = ImageScratch::default();
            for j in c * ATOM_CHUNK..((c + 1) * ATOM_CHUNK).min(n_atoms) {
                let w = wrap_shift[j];
                layouts.for_each_image(wrapped[j], grid, owner[j], &mut scratch, |rank, m| {
                    out.push((rank, (j, [w[0] + m[0], w[1] + m[1], w[2] + m[2]])));
                });
            }
            out
        })
        .collect();

    let candidates = RankGroups::new(chunks, n_ranks);
    let ranks: Vec<RankDomain> = owned
        .into_par_iter()
        .enumerate()
        .map(|(rank, owned)| {
            let ghosts = ordered_ghosts(
                || {
                    candidates.items_of(rank).map(|(j, shift)| Ghost {
                        global: j,
                        shift,
                        owner_rank: owner[j],
                        owner_row: owner_row[j],
                    })
                },
                n_ranks,
            );
            let grid_index = [
                rank / (grid[1] * grid[2]),
                (rank / grid[2]) % grid[1],
                rank % grid[2],
            ];
            let bounds_frac = layouts.bounds(grid_index);
            let owned_shifts = owned.iter().map(|&i| wrap_shift[i]).collect();
            RankDomain {
                rank,
                grid_index,
                owned,
                owned_shifts,
                ghosts,
                bounds_frac,
            }
        })
        .collect();

    let partition = Partition {
        grid,
        ghost_width,
        periodic,
        frame: frame.matrix,
        region_frac: region,
        axis_widths,
        ranks,
    };
    let map = DomainMap {
        grid,
        frame: frame.matrix,
        inverse: frame.inverse,
        periodic,
        ghost_width,
        layouts,
    };
    Ok((partition, map))
}

/// Fractional coordinates of `r` in the frame of `inverse`, wrapped into
/// `[0, 1)` along periodic axes, and the integer shift `w` that wraps it
/// (`r + w·cell` is the wrapped position; zero on other axes and for
/// coordinates too far out to wrap, which the caller rejects).
pub(crate) fn wrap_fractional(
    inverse: &[[f64; 3]; 3],
    periodic: [bool; 3],
    r: [f64; 3],
) -> ([f64; 3], [i32; 3]) {
    let f = to_fractional(inverse, r);
    let mut f_out = f;
    let mut w_out = [0i32; 3];
    for k in 0..3 {
        if periodic[k] && f[k].abs() < MAX_FRACTIONAL {
            let mut w = -f[k].floor();
            // A tiny negative coordinate wraps to exactly 1.0 in floating
            // point; keep it in the first cell instead.
            if f[k] + w >= 1.0 {
                w -= 1.0;
            }
            w_out[k] = w as i32;
            f_out[k] = f[k] + w;
        }
    }
    (f_out, w_out)
}

/// A ghost candidate before its owner is looked up: atom id and image shift.
type GhostImage = (usize, [i32; 3]);

/// Ghost rows in the order [`RankDomain::ghosts`] promises, `(owner_rank,
/// owner_row, shift)`, from candidates in ascending `(atom, shift)` order
/// (the image loops run upwards). Within one owner, ascending atom ids are
/// ascending owner rows, so a stable bucketing by owner rank is enough.
fn ordered_ghosts<I: Iterator<Item = Ghost>>(
    candidates: impl Fn() -> I,
    n_ranks: usize,
) -> Vec<Ghost> {
    let n = candidates().count();
    if n_ranks <= n {
        // Counting sort, linear when there are fewer ranks than ghosts; the
        // candidates are walked twice rather than copied.
        let mut start = vec![0usize; n_ranks + 1];
        for g in candidates() {
            start[g.owner_rank + 1] += 1;
        }
        for r in 0..n_ranks {
            start[r + 1] += start[r];
        }
        let mut ghosts = vec![
            Ghost {
                global: 0,
                shift: [0; 3],
                owner_rank: 0,
                owner_row: 0,
            };
            n
        ];
        for g in candidates() {
            ghosts[start[g.owner_rank]] = g;
            start[g.owner_rank] += 1;
        }
        ghosts
    } else {
        let mut ghosts: Vec<Ghost> = candidates().collect();
        ghosts.sort_by_key(|g| g.owner_rank);
        ghosts
    }
}

fn add(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

#[cfg(test)]
mod tests;
