//! Helpers shared by the integration tests.
#![allow(dead_code)]

use ddmlip_atoms::build::{self, SplitMix64};
use ddmlip_neighbors::NeighborList;

/// The shared seeded generator ([`SplitMix64`]), with uniform numbers in a
/// range.
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * 0.5 * (self.0.uniform() + 1.0)
    }
}

/// The (i, j, S) triples of a list, in list order.
pub fn triples(list: &NeighborList) -> Vec<(u32, u32, [i32; 3])> {
    list.centers
        .iter()
        .zip(&list.neighbors)
        .zip(&list.shifts)
        .map(|((&i, &j), &s)| (i, j, s))
        .collect()
}

/// Asserts two lists hold the same (i, j, S) in the same order and the same
/// vectors and distances to `tol` Å.
pub fn assert_same(fast: &NeighborList, reference: &NeighborList, tol: f64) {
    assert_eq!(triples(fast), triples(reference), "pair sets differ");
    for p in 0..fast.len() {
        for k in 0..3 {
            assert!(
                (fast.vectors[p][k] - reference.vectors[p][k]).abs() <= tol,
                "vector of pair {p} differs: {:?} vs {:?}",
                fast.vectors[p],
                reference.vectors[p]
            );
        }
        assert!((fast.distances[p] - reference.distances[p]).abs() <= tol);
    }
}

/// FCC lattice of `repeats³` cubic cells with lattice constant `a` (Å).
pub fn fcc(a: f64, repeats: usize) -> (Vec<[f64; 3]>, [[f64; 3]; 3]) {
    let sys = build::fcc(18, a, repeats);
    let l = a * repeats as f64;
    (sys.positions, [[l, 0.0, 0.0], [0.0, l, 0.0], [0.0, 0.0, l]])
}
