//! Where the domains' boundaries go: [`Balance`], the weighted cuts placed
//! from coordinate histograms, and the three levels of axis layouts.

use super::*;

/// How the domains' boundaries are placed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Balance<'a> {
    /// Equal widths in fractional coordinates along each axis: a regular grid.
    #[default]
    Geometric,
    /// Staggered cuts: slabs along the first axis, columns within each slab,
    /// boxes within each column, placed so that rank `r` owns a share of the
    /// atoms proportional to `weights[r]` (one positive, finite weight per
    /// rank). Equal weights give equal atom counts, which regular grids miss
    /// in slabs, clusters and other uneven systems. Atoms sharing a
    /// coordinate stay on one side of a cut, so a lattice plane is never
    /// split and shares are met to within a plane.
    Weighted(&'a [f64]),
    /// `Weighted` with the same weight for every rank: even atom counts.
    EvenCounts,
}

/// Fine bins per domain interval used to place weighted cuts.
pub(super) const CUT_BINS: usize = 4096;

/// The bin of [`CUT_BINS`] over `[0, 1)` holding `fraction`; values outside
/// land in the end bins.
pub(super) fn cut_bin(fraction: f64) -> usize {
    (fraction * CUT_BINS as f64)
        .floor()
        .clamp(0.0, (CUT_BINS - 1) as f64) as usize
}

/// Cuts of `[lo, hi]` into `targets.len()` intervals holding the given
/// fractions (summing to 1) of the atoms whose coordinates `coords` yields.
/// Placed by linear interpolation inside a histogram of [`CUT_BINS`] bins;
/// without atoms the cuts are proportional to the targets.
pub(super) fn quantile_cuts(
    lo: f64,
    hi: f64,
    targets: &[f64],
    coords: impl Iterator<Item = f64>,
) -> Vec<f64> {
    let mut hist = vec![0usize; CUT_BINS];
    count_into(&mut hist, coords, lo, hi - lo);
    cuts_from_histogram(lo, hi, targets, &hist)
}

/// Adds each coordinate to its bin of [`CUT_BINS`] over `[lo, lo + span]`;
/// adds nothing when `span` is not positive.
pub(super) fn count_into(
    hist: &mut [usize],
    coords: impl Iterator<Item = f64>,
    lo: f64,
    span: f64,
) {
    if span > 0.0 {
        for f in coords {
            hist[cut_bin((f - lo) / span)] += 1;
        }
    }
}

/// Histogram of [`CUT_BINS`] bins over `[lo, lo + span]` of coordinate
/// `axis` of all `points`, filled in parallel (counts: the result does not
/// depend on the thread count).
pub(super) fn axis_histogram(points: &[[f64; 3]], axis: usize, lo: f64, span: f64) -> Vec<usize> {
    points
        .par_chunks(ATOM_CHUNK)
        .fold(
            || vec![0usize; CUT_BINS],
            |mut hist, part| {
                count_into(&mut hist, part.iter().map(|f| f[axis]), lo, span);
                hist
            },
        )
        .reduce(
            || vec![0usize; CUT_BINS],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        )
}

/// The cuts of [`quantile_cuts`] from a histogram of [`CUT_BINS`] bins over
/// `[lo, hi]`.
pub(super) fn cuts_from_histogram(lo: f64, hi: f64, targets: &[f64], hist: &[usize]) -> Vec<f64> {
    let span = hi - lo;
    let total: usize = hist.iter().sum();
    let mut cuts = Vec::with_capacity(targets.len() + 1);
    cuts.push(lo);
    let mut want = 0.0;
    let (mut bin, mut below) = (0usize, 0usize);
    for &t in &targets[..targets.len().saturating_sub(1)] {
        want += t;
        let cut = if total == 0 {
            lo + span * want
        } else {
            let need = want * total as f64;
            while bin < CUT_BINS && (below + hist[bin]) as f64 <= need {
                below += hist[bin];
                bin += 1;
            }
            let inside = if bin < CUT_BINS && hist[bin] > 0 {
                ((need - below as f64) / hist[bin] as f64).clamp(0.0, 1.0)
            } else {
                0.0
            };
            lo + span * (bin as f64 + inside) / CUT_BINS as f64
        };
        let prev = *cuts.last().unwrap_or(&lo);
        cuts.push(cut.clamp(prev, hi));
    }
    cuts.push(hi);
    cuts
}

/// The widest empty stretch, as a fraction of the period, between the
/// non-empty bins of a histogram of [`CUT_BINS`] bins over `[0, 1)`
/// (circularly), resolved to 1/[`CUT_BINS`]. No atoms give 1.
pub(super) fn largest_gap_in(hist: &[usize]) -> f64 {
    let Some(first) = hist.iter().position(|&n| n > 0) else {
        return 1.0;
    };
    // Runs of empty bins, starting after a filled one so that the run that
    // wraps around the period is counted whole.
    let (mut longest, mut run) = (0usize, 0usize);
    for k in 1..=CUT_BINS {
        if hist[(first + k) % CUT_BINS] > 0 {
            longest = longest.max(run);
            run = 0;
        } else {
            run += 1;
        }
    }
    longest as f64 / CUT_BINS as f64
}

/// The three levels of domain layouts: one for the first axis, one per slab
/// for the second, one per (slab, column) for the third.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Layouts {
    pub(super) a: AxisLayout,
    pub(super) b: Vec<AxisLayout>,
    pub(super) c: Vec<AxisLayout>,
    /// Every slab and column uses the same layout (a regular grid).
    pub(super) regular: bool,
}

impl Layouts {
    pub(super) fn b(&self, d0: usize) -> &AxisLayout {
        &self.b[if self.regular { 0 } else { d0 }]
    }

    pub(super) fn c(&self, d0: usize, d1: usize) -> &AxisLayout {
        &self.c[if self.regular {
            0
        } else {
            d0 * self.b[0].n() + d1
        }]
    }

    pub(super) fn owner(&self, f: [f64; 3]) -> [usize; 3] {
        let d0 = self.a.owner(f[0]);
        let d1 = self.b(d0).owner(f[1]);
        [d0, d1, self.c(d0, d1).owner(f[2])]
    }

    /// Calls `visit(rank, m)` for every periodic image offset `m` of an
    /// atom at wrapped fractional position `f` and every domain of the
    /// `grid` whose expanded box holds that image, in ascending `(m, rank)`
    /// order per axis, except the atom's own row (`m = 0` in `owner`).
    pub(super) fn for_each_image(
        &self,
        f: [f64; 3],
        grid: [usize; 3],
        owner: usize,
        scratch: &mut ImageScratch,
        mut visit: impl FnMut(usize, [i32; 3]),
    ) {
        let rank_of = |d: [usize; 3]| (d[0] * grid[1] + d[1]) * grid[2] + d[2];
        let axis_images = &mut scratch.axes;
        self.a.images(f[0], &mut axis_images[0]);
        if self.regular {
            self.b(0).images(f[1], &mut axis_images[1]);
            self.c(0, 0).images(f[2], &mut axis_images[2]);
        }
        let [img0, img1, img2] = axis_images;
        for &(m0, d0) in img0.iter() {
            if !self.regular {
                self.b(d0).images(f[1], img1);
            }
            for &(m1, d1) in img1.iter() {
                if !self.regular {
                    self.c(d0, d1).images(f[2], img2);
                }
                for &(m2, d2) in img2.iter() {
                    let rank = rank_of([d0, d1, d2]);
                    if rank == owner && m0 == 0 && m1 == 0 && m2 == 0 {
                        continue; // the owned row itself
                    }
                    visit(rank, [m0, m1, m2]);
                }
            }
        }
    }

    pub(super) fn bounds(&self, d: [usize; 3]) -> [[f64; 2]; 3] {
        [
            self.a.bounds(d[0]),
            self.b(d[0]).bounds(d[1]),
            self.c(d[0], d[1]).bounds(d[2]),
        ]
    }
}

/// Staggered layouts for [`Balance::Weighted`]: slab cuts from all atoms,
/// column cuts from each slab's atoms, box cuts from each column's atoms,
/// each level aiming at the summed weights of the ranks it holds.
pub(super) fn weighted_layouts(
    wrapped: &[[f64; 3]],
    grid: [usize; 3],
    region: [[f64; 2]; 3],
    weight: impl Fn(usize) -> f64 + Sync,
    layout: impl Fn(usize, Vec<f64>) -> AxisLayout + Sync,
) -> Layouts {
    let [na, nb, nc] = grid;
    let (layout, weight) = (&layout, &weight);
    let rank_of = |d0: usize, d1: usize, d2: usize| (d0 * nb + d1) * nc + d2;
    let shares = |w: Vec<f64>| {
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect::<Vec<f64>>()
    };
    let slab_w = shares(
        (0..na)
            .map(|d0| (0..nb * nc).map(|r| weight(d0 * nb * nc + r)).sum())
            .collect(),
    );
    let a = layout(0, {
        let [lo, hi] = region[0];
        cuts_from_histogram(lo, hi, &slab_w, &axis_histogram(wrapped, 0, lo, hi - lo))
    });
    // Each level's cuts only look at the coordinates of the atoms the level
    // above gave them: second coordinates per slab, third per column.
    let tagged = |tag: &(dyn Fn([f64; 3]) -> (usize, f64) + Sync)| -> Vec<Vec<(usize, f64)>> {
        wrapped
            .par_chunks(ATOM_CHUNK)
            .map(|part| part.iter().map(|&f| tag(f)).collect())
            .collect()
    };
    let per_slab = RankGroups::new(tagged(&|f| (a.owner(f[0]), f[1])), na).per_rank();
    let b: Vec<AxisLayout> = per_slab
        .into_par_iter()
        .enumerate()
        .map(|(d0, coords)| {
            let col_w = shares(
                (0..nb)
                    .map(|d1| (0..nc).map(|d2| weight(rank_of(d0, d1, d2))).sum())
                    .collect(),
            );
            layout(
                1,
                quantile_cuts(region[1][0], region[1][1], &col_w, coords.into_iter()),
            )
        })
        .collect();
    let column_of = |f: [f64; 3]| {
        let d0 = a.owner(f[0]);
        d0 * nb + b[d0].owner(f[1])
    };
    let per_column = RankGroups::new(tagged(&|f| (column_of(f), f[2])), na * nb).per_rank();
    let c: Vec<AxisLayout> = per_column
        .into_par_iter()
        .enumerate()
        .map(|(col, coords)| {
            let (d0, d1) = (col / nb, col % nb);
            let box_w = shares((0..nc).map(|d2| weight(rank_of(d0, d1, d2))).collect());
            layout(
                2,
                quantile_cuts(region[2][0], region[2][1], &box_w, coords.into_iter()),
            )
        })
        .collect();
    Layouts {
        a,
        b,
        c,
        regular: false,
    }
}
