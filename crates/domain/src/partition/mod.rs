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

mod grid;
mod halo;
mod health;

pub use grid::choose_grid;
pub use halo::{apply_refresh_serial, apply_reverse_sum_serial, halo_plans, HaloError, HaloPlan};
pub use health::{partition_health, AxisHealth, PartitionHealth, RankHealth};

use ddmlip_atoms::{to_fractional, Cell, CellError, System, SystemError};
use rayon::prelude::*;
use serde::Serialize;
use thiserror::Error;

/// Upper bound on the number of ghost entries a partition may create; beyond
/// this the request is almost certainly a unit mistake (ghost width far larger
/// than the cell) and would exhaust memory.
pub const MAX_GHOST_ENTRIES: f64 = 2.5e8;

/// Upper bound on the number of ranks of one partition. Far beyond any real
/// job; it keeps the grid search (linear in the rank count) and the per-rank
/// tables from hanging or exhausting memory on a mistyped `--ranks`.
pub const MAX_RANKS: usize = 1 << 24;

/// Fractional coordinates beyond this magnitude cannot be wrapped into `i32`
/// image shifts reliably.
const MAX_FRACTIONAL: f64 = 1.0e8;

/// Errors of [`partition_system`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PartitionError {
    /// `n_ranks` was zero.
    #[error("the number of ranks must be at least 1")]
    NoRanks,
    /// `n_ranks` exceeded [`MAX_RANKS`].
    #[error("{n_ranks} ranks is more than the supported maximum of {max}")]
    TooManyRanks { n_ranks: usize, max: usize },
    /// The ghost width was zero, negative or not finite.
    #[error("ghost width must be a positive finite length in Å, got {0}")]
    InvalidGhostWidth(f64),
    /// The system has no atoms.
    #[error("the system has no atoms to partition")]
    EmptySystem,
    /// Positions and atomic numbers differ in length.
    #[error("positions ({positions}) and atomic numbers ({numbers}) differ in length")]
    LengthMismatch { positions: usize, numbers: usize },
    /// The cell cannot be used (non-finite, singular with a periodic axis).
    #[error("invalid cell: {0}")]
    InvalidCell(#[source] CellError),
    /// A periodic axis without any cell.
    #[error("axis {axis} is periodic but the system has no cell")]
    PeriodicWithoutCell { axis: usize },
    /// An atom position is NaN or infinite.
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition { atom: usize, position: [f64; 3] },
    /// An atom lies absurdly many cells away from the origin cell.
    #[error("atom {atom} lies {fractional:.3e} cells away along axis {axis}; positions are probably in the wrong unit")]
    PositionTooFar {
        atom: usize,
        axis: usize,
        fractional: f64,
    },
    /// The ghost width is so large compared with the cell that the ghost set
    /// would not fit in memory.
    #[error(
        "too many ghost images: about {estimated:.3e} ghost entries (limit {limit:.1e}); \
         ghost width {ghost_width} Å against cell heights {heights:?} Å"
    )]
    TooManyGhosts {
        estimated: f64,
        limit: f64,
        ghost_width: f64,
        heights: [f64; 3],
    },
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

/// Per-axis layout of the domains.
#[derive(Clone, Copy)]
struct AxisLayout {
    lo: f64,
    hi: f64,
    n: usize,
    /// Fractional ghost margin, slightly enlarged so that rounding can only
    /// add ghosts, never drop one.
    margin: f64,
    periodic: bool,
}

impl AxisLayout {
    fn step(&self) -> f64 {
        (self.hi - self.lo) / self.n as f64
    }

    /// `[lo, hi]` of domain `d`; the last domain ends exactly at `hi`.
    fn bounds(&self, d: usize) -> [f64; 2] {
        let lo = self.lo + self.step() * d as f64;
        let hi = if d + 1 == self.n {
            self.hi
        } else {
            self.lo + self.step() * (d + 1) as f64
        };
        [lo, hi]
    }

    /// Domain containing `f`: half-open `[lo_d, hi_d)`, the last one closed;
    /// values outside the region are clamped to the end domains.
    fn owner(&self, f: f64) -> usize {
        let step = self.step();
        let mut d = if step > 0.0 {
            let x = ((f - self.lo) / step).floor();
            x.clamp(0.0, (self.n - 1) as f64) as usize
        } else {
            self.n - 1
        };
        // Rounding in the division can land one off; settle on the stored bounds.
        while d > 0 && f < self.bounds(d)[0] {
            d -= 1;
        }
        while d + 1 < self.n && f >= self.bounds(d)[1] {
            d += 1;
        }
        d
    }

    /// Pushes every domain whose expanded interval contains `g` as `(m, d)`.
    fn push_domains(&self, g: f64, m: i32, out: &mut Vec<(i32, usize)>) {
        let step = self.step();
        let (first, last) = if step > 0.0 {
            let a = ((g - self.margin - self.lo) / step).floor() - 1.0;
            let b = ((g + self.margin - self.lo) / step).floor() + 1.0;
            let top = (self.n - 1) as f64;
            if b < 0.0 || a > top {
                return;
            }
            (a.max(0.0) as usize, b.min(top) as usize)
        } else {
            (0, self.n - 1)
        };
        for d in first..=last {
            let [lo, hi] = self.bounds(d);
            if lo - self.margin <= g && g <= hi + self.margin {
                out.push((m, d));
            }
        }
    }

    /// All `(image offset m, domain d)` pairs for an atom at (wrapped)
    /// fractional coordinate `f` on this axis.
    fn images(&self, f: f64, out: &mut Vec<(i32, usize)>) {
        out.clear();
        if self.periodic {
            let m_lo = (self.lo - self.margin - f).ceil() as i32;
            let m_hi = (self.hi + self.margin - f).floor() as i32;
            for m in m_lo..=m_hi {
                self.push_domains(f + m as f64, m, out);
            }
        } else {
            self.push_domains(f, 0, out);
        }
    }

    /// Rough mean number of `(m, d)` pairs per atom, for the memory guard.
    fn mean_images(&self) -> f64 {
        let span = self.hi - self.lo;
        let per_domain_fraction = if span > 0.0 {
            2.0 * self.margin * self.n as f64 / span
        } else {
            f64::INFINITY
        };
        if self.periodic {
            1.0 + per_domain_fraction + 2.0 * self.margin
        } else {
            (1.0 + per_domain_fraction).min(self.n as f64)
        }
    }
}

/// Splits `system` over `n_ranks` ranks with halos of `ghost_width` Å.
///
/// The grid comes from [`choose_grid`]. Periodic axes are split evenly over
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
    })?;
    let periodic = system.pbc;
    let frame = Frame::of(system)?;

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
            let f = to_fractional(&frame.inverse, r);
            for k in 0..3 {
                f_out[k] = f[k];
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
        });
    for (atom, f) in wrapped.iter().enumerate() {
        // Huge finite positions can overflow the fractional transform.
        if let Some((axis, &fractional)) = f
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite() || x.abs() >= MAX_FRACTIONAL)
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
            let (lo, hi) = wrapped
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), f| {
                    (lo.min(f[k]), hi.max(f[k]))
                });
            region[k] = [lo, hi];
        }
    }
    let axis_widths: [f64; 3] =
        std::array::from_fn(|k| (region[k][1] - region[k][0]) * frame.heights[k]);
    let grid = choose_grid(axis_widths, periodic, n_ranks);
    let layouts: [AxisLayout; 3] = std::array::from_fn(|k| {
        let [lo, hi] = region[k];
        let exact = ghost_width / frame.heights[k];
        AxisLayout {
            lo,
            hi,
            n: grid[k],
            margin: exact * (1.0 + 1e-9) + 1e-9 * (1.0 + lo.abs().max(hi.abs())),
            periodic: periodic[k],
        }
    });

    let estimated = n_atoms as f64 * layouts.iter().map(AxisLayout::mean_images).product::<f64>();
    if estimated.is_nan() || estimated > MAX_GHOST_ENTRIES {
        return Err(PartitionError::TooManyGhosts {
            estimated,
            limit: MAX_GHOST_ENTRIES,
            ghost_width,
            heights: frame.heights,
        });
    }

    let rank_of = |d: [usize; 3]| (d[0] * grid[1] + d[1]) * grid[2] + d[2];
    let owner: Vec<usize> = wrapped
        .par_iter()
        .map(|f| {
            rank_of(std::array::from_fn(|k| {
                layouts[k].owner(f[k].max(layouts[k].lo))
            }))
        })
        .collect();

    // Owned lists (ascending global id) and each atom's row in its owner.
    let mut owned: Vec<Vec<usize>> = vec![Vec::new(); n_ranks];
    let mut owner_row = vec![0usize; n_atoms];
    for (j, &r) in owner.iter().enumerate() {
        owner_row[j] = owned[r].len();
        owned[r].push(j);
    }

    // Ghost candidates per atom chunk, in ascending atom order.
    const CHUNK: usize = 2048;
    let chunks: Vec<Vec<(usize, usize, [i32; 3])>> = (0..n_atoms.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut out = Vec::new();
            let mut axis_images: [Vec<(i32, usize)>; 3] = Default::default();
            for j in c * CHUNK..((c + 1) * CHUNK).min(n_atoms) {
                for k in 0..3 {
                    layouts[k].images(wrapped[j][k], &mut axis_images[k]);
                }
                let w = wrap_shift[j];
                for &(m0, d0) in &axis_images[0] {
                    for &(m1, d1) in &axis_images[1] {
                        for &(m2, d2) in &axis_images[2] {
                            let rank = rank_of([d0, d1, d2]);
                            if rank == owner[j] && m0 == 0 && m1 == 0 && m2 == 0 {
                                continue; // the owned row itself
                            }
                            out.push((rank, j, [w[0] + m0, w[1] + m1, w[2] + m2]));
                        }
                    }
                }
            }
            out
        })
        .collect();

    // Bucket by rank (counting sort keeps the ascending atom order).
    let mut counts = vec![0usize; n_ranks];
    for chunk in &chunks {
        for &(r, _, _) in chunk {
            counts[r] += 1;
        }
    }
    let mut per_rank: Vec<Vec<Ghost>> = counts.iter().map(|&c| Vec::with_capacity(c)).collect();
    for chunk in chunks {
        for (r, j, shift) in chunk {
            per_rank[r].push(Ghost {
                global: j,
                shift,
                owner_rank: owner[j],
                owner_row: owner_row[j],
            });
        }
    }

    let ranks: Vec<RankDomain> = per_rank
        .into_par_iter()
        .zip(owned.into_par_iter())
        .enumerate()
        .map(|(rank, (mut ghosts, owned))| {
            ghosts.sort_unstable_by_key(|g| (g.owner_rank, g.owner_row, g.shift));
            let grid_index = [
                rank / (grid[1] * grid[2]),
                (rank / grid[2]) % grid[1],
                rank % grid[2],
            ];
            let bounds_frac = std::array::from_fn(|k| layouts[k].bounds(grid_index[k]));
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

    Ok(Partition {
        grid,
        ghost_width,
        periodic,
        frame: frame.matrix,
        region_frac: region,
        axis_widths,
        ranks,
    })
}

fn add(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

#[cfg(test)]
mod tests;
