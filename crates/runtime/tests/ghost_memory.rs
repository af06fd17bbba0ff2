//! Ghost sets grow with the volume they cover: a one-atom cell with a halo
//! many cells wide is split with megabytes and gives the single-process
//! answer; a halo that cannot fit is refused before anything is allocated,
//! with the estimate in bytes.
//!
//! Memory is measured by a counting global allocator; tests that read it
//! hold a lock so that tests running in parallel threads do not mix.

use ddmlip_atoms::{Cell, System};
use ddmlip_domain::{partition_system, PartitionError};
use ddmlip_models::LennardJones;
use ddmlip_runtime::{evaluate, EvalOptions};
use ddmlip_testkit::peak_memory::{peak_of, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MIB: usize = 1 << 20;

/// ASE's `bulk("Ar", "fcc", a=5.26)`: one atom in the primitive cell.
fn argon_primitive() -> System {
    let h = 5.26 / 2.0;
    System::new(
        vec![[0.0, 0.0, 0.0]],
        vec![18],
        Some(Cell::new([[0.0, h, h], [h, 0.0, h], [h, h, 0.0]])),
        [true; 3],
    )
}

/// Images `S` of the one atom with `S·cell` inside the periodic cell
/// expanded by `width` along each face normal, counted by brute force: an
/// upper bound on the ghosts of all ranks together is this count times the
/// ranks (each rank's expanded domain lies inside the expanded cell).
fn images_in_expanded_cell(cell: &Cell, width: f64) -> usize {
    let inverse = cell.inverse().unwrap();
    let margin: Vec<f64> = (0..3).map(|k| width / cell.height(k)).collect();
    let m = margin.iter().fold(0.0_f64, |a, &b| a.max(b)).ceil() as i32 + 2;
    let mut count = 0;
    for a in -m..=m {
        for b in -m..=m {
            for c in -m..=m {
                let r = cell.shift_vector([a, b, c]);
                let f = ddmlip_atoms::to_fractional(&inverse, r);
                if (0..3).all(|k| f[k] >= -margin[k] && f[k] <= 1.0 + margin[k]) {
                    count += 1;
                }
            }
        }
    }
    count
}

/// Before: `partition --ranks 2 --cutoff 21` on this cell asked for 4.3 GiB
/// (each chunk of the ghost search reserved a full chunk of 4096 atoms'
/// worth of images for the one atom) and aborted.
#[test]
fn a_one_atom_cell_with_a_wide_halo_is_split_in_megabytes() {
    let system = argon_primitive();
    let cell = system.cell.unwrap();
    for (ranks, width) in [(2, 21.0), (4, 40.0)] {
        let (partition, peak) = peak_of(|| partition_system(&system, ranks, width));
        let partition = partition.unwrap();
        let ghosts: usize = partition.ranks.iter().map(|r| r.ghosts.len()).sum();
        let bound = ranks * images_in_expanded_cell(&cell, width);
        assert!(
            ghosts > 0 && ghosts <= bound,
            "{ghosts} ghosts, bound {bound}"
        );
        // Megabytes: the old code reserved 32 bytes × 4096 × the images
        // per atom (4.3 GiB at 21 Å).
        assert!(peak < 32 * MIB, "peak {peak} bytes for {ghosts} ghosts");
    }
}

/// The split run of the same cell equals the single-process run, with a
/// Lennard-Jones cutoff of 21 Å (1054 neighbours of the one atom).
#[test]
fn a_one_atom_cell_with_a_wide_halo_gives_the_single_process_answer() {
    let system = argon_primitive();
    let model = LennardJones {
        epsilon: 0.0104,
        sigma: 3.4,
        cutoff: 21.0,
        shift: true,
    };
    let frames = vec![system];
    let single = evaluate(&model, &frames, &EvalOptions::default()).unwrap();
    for ranks in [2, 4] {
        let opts = EvalOptions {
            ranks,
            ..Default::default()
        };
        let split = evaluate(&model, &frames, &opts).unwrap();
        let (e1, e2) = (
            single.energy().expect("energy")[0],
            split.energy().expect("energy")[0],
        );
        assert!((e1 - e2).abs() <= 1e-10 * e1.abs(), "{e1} vs {e2}");
        let (s1, s2) = (
            single.stress().expect("stress")[0].unwrap(),
            split.stress().expect("stress")[0].unwrap(),
        );
        for k in 0..3 {
            assert!(
                (s1[k] - s2[k]).abs() <= 1e-10 * s1[k].abs(),
                "{s1:?} vs {s2:?}"
            );
        }
    }
}

/// A halo no memory can hold is refused up front, saying how much it would
/// take, and allocating next to nothing.
#[test]
fn a_halo_that_cannot_fit_is_refused_with_its_size() {
    let system = argon_primitive();
    let (result, peak) = peak_of(|| partition_system(&system, 2, 5000.0));
    match result {
        Err(
            e @ PartitionError::TooManyGhosts {
                estimated_bytes, ..
            },
        ) => {
            assert!(estimated_bytes > 1e12, "{e}");
            assert!(e.to_string().contains("TiB"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(peak < MIB, "peak {peak} bytes");
}
