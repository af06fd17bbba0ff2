//! Geometry far outside the physical range, and cells whose neighbourhoods
//! hold many images: typed errors or correct lists, within bounded time and
//! memory, never a panic, an abort or a hang.
//!
//! Memory is measured by a counting global allocator; tests that read it
//! hold a lock so that tests running in parallel threads do not mix.

mod common;

use ddmlip_atoms::{Cell, MAX_ABS_LENGTH};
use ddmlip_neighbors::{
    brute_force_neighbor_list, neighbor_list, pair_list_for_centers, NeighborError, NeighborOptions,
};
use ddmlip_testkit::peak_memory::{peak_of, CountingAllocator};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn full(cutoff: f64) -> NeighborOptions {
    NeighborOptions {
        cutoff,
        half: false,
    }
}

const MIB: usize = 1 << 20;

/// The slab of the issue: `pbc="T T F"`, one atom in the cell and one at an
/// absurd height. Before: an index out of bounds (1e308) or a search that ran
/// for minutes (9.2e18); the rounding margin grew with the coordinate.
#[test]
fn absurd_coordinates_are_typed_errors_naming_the_value() {
    let cell = Cell::new([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 10.0]]);
    for far in [1e308, i64::MAX as f64, -1e11, 2.0 * MAX_ABS_LENGTH] {
        let r = [[0.0, 0.0, 5.0], [1.0, 1.0, far]];
        let started = Instant::now();
        let result = neighbor_list(&r, Some(&cell), [true, true, false], &full(5.0));
        assert!(started.elapsed() < Duration::from_secs(2));
        match result {
            Err(NeighborError::PositionOutOfRange {
                atom: 1,
                axis: 2,
                value,
                ..
            }) => {
                assert_eq!(value, far);
                let text = result.unwrap_err().to_string();
                assert!(text.contains(&format!("{far:e}")), "{text}");
            }
            other => panic!("z = {far}: {other:?}"),
        }
    }
    // Within range, far along the open axis: the right pairs, quickly.
    let r = [[0.0, 0.0, 5.0], [1.0, 1.0, 1e9], [1.0, 1.0, 1e9 + 1.0]];
    let started = Instant::now();
    let fast = neighbor_list(&r, Some(&cell), [true, true, false], &full(3.0)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    let reference =
        brute_force_neighbor_list(&r, Some(&cell), [true, true, false], &full(3.0)).unwrap();
    common::assert_same(&fast, &reference, 1e-9);
}

/// A periodic lattice entry of 1e30 Å made the stencil tables overflow
/// ("capacity overflow"); now it is a typed error naming the entry.
#[test]
fn absurd_periodic_lattice_entries_are_typed_errors() {
    let r = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]];
    let cell = Cell::new([[1e30, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]]);
    match neighbor_list(&r, Some(&cell), [true; 3], &full(5.0)) {
        Err(NeighborError::CellOutOfRange {
            row: 0,
            col: 0,
            value,
            ..
        }) => assert_eq!(value, 1e30),
        other => panic!("{other:?}"),
    }
    // The same entry on an open axis is never used for images: fine.
    let open = neighbor_list(&r, Some(&cell), [false, true, true], &full(5.0)).unwrap();
    let reference =
        brute_force_neighbor_list(&r, Some(&cell), [false, true, true], &full(5.0)).unwrap();
    common::assert_same(&open, &reference, 1e-9);
}

/// Number of lattice points `n·a` of a simple cubic lattice with `0 < |n·a| < rc`.
fn cubic_lattice_points(a: f64, rc: f64) -> usize {
    let m = (rc / a).ceil() as i64 + 1;
    let mut count = 0;
    for x in -m..=m {
        for y in -m..=m {
            for z in -m..=m {
                let d2 = ((x * x + y * y + z * z) as f64) * a * a;
                if d2 > 0.0 && d2 < rc * rc {
                    count += 1;
                }
            }
        }
    }
    count
}

/// One Si atom in a 0.5 Å cubic cell, 5 Å neighbourhood: ~4,000 images,
/// megabytes (before: an estimate of 12.7 GB and an abort).
#[test]
fn a_tiny_cell_with_many_images_takes_megabytes() {
    let cell = Cell::orthorhombic(0.5, 0.5, 0.5);
    let r = [[0.1, 0.2, 0.3]];
    // 5.01 Å: no lattice point lies within rounding of the cutoff
    // (|n|² = 100 is at 5 Å, the next shell at 5.025 Å).
    let (list, peak) = peak_of(|| neighbor_list(&r, Some(&cell), [true; 3], &full(5.01)));
    let list = list.unwrap();
    assert_eq!(list.len(), cubic_lattice_points(0.5, 5.01));
    assert!(peak < 16 * MIB, "peak {peak} bytes");
    let (pairs, peak) =
        peak_of(|| pair_list_for_centers(&r, Some(&cell), [true; 3], &full(5.01), 1));
    assert_eq!(pairs.unwrap().len(), list.len());
    assert!(peak < 16 * MIB, "peak {peak} bytes");
}

/// `Lattice="5 0 0 4.999 0.001 0 0 0 5"`: the heights are 1e-3 Å, but the
/// volume is 0.025 Å³, so the pairs are ~21,000 per atom (before: 19 GB
/// reserved from the box of the heights). The list equals brute force.
#[test]
fn a_nearly_flat_cell_is_sized_by_its_volume() {
    let cell = Cell::new([[5.0, 0.0, 0.0], [4.999, 0.001, 0.0], [0.0, 0.0, 5.0]]);
    let r = [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]];
    let started = Instant::now();
    let (list, peak) = peak_of(|| neighbor_list(&r, Some(&cell), [true; 3], &full(5.0)));
    assert!(started.elapsed() < Duration::from_secs(20));
    match list {
        Ok(list) => {
            assert!(peak < 256 * MIB, "peak {peak} bytes");
            let reference =
                brute_force_neighbor_list(&r, Some(&cell), [true; 3], &full(5.0)).unwrap();
            common::assert_same(&list, &reference, 1e-9);
        }
        Err(e) => {
            assert!(matches!(e, NeighborError::SearchTooCostly { .. }), "{e}");
            assert!(peak < 16 * MIB, "peak {peak} bytes");
        }
    }
}

/// Requests that cannot fit are refused up front with the estimate in
/// bytes, allocating next to nothing.
#[test]
fn requests_that_cannot_fit_are_refused_with_their_size() {
    let r = [[0.0, 0.0, 0.0], [0.3, 0.3, 0.3]];
    let cases = [
        // A lattice entry of 1e-5 Å with a 1000 Å cutoff.
        (
            Cell::new([[1e-5, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]]),
            1000.0,
        ),
        // A 5.43 Å cell with a 5000 Å cutoff (a TOML model's typo): more
        // pairs than any memory holds.
        (Cell::orthorhombic(5.43, 5.43, 5.43), 5000.0),
        // One part in 1e300 of a cell.
        (
            Cell::new([[1e-300, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]]),
            5.0,
        ),
    ];
    for (cell, cutoff) in cases {
        let (result, peak) = peak_of(|| neighbor_list(&r, Some(&cell), [true; 3], &full(cutoff)));
        match result {
            Err(
                e @ NeighborError::TooManyPairs {
                    estimated_bytes, ..
                },
            ) => {
                assert!(estimated_bytes > 1e9, "{e}");
                assert!(e.to_string().contains("iB"), "{e}");
            }
            // 1e-300 squared underflows: the vector's length is zero.
            Err(
                e
                @ (NeighborError::DegenerateCell { .. } | NeighborError::ZeroLatticeVector { .. }),
            ) => {
                assert!(cell.matrix[0][0] < 1e-100, "{e}")
            }
            other => panic!("{:?}: {other:?}", cell.matrix),
        }
        assert!(peak < MIB, "peak {peak} bytes");
    }
}

/// A lattice entry of 1e-5 Å with a 5 Å cutoff is a legal, dense lattice:
/// about 2·10⁶ images per atom, which fit.
#[test]
fn a_very_thin_cell_gives_every_image() {
    let cell = Cell::new([[1e-5, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]]);
    let r = [[0.0, 1.0, 1.0]];
    let (pairs, peak) =
        peak_of(|| pair_list_for_centers(&r, Some(&cell), [true; 3], &full(5.0), 1));
    let pairs = pairs.unwrap();
    // Images n·1e-5 with 0 < |n|·1e-5 < 5 on the a axis, and (0, ±5) … are
    // at exactly 5 Å (excluded): 2·(5e5 − 1) when 5/1e-5 rounds to 5e5.
    let along_a = (1..).take_while(|&n| (n as f64 * 1e-5) < 5.0).count();
    assert_eq!(pairs.len(), 2 * along_a);
    assert!(peak < 64 * MIB, "peak {peak} bytes");
}
