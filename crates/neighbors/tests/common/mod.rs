//! Helpers shared by the integration tests.
#![allow(dead_code)]

use ddmlip_neighbors::NeighborList;

/// SplitMix64: a tiny seeded generator so the tests need no RNG crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
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
    let basis = [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5],
        [0.5, 0.0, 0.5],
        [0.5, 0.5, 0.0],
    ];
    let mut positions = Vec::with_capacity(4 * repeats.pow(3));
    for x in 0..repeats {
        for y in 0..repeats {
            for z in 0..repeats {
                for b in &basis {
                    positions.push([
                        (x as f64 + b[0]) * a,
                        (y as f64 + b[1]) * a,
                        (z as f64 + b[2]) * a,
                    ]);
                }
            }
        }
    }
    let l = a * repeats as f64;
    (positions, [[l, 0.0, 0.0], [0.0, l, 0.0], [0.0, 0.0, l]])
}
