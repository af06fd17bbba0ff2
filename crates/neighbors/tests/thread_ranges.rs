//! Searches large enough to be split into one range of centres per thread
//! give the list of the one-thread search (itself checked against brute
//! force in `brute_force_agreement`), including when ranges find far more
//! pairs than their sampled estimate reserved.

mod common;

use common::{triples, Rng};
use ddmlip_atoms::Cell;
use ddmlip_neighbors::{neighbor_list, neighbor_list_for_centers, neighbor_list_into};
use ddmlip_neighbors::{NeighborList, NeighborOptions};

fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// `n` atoms uniform in a periodic cube of side `side` Å, some of them
/// slightly outside it (wrapped by the search).
fn uniform(n: usize, side: f64, seed: u64) -> Vec<[f64; 3]> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            [
                rng.uniform(-0.5, side + 0.5),
                rng.uniform(0.0, side),
                rng.uniform(0.0, side),
            ]
        })
        .collect()
}

/// Pairs strictly increasing in (i, j, S): sorted, no duplicates.
fn assert_strictly_sorted(list: &NeighborList) {
    let t = triples(list);
    assert!(t.windows(2).all(|w| w[0] < w[1]), "not strictly sorted");
}

#[test]
fn several_ranges_equal_one_range() {
    // 6000 atoms at liquid-metal density: two or three ranges of centres.
    let side = 43.0;
    let positions = uniform(6000, side, 11);
    let cell = Cell::new([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]);
    for half in [false, true] {
        let opts = NeighborOptions { cutoff: 5.0, half };
        let search = || neighbor_list(&positions, Some(&cell), [true; 3], &opts).unwrap();
        let one = on_threads(1, search);
        assert!(one.len() > 15 * positions.len(), "{} pairs", one.len());
        assert_strictly_sorted(&one);
        for threads in [2, 3] {
            assert_eq!(
                on_threads(threads, search),
                one,
                "{threads} threads, half {half}"
            );
        }
        // A kept list, first filled with another system's pairs, is
        // overwritten region by region.
        let mut kept = on_threads(2, || {
            neighbor_list(&positions[..4500], Some(&cell), [true; 3], &opts).unwrap()
        });
        on_threads(2, || {
            neighbor_list_into(&positions, Some(&cell), [true; 3], &opts, &mut kept).unwrap()
        });
        assert_eq!(kept, one);
    }
}

#[test]
fn ranges_denser_than_sampled_continue_past_their_regions() {
    // Centres 0..5000 spread over the box; 20000 more atoms (neighbours
    // only) crowd into 1 Å³ next to centre 4321, so the few centres around
    // it have thousands of pairs each. The search sizes each range's region
    // from one centre per block of 64, which here misses them: their range
    // finds far more pairs than were reserved for it.
    let side = 43.0;
    let n_centers = 5000;
    let mut positions = uniform(n_centers, side, 5);
    let hub = positions[4321];
    let mut rng = Rng::new(9);
    positions.extend((0..20_000).map(|_| {
        [
            hub[0] + rng.uniform(0.5, 1.5),
            hub[1] + rng.uniform(0.5, 1.5),
            hub[2] + rng.uniform(0.5, 1.5),
        ]
    }));
    let cell = Cell::new([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]);
    for half in [false, true] {
        let opts = NeighborOptions { cutoff: 3.0, half };
        let search = || {
            neighbor_list_for_centers(&positions, Some(&cell), [true; 3], &opts, n_centers).unwrap()
        };
        let one = on_threads(1, search);
        let hub_pairs = one.centers.iter().filter(|&&i| i == 4321).count();
        assert!(hub_pairs >= 20_000, "{hub_pairs} pairs of the hub");
        assert_strictly_sorted(&one);
        for threads in [2, 3] {
            assert_eq!(on_threads(threads, search), one, "half {half}");
        }
    }
}

#[test]
fn a_subset_of_centres_over_several_ranges() {
    let side = 43.0;
    let positions = uniform(6000, side, 3);
    let cell = Cell::new([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]);
    let opts = NeighborOptions {
        cutoff: 5.0,
        half: false,
    };
    let all = on_threads(1, || {
        neighbor_list(&positions, Some(&cell), [true; 3], &opts).unwrap()
    });
    let owned = 5000;
    let subset = on_threads(2, || {
        neighbor_list_for_centers(&positions, Some(&cell), [true; 3], &opts, owned).unwrap()
    });
    let keep = all
        .centers
        .iter()
        .take_while(|&&i| (i as usize) < owned)
        .count();
    assert!(keep < all.len());
    assert_eq!(triples(&subset), triples(&all)[..keep].to_vec());
    assert_eq!(subset.vectors, all.vectors[..keep].to_vec());
    assert_eq!(subset.distances, all.distances[..keep].to_vec());
}
