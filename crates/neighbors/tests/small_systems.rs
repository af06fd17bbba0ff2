//! Systems of a few thousand atoms are split into one range of centres per
//! thread (at least 1,024 centres a range): on 2 and 4 threads the list of
//! a rattled 2,048-atom FCC crystal is the one-thread list (the half one
//! checked against brute force here), pair for pair and in order, full and
//! half, fresh and reusing a kept list.

mod common;

use common::{assert_same, fcc, Rng};
use ddmlip_atoms::Cell;
use ddmlip_neighbors::{brute_force_neighbor_list, neighbor_list, neighbor_list_into};
use ddmlip_neighbors::{NeighborList, NeighborOptions};

fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn a_two_thousand_atom_crystal_split_over_threads_is_the_one_thread_list() {
    // Cu, 8³ cubic cells: 2,048 atoms, about 42 neighbours each at 5 Å.
    let (mut positions, matrix) = fcc(3.615, 8);
    let mut rng = Rng::new(7);
    for p in &mut positions {
        for x in p.iter_mut() {
            *x += rng.uniform(-0.05, 0.05);
        }
    }
    let cell = Cell::new(matrix);
    for half in [false, true] {
        let opts = NeighborOptions { cutoff: 5.0, half };
        let reference = on_threads(1, || {
            neighbor_list(&positions, Some(&cell), [true; 3], &opts).expect("search")
        });
        if half {
            // One brute-force check keeps the test fast; the one-thread
            // search is checked against brute force in
            // `brute_force_agreement` for both kinds.
            let brute = brute_force_neighbor_list(&positions, Some(&cell), [true; 3], &opts)
                .expect("brute force");
            assert_same(&reference, &brute, 1e-12);
        }
        assert!(
            reference.len() > if half { 20 } else { 40 } * positions.len(),
            "{} pairs",
            reference.len()
        );
        let mut kept = NeighborList::default();
        for threads in [2, 4] {
            let fresh = on_threads(threads, || {
                neighbor_list(&positions, Some(&cell), [true; 3], &opts).expect("search")
            });
            assert_same(&fresh, &reference, 1e-12);
            // Twice into the same list: the second call overwrites a list
            // that already holds every pair.
            for _ in 0..2 {
                on_threads(threads, || {
                    neighbor_list_into(&positions, Some(&cell), [true; 3], &opts, &mut kept)
                })
                .expect("search into a kept list");
                assert_same(&kept, &reference, 1e-12);
            }
        }
    }
}
