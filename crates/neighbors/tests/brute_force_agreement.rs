//! The cell-list search against the exhaustive reference on random systems,
//! plus checks of the reference itself against analytic shell counts.

mod common;

use common::{assert_same, fcc, triples};
use ddmlip_atoms::Cell;
use ddmlip_neighbors::{
    brute_force_neighbor_list, neighbor_list, pair_list_for_centers, NeighborList, NeighborOptions,
};
use proptest::prelude::*;

fn full(cutoff: f64) -> NeighborOptions {
    NeighborOptions {
        cutoff,
        half: false,
    }
}

fn half(cutoff: f64) -> NeighborOptions {
    NeighborOptions { cutoff, half: true }
}

/// The half rule applied to a full list: keep i < j, or i == j with S > 0.
fn filter_half(list: &NeighborList) -> Vec<(u32, u32, [i32; 3])> {
    triples(list)
        .into_iter()
        .filter(|&(i, j, s)| i < j || (i == j && s > [0, 0, 0]))
        .collect()
}

/// Normalised volume |det| / (|a||b||c|): 1 for orthogonal vectors, 0 when dependent.
fn normalised_volume(m: &[[f64; 3]; 3]) -> f64 {
    let c = Cell::new(*m);
    let n: f64 = (0..3).map(|k| c.length(k)).product();
    c.volume() / n
}

#[derive(Debug, Clone)]
struct RandomSystem {
    cell: [[f64; 3]; 3],
    pbc: [bool; 3],
    fractional: Vec<[f64; 3]>,
    cutoff: f64,
}

impl RandomSystem {
    fn positions(&self) -> Vec<[f64; 3]> {
        let cell = Cell::new(self.cell);
        self.fractional
            .iter()
            .map(|&f| cell.to_cartesian(f))
            .collect()
    }
}

fn cell_strategy() -> impl Strategy<Value = [[f64; 3]; 3]> {
    let orthorhombic = (2.0..15.0f64, 2.0..15.0f64, 2.0..15.0f64)
        .prop_map(|(a, b, c)| [[a, 0.0, 0.0], [0.0, b, 0.0], [0.0, 0.0, c]]);
    // Off-diagonals up to twice the edge: strongly skewed, heights much
    // smaller than lengths.
    let skewed = (
        3.0..12.0f64,
        3.0..12.0f64,
        3.0..12.0f64,
        -2.0..2.0f64,
        -2.0..2.0f64,
        -2.0..2.0f64,
    )
        .prop_map(|(a, b, c, x, y, z)| [[a, 0.0, 0.0], [x * a, b, 0.0], [y * a, z * b, c]]);
    let generic = proptest::array::uniform3(proptest::array::uniform3(-8.0..8.0f64))
        .prop_filter("well-conditioned", |m| normalised_volume(m) > 0.2);
    // Smaller than typical cutoffs: many images per axis.
    let tiny = (0.9..2.5f64, 0.9..2.5f64, 0.9..2.5f64, -0.5..0.5f64)
        .prop_map(|(a, b, c, x)| [[a, 0.0, 0.0], [x * a, b, 0.0], [0.0, x * b, c]]);
    let huge = (40.0..200.0f64, 40.0..200.0f64, 40.0..200.0f64)
        .prop_map(|(a, b, c)| [[a, 0.0, 0.0], [0.0, b, 0.0], [0.1 * a, 0.0, c]]);
    prop_oneof![orthorhombic, skewed, generic, tiny, huge]
}

fn system_strategy() -> impl Strategy<Value = RandomSystem> {
    (
        cell_strategy(),
        proptest::array::uniform3(any::<bool>()),
        proptest::collection::vec(proptest::array::uniform3(-1.5..2.5f64), 0..14),
        0.3..5.0f64,
    )
        .prop_map(|(cell, pbc, fractional, cutoff)| RandomSystem {
            cell,
            pbc,
            fractional,
            cutoff,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn cell_list_matches_brute_force(system in system_strategy()) {
        let positions = system.positions();
        let cell = Cell::new(system.cell);
        for opts in [full(system.cutoff), half(system.cutoff)] {
            let fast = neighbor_list(&positions, Some(&cell), system.pbc, &opts).unwrap();
            let reference = brute_force_neighbor_list(&positions, Some(&cell), system.pbc, &opts).unwrap();
            assert_same(&fast, &reference, 1e-12);
        }
    }

    #[test]
    fn half_list_is_full_list_one_direction(system in system_strategy()) {
        let positions = system.positions();
        let cell = Cell::new(system.cell);
        let f = neighbor_list(&positions, Some(&cell), system.pbc, &full(system.cutoff)).unwrap();
        let h = neighbor_list(&positions, Some(&cell), system.pbc, &half(system.cutoff)).unwrap();
        prop_assert_eq!(triples(&h), filter_half(&f));
        // Every full pair has its mirror (j, i, −S) with the opposite vector.
        let set: std::collections::HashSet<_> = triples(&f).into_iter().collect();
        for (i, j, s) in triples(&f) {
            prop_assert!(set.contains(&(j, i, [-s[0], -s[1], -s[2]])));
        }
        // Open axes never carry a shift.
        for s in &f.shifts {
            for (&periodic, &shift) in system.pbc.iter().zip(s) {
                prop_assert!(periodic || shift == 0);
            }
        }
    }

    /// The geometry-free pair list of the first centres: the brute-force
    /// pairs with those centres, grouped by centre in increasing order (any
    /// order within a centre), shifts only when some axis is periodic, and
    /// the closest pair's distance.
    #[test]
    fn pair_list_matches_brute_force(system in system_strategy(), centre_fraction in 0.0..1.2f64) {
        let positions = system.positions();
        let cell = Cell::new(system.cell);
        let n_centers = (positions.len() as f64 * centre_fraction) as usize;
        for opts in [full(system.cutoff), half(system.cutoff)] {
            let lean = pair_list_for_centers(&positions, Some(&cell), system.pbc, &opts, n_centers).unwrap();
            let reference = brute_force_neighbor_list(&positions, Some(&cell), system.pbc, &opts).unwrap();
            let keep: Vec<usize> = (0..reference.len())
                .filter(|&e| (reference.centers[e] as usize) < n_centers)
                .collect();
            prop_assert_eq!(lean.len(), keep.len());
            let periodic = system.pbc.iter().any(|&p| p);
            prop_assert_eq!(lean.shifts.len(), if periodic { keep.len() } else { 0 });
            prop_assert!(lean.centers.windows(2).all(|w| w[0] <= w[1]), "not grouped by centre");
            let shift = |list_shifts: &[[i32; 3]], e: usize| if periodic { list_shifts[e] } else { [0; 3] };
            let mut found: Vec<(u32, u32, [i32; 3])> = (0..lean.len())
                .map(|k| (lean.centers[k], lean.neighbors[k], shift(&lean.shifts, k)))
                .collect();
            let expected: Vec<(u32, u32, [i32; 3])> = keep
                .iter()
                .map(|&e| (reference.centers[e], reference.neighbors[e], reference.shifts[e]))
                .collect();
            // The reference is sorted by (i, j, S); the lean list only by i.
            found.sort_unstable();
            prop_assert_eq!(&found, &expected);
            let shortest = keep.iter().map(|&e| reference.distances[e]).fold(f64::INFINITY, f64::min);
            match lean.closest {
                None => prop_assert!(keep.is_empty()),
                Some((p, d)) => {
                    prop_assert!((d - shortest).abs() <= 1e-9 * shortest.max(1.0));
                    let pair = (lean.centers[p], lean.neighbors[p], shift(&lean.shifts, p));
                    let e = keep[expected.binary_search(&pair).unwrap()];
                    prop_assert!((reference.distances[e] - d).abs() <= 1e-9 * d.max(1.0));
                }
            }
        }
    }

    /// Many atoms per bin row in orthorhombic cells and open systems, where
    /// the search cuts its stencil to the bins the cutoff sphere reaches:
    /// same pairs as the exhaustive reference, with and without geometry.
    #[test]
    fn trimmed_stencil_finds_every_pair(
        lengths in proptest::array::uniform3(6.0..22.0f64),
        pbc in proptest::array::uniform3(any::<bool>()),
        with_cell in any::<bool>(),
        unit in proptest::collection::vec(proptest::array::uniform3(-0.2..1.2f64), 150..400),
        cutoff in 1.0..6.0f64,
    ) {
        let pbc = if with_cell { pbc } else { [false; 3] };
        let matrix = [[lengths[0], 0.0, 0.0], [0.0, lengths[1], 0.0], [0.0, 0.0, lengths[2]]];
        let cell = Cell::new(matrix);
        let positions: Vec<[f64; 3]> = unit.iter().map(|&f| cell.to_cartesian(f)).collect();
        let cell = with_cell.then_some(&cell);
        let opts = full(cutoff);
        let fast = neighbor_list(&positions, cell, pbc, &opts).unwrap();
        let reference = brute_force_neighbor_list(&positions, cell, pbc, &opts).unwrap();
        assert_same(&fast, &reference, 1e-12);
        let lean = pair_list_for_centers(&positions, cell, pbc, &opts, positions.len()).unwrap();
        let periodic = pbc.iter().any(|&p| p);
        let mut found: Vec<(u32, u32, [i32; 3])> = (0..lean.len())
            .map(|k| (lean.centers[k], lean.neighbors[k], if periodic { lean.shifts[k] } else { [0; 3] }))
            .collect();
        found.sort_unstable();
        prop_assert_eq!(found, triples(&reference));
    }

    /// Open systems without a cell, far from the origin, with clusters.
    #[test]
    fn open_system_without_cell(
        offset in proptest::array::uniform3(-1e6..1e6f64),
        spread in 0.5..30.0f64,
        unit in proptest::collection::vec(proptest::array::uniform3(-1.0..1.0f64), 0..40),
        cutoff in 0.5..6.0f64,
    ) {
        let positions: Vec<[f64; 3]> = unit
            .iter()
            .map(|u| [offset[0] + spread * u[0], offset[1] + spread * u[1], offset[2] + spread * u[2]])
            .collect();
        for opts in [full(cutoff), half(cutoff)] {
            let fast = neighbor_list(&positions, None, [false; 3], &opts).unwrap();
            let reference = brute_force_neighbor_list(&positions, None, [false; 3], &opts).unwrap();
            assert_same(&fast, &reference, 1e-9);
        }
    }
}

/// Simple cubic, one atom, a = 1: shells of 6 (d = 1), 12 (√2), 8 (√3), 6 (2).
#[test]
fn reference_counts_images_of_a_single_atom() {
    let cell = Cell::orthorhombic(1.0, 1.0, 1.0);
    let r = [[0.3, 0.2, 0.9]];
    for (cutoff, expected) in [(1.2, 6), (1.5, 18), (1.8, 26), (2.1, 32)] {
        let reference =
            brute_force_neighbor_list(&r, Some(&cell), [true; 3], &full(cutoff)).unwrap();
        assert_eq!(reference.len(), expected, "cutoff {cutoff}");
        let fast = neighbor_list(&r, Some(&cell), [true; 3], &full(cutoff)).unwrap();
        assert_same(&fast, &reference, 0.0);
        let half_list = neighbor_list(&r, Some(&cell), [true; 3], &half(cutoff)).unwrap();
        assert_eq!(half_list.len(), expected / 2);
    }
    // Slab (T T F): only the in-plane shells: 4 at 1, 4 at √2, 4 at 2.
    let slab = neighbor_list(&r, Some(&cell), [true, true, false], &full(2.1)).unwrap();
    assert_eq!(slab.len(), 12);
}

/// FCC coordination shells (12, 6, 24, 12 at a/√2, a, a√1.5, a√2) are textbook numbers.
#[test]
fn fcc_coordination_shells() {
    let a = 3.615;
    let (positions, matrix) = fcc(a, 3);
    let cell = Cell::new(matrix);
    for (cutoff, per_atom) in [(3.0, 12), (4.0, 18), (4.8, 42), (5.3, 54)] {
        let list = neighbor_list(&positions, Some(&cell), [true; 3], &full(cutoff)).unwrap();
        assert!(
            list.counts_per_center(positions.len())
                .iter()
                .all(|&c| c == per_atom),
            "cutoff {cutoff}"
        );
        let reference =
            brute_force_neighbor_list(&positions, Some(&cell), [true; 3], &full(cutoff)).unwrap();
        assert_same(&list, &reference, 0.0);
    }
}

/// Shifts refer to the positions as given: moving an atom by a lattice
/// vector changes its shifts by that vector and leaves the vectors unchanged.
#[test]
fn shifts_follow_unwrapped_positions() {
    let cell = Cell::new([[4.0, 0.0, 0.0], [1.5, 3.8, 0.0], [-0.7, 0.9, 4.2]]);
    let mut positions = vec![
        [0.5, 0.4, 0.3],
        [2.0, 2.1, 1.7],
        [3.1, 0.2, 3.9],
        [1.0, 3.0, 2.0],
    ];
    let before = neighbor_list(&positions, Some(&cell), [true; 3], &full(4.5)).unwrap();
    let moved = [2, -3, 1];
    let d = cell.shift_vector(moved);
    positions[1] = [
        positions[1][0] + d[0],
        positions[1][1] + d[1],
        positions[1][2] + d[2],
    ];
    let after = neighbor_list(&positions, Some(&cell), [true; 3], &full(4.5)).unwrap();
    let mut expected: Vec<_> = triples(&before)
        .into_iter()
        .zip(&before.vectors)
        .map(|((i, j, s), v)| {
            let mut s = s;
            for k in 0..3 {
                if j == 1 {
                    s[k] -= moved[k];
                }
                if i == 1 {
                    s[k] += moved[k];
                }
            }
            ((i, j, s), *v)
        })
        .collect();
    expected.sort_by_key(|e| e.0);
    let got: Vec<_> = triples(&after)
        .into_iter()
        .zip(after.vectors.iter().copied())
        .collect();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g.0, e.0);
        for k in 0..3 {
            assert!((g.1[k] - e.1[k]).abs() < 1e-12);
        }
    }
}
