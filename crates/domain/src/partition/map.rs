//! The domains of a partition as geometric regions every rank can test on
//! its own: which rank owns a position, which ranks hold an image of it as
//! a ghost, and which ranks can ever exchange atoms. Molecular dynamics keeps
//! one map between load-balancing repartitions, so that a rank migrates its
//! atoms and finds its ghosts with its neighbours only.

use super::balance::Layouts;
use super::*;

pub(crate) use crate::serde_bits::{scalar_bits, vec_bits};

/// Serde helper: a 3×3 matrix as bit patterns.
pub(crate) mod matrix_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[[f64; 3]; 3], s: S) -> Result<S::Ok, S::Error> {
        v.map(|r| r.map(f64::to_bits)).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[[f64; 3]; 3], D::Error> {
        Ok(<[[u64; 3]; 3]>::deserialize(d)?.map(|r| r.map(f64::from_bits)))
    }
}

/// Reusable buffers of [`DomainMap::for_each_image`] (no allocation per atom).
#[derive(Debug, Default, Clone)]
pub struct ImageScratch {
    pub(super) axes: [Vec<(i32, usize)>; 3],
}

/// The domain boundaries of a partition, frozen: a pure function from a
/// position to its owner rank and to the ranks holding its ghost images.
///
/// Ranks form the grid of [`Partition::grid`]; boundaries are fractional
/// coordinates of `frame` (the cell at the time of the partition). The end
/// domains of non-periodic axes extend to infinity, so every position has an
/// owner. [`partition_system_mapped`] with this map reproduces exactly the
/// ownership and ghost rules a rank applies locally with
/// [`DomainMap::owner`] and [`DomainMap::for_each_image`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainMap {
    /// Ranks per axis; the product is the number of ranks.
    pub grid: [usize; 3],
    /// Frame vectors (rows) of the fractional coordinates.
    #[serde(with = "matrix_bits")]
    pub frame: [[f64; 3]; 3],
    /// Inverse of `frame` (Cartesian → fractional).
    #[serde(with = "matrix_bits")]
    pub inverse: [[f64; 3]; 3],
    /// Periodicity per axis.
    pub periodic: [bool; 3],
    /// Halo width (Å) the ghost margins were made for.
    #[serde(with = "scalar_bits")]
    pub ghost_width: f64,
    pub(super) layouts: Layouts,
}

impl Layouts {
    /// Opens the first and last domain of every non-periodic axis to ±∞.
    pub(super) fn open_non_periodic_ends(&mut self) {
        let open = |l: &mut AxisLayout| {
            if !l.periodic {
                let n = l.n();
                l.cuts[0] = f64::NEG_INFINITY;
                l.cuts[n] = f64::INFINITY;
            }
        };
        open(&mut self.a);
        self.b.iter_mut().for_each(open);
        self.c.iter_mut().for_each(open);
    }
}

impl DomainMap {
    /// Number of ranks.
    pub fn n_ranks(&self) -> usize {
        self.grid.iter().product()
    }

    /// Fractional coordinates of `r` wrapped into `[0, 1)` along periodic
    /// axes, and the integer image shift `w` that wraps it (`r + w·frame`),
    /// computed exactly as the partition computes them.
    pub fn wrap(&self, r: [f64; 3]) -> ([f64; 3], [i32; 3]) {
        wrap_fractional(&self.inverse, self.periodic, r)
    }

    /// The rank owning wrapped fractional position `f`.
    pub fn owner(&self, f: [f64; 3]) -> usize {
        let d = self.layouts.owner(f);
        (d[0] * self.grid[1] + d[1]) * self.grid[2] + d[2]
    }

    /// Calls `visit(rank, m)` for every ghost row an atom at wrapped
    /// fractional position `f`, owned by `owner`, gives: image offset `m`
    /// (in cell vectors, relative to the wrapped position) held by `rank`.
    /// The order is the partition's: `m` ascending per axis, outermost
    /// axis first. The owned row itself (`m = 0` on `owner`) is skipped.
    pub fn for_each_image(
        &self,
        f: [f64; 3],
        owner: usize,
        scratch: &mut ImageScratch,
        visit: impl FnMut(usize, [i32; 3]),
    ) {
        self.layouts
            .for_each_image(f, self.grid, owner, scratch, visit);
    }

    /// The grid position of `rank`.
    fn grid_index(&self, rank: usize) -> [usize; 3] {
        let g = self.grid;
        [rank / (g[1] * g[2]), (rank / g[2]) % g[1], rank % g[2]]
    }

    /// The ranks (ascending, without `rank` itself) whose domain comes
    /// within the ghost margin of `rank`'s domain along every axis, through
    /// any periodic image: every rank that can hold a ghost of one of
    /// `rank`'s atoms or own a ghost `rank` holds (the relation is
    /// symmetric), and every rank an atom can migrate to after moving less
    /// than the ghost width.
    pub fn neighbours(&self, rank: usize) -> Vec<usize> {
        let mine = self.layouts.bounds(self.grid_index(rank));
        let margins = [
            self.layouts.a.margin,
            self.layouts.b[0].margin,
            self.layouts.c[0].margin,
        ];
        (0..self.n_ranks())
            .filter(|&other| other != rank)
            .filter(|&other| {
                let theirs = self.layouts.bounds(self.grid_index(other));
                (0..3).all(|k| {
                    let [lo, hi] = mine[k];
                    let [olo, ohi] = theirs[k];
                    let reach = if self.periodic[k] {
                        margins[k].ceil() as i32 + 1
                    } else {
                        0
                    };
                    (-reach..=reach).any(|m| {
                        let m = f64::from(m);
                        olo + m <= hi + margins[k] && ohi + m >= lo - margins[k]
                    })
                })
            })
            .collect()
    }

    /// Whether a fresh partition could place other boundaries (false for a
    /// regular grid over a cell periodic on every axis, whose boundaries
    /// never depend on the atoms).
    pub fn can_change(&self) -> bool {
        !(self.layouts.regular && self.periodic == [true; 3])
    }

    /// Checks that the map is whole (a checkpoint may hold anything) and
    /// made for this request: rank count, ghost width, periodicity and frame
    /// (bit for bit).
    pub(super) fn check_fits(
        &self,
        n_ranks: usize,
        ghost_width: f64,
        periodic: [bool; 3],
        frame: &[[f64; 3]; 3],
    ) -> Result<(), PartitionError> {
        let bad = |what: String| Err(PartitionError::MapMismatch(what));
        if self.grid.contains(&0)
            || self.grid.iter().try_fold(1usize, |a, &g| a.checked_mul(g)) != Some(n_ranks)
        {
            return bad(format!("grid {:?} for {n_ranks} ranks", self.grid));
        }
        if ghost_width.to_bits() != self.ghost_width.to_bits() {
            return bad(format!(
                "ghost width {} Å, the map was made for {} Å",
                ghost_width, self.ghost_width
            ));
        }
        if periodic != self.periodic {
            return bad(format!(
                "periodicity {periodic:?}, the map was made for {:?}",
                self.periodic
            ));
        }
        if frame.map(|r| r.map(f64::to_bits)) != self.frame.map(|r| r.map(f64::to_bits)) {
            return bad("the cell differs from the one the map was made for".into());
        }
        let [na, nb, nc] = self.grid;
        let l = &self.layouts;
        let (n_b, n_c) = if l.regular { (1, 1) } else { (na, na * nb) };
        if l.b.len() != n_b || l.c.len() != n_c {
            return bad("layout tables of the wrong size".into());
        }
        let axis_ok = |a: &AxisLayout, n: usize, k: usize| {
            a.cuts.len() == n + 1
                && a.periodic == periodic[k]
                && a.margin.is_finite()
                && a.margin > 0.0
                && a.cuts.iter().all(|c| !c.is_nan())
                && a.cuts.windows(2).all(|w| w[0] <= w[1])
        };
        if !(axis_ok(&l.a, na, 0)
            && l.b.iter().all(|b| axis_ok(b, nb, 1))
            && l.c.iter().all(|c| axis_ok(c, nc, 2)))
        {
            return bad("domain boundaries are not ordered cuts of the grid".into());
        }
        Ok(())
    }
}

/// [`partition_system_balanced`] for a run that keeps its domains: with
/// `map`, the domains are that map's (the cell must be the one it was made
/// for); without, they are placed by `balance` and the end domains of
/// non-periodic axes are opened to infinity. Returns the partition and the
/// map it used; the partition's owners and ghosts are exactly those that
/// [`DomainMap::owner`] and [`DomainMap::for_each_image`] give.
pub fn partition_system_mapped(
    system: &System,
    n_ranks: usize,
    ghost_width: f64,
    balance: Balance<'_>,
    map: Option<&DomainMap>,
) -> Result<(Partition, DomainMap), PartitionError> {
    let map_use = match map {
        Some(m) => MapUse::Fixed(m),
        None => MapUse::Open,
    };
    partition_impl(system, n_ranks, ghost_width, balance, map_use)
}
