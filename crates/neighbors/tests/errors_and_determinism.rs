//! Input errors, and identical output for 1 and 2 threads.

mod common;

use common::{fcc, Rng};
use ddmlip_atoms::Cell;
use ddmlip_neighbors::{neighbor_list, NeighborError, NeighborOptions};

fn full(cutoff: f64) -> NeighborOptions {
    NeighborOptions {
        cutoff,
        half: false,
    }
}

#[test]
fn invalid_inputs_are_typed_errors() {
    let cell = Cell::orthorhombic(5.0, 5.0, 5.0);
    let r = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]];
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            neighbor_list(&r, Some(&cell), [true; 3], &full(bad)),
            Err(NeighborError::InvalidCutoff(_))
        ));
    }
    let nan = [[0.0, 0.0, 0.0], [1.0, f64::NAN, 1.0]];
    assert!(matches!(
        neighbor_list(&nan, Some(&cell), [true; 3], &full(2.0)),
        Err(NeighborError::NonFinitePosition { atom: 1, .. })
    ));
    assert_eq!(
        neighbor_list(&r, None, [false, false, true], &full(2.0)),
        Err(NeighborError::MissingCell { axis: 2 })
    );
    let singular = Cell::new([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]);
    assert!(matches!(
        neighbor_list(&r, Some(&singular), [true; 3], &full(2.0)),
        Err(NeighborError::DegenerateCell { .. })
    ));
    // A singular cell is fine when the dependent vector is on an open axis.
    assert!(neighbor_list(&r, Some(&singular), [true, true, false], &full(2.0)).is_ok());
    let far = [[0.0, 0.0, 0.0], [5e9, 0.0, 0.0]];
    assert!(matches!(
        neighbor_list(&far, Some(&cell), [true; 3], &full(2.0)),
        Err(NeighborError::PositionTooFar {
            atom: 1,
            axis: 0,
            ..
        })
    ));
    // The same far atom is fine without periodicity.
    assert_eq!(
        neighbor_list(&far, None, [false; 3], &full(2.0))
            .unwrap()
            .len(),
        0
    );
    // Far apart along all three open axes: the bin count must not overflow.
    let spread = [[0.0, 0.0, 0.0], [1e9, -1e9, 1e9], [1e9 + 1.0, -1e9, 1e9]];
    assert_eq!(
        neighbor_list(&spread, None, [false; 3], &full(2.0))
            .unwrap()
            .len(),
        2
    );
    // A 1 Å cell with a 1000 Å cutoff would need ~4e9 images per atom.
    let tiny = Cell::orthorhombic(1.0, 1.0, 1.0);
    assert!(matches!(
        neighbor_list(&r, Some(&tiny), [true; 3], &full(1000.0)),
        Err(NeighborError::TooManyPairs { .. })
    ));
    // No atoms: an empty list, not an error.
    assert!(neighbor_list(&[], Some(&cell), [true; 3], &full(2.0))
        .unwrap()
        .is_empty());
}

#[test]
fn one_and_two_threads_give_identical_lists() {
    let mut rng = Rng::new(7);
    let (mut positions, matrix) = fcc(3.615, 6);
    for p in &mut positions {
        for x in p.iter_mut() {
            *x += rng.uniform(-0.3, 0.3);
        }
    }
    // Shear the box so the cell is triclinic; leave some atoms outside.
    let mut m = matrix;
    m[1][0] = 0.4 * m[0][0];
    m[2][1] = -0.3 * m[1][1];
    let cell = Cell::new(m);
    let run = |threads: usize, half: bool, pbc: [bool; 3]| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            neighbor_list(
                &positions,
                Some(&cell),
                pbc,
                &NeighborOptions { cutoff: 5.0, half },
            )
        })
        .unwrap()
    };
    for half in [false, true] {
        for pbc in [[true; 3], [true, true, false]] {
            let one = run(1, half, pbc);
            let two = run(2, half, pbc);
            assert!(one.len() > 10 * positions.len());
            assert_eq!(one, two);
        }
    }
}

#[test]
fn reused_list_equals_fresh_list() {
    let (positions, matrix) = fcc(3.615, 4);
    let cell = Cell::new(matrix);
    let mut kept = ddmlip_neighbors::NeighborList::default();
    // Fill with a bigger list first, then a smaller one: stale pairs must not survive.
    for cutoff in [6.0, 3.0, 4.5] {
        ddmlip_neighbors::neighbor_list_into(
            &positions,
            Some(&cell),
            [true; 3],
            &full(cutoff),
            &mut kept,
        )
        .unwrap();
        let fresh = ddmlip_neighbors::brute_force_neighbor_list(
            &positions,
            Some(&cell),
            [true; 3],
            &full(cutoff),
        )
        .unwrap();
        assert_eq!(kept, fresh);
    }
    // On error the kept list is emptied rather than left stale.
    assert!(ddmlip_neighbors::neighbor_list_into(
        &positions,
        Some(&cell),
        [true; 3],
        &full(-1.0),
        &mut kept
    )
    .is_err());
    assert!(kept.is_empty());
}

/// Restricting centres to the first atoms gives exactly the full list's pairs
/// with those centres (brute force as the reference).
#[test]
fn centre_subset_equals_filtered_brute_force() {
    use ddmlip_neighbors::{brute_force_neighbor_list, neighbor_list_for_centers, NeighborOptions};
    let mut s = 12345u64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let positions: Vec<[f64; 3]> = (0..150)
        .map(|_| [next() * 14.0, next() * 14.0, next() * 14.0])
        .collect();
    let opts = NeighborOptions {
        cutoff: 3.7,
        half: false,
    };
    for n_centers in [0, 1, 40, 149, 150, 400] {
        let sub =
            neighbor_list_for_centers(&positions, None, [false; 3], &opts, n_centers).unwrap();
        let full = brute_force_neighbor_list(&positions, None, [false; 3], &opts).unwrap();
        let keep: Vec<usize> = (0..full.len())
            .filter(|&e| (full.centers[e] as usize) < n_centers)
            .collect();
        assert_eq!(sub.len(), keep.len(), "n_centers {n_centers}");
        for (k, &e) in keep.iter().enumerate() {
            assert_eq!(
                (sub.centers[k], sub.neighbors[k], sub.shifts[k]),
                (full.centers[e], full.neighbors[e], full.shifts[e])
            );
            assert!((sub.distances[k] - full.distances[e]).abs() < 1e-12);
        }
    }
}

/// A search whose chunks a runner hands to other threads, in reverse
/// order, gives the list of a plain one-thread search; the runner is used
/// and gets several chunks.
#[test]
fn chunks_run_elsewhere_give_the_same_pairs() {
    use ddmlip_neighbors::{pair_list_for_centers_into, ChunkRunner, PairList, PairScratch};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut rng = Rng::new(11);
    let (mut positions, matrix) = fcc(3.615, 7);
    for p in &mut positions {
        for x in p.iter_mut() {
            *x += rng.uniform(-0.2, 0.2);
        }
    }
    let cell = Cell::new(matrix);
    let n_centers = positions.len() * 2 / 3;
    let most_chunks = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&most_chunks);
    let runner: ChunkRunner = Arc::new(move |n, f| {
        seen.fetch_max(n, Ordering::Relaxed);
        // Three threads take the chunks from the last one down.
        let next = AtomicUsize::new(n);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    while let Ok(c) =
                        next.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
                    {
                        f(c - 1);
                    }
                });
            }
        });
    });
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (periodic, half) in [(false, false), (true, false), (true, true)] {
        let (cell, pbc) = if periodic {
            (Some(&cell), [true; 3])
        } else {
            (None, [false; 3])
        };
        let opts = NeighborOptions { cutoff: 5.0, half };
        let search = |runner: Option<ChunkRunner>| {
            let mut scratch = PairScratch::default();
            scratch.set_chunk_runner(runner);
            let mut out = PairList::default();
            one_thread
                .install(|| {
                    pair_list_for_centers_into(
                        &positions,
                        cell,
                        pbc,
                        &opts,
                        n_centers,
                        &mut scratch,
                        &mut out,
                    )
                })
                .unwrap();
            out
        };
        let plain = search(None);
        let shared = search(Some(Arc::clone(&runner)));
        assert!(plain.len() > 10 * n_centers, "{} pairs", plain.len());
        assert_eq!(plain, shared, "periodic {periodic}, half {half}");
    }
    assert!(
        most_chunks.load(Ordering::Relaxed) > 4,
        "the runner got too few chunks"
    );
}
