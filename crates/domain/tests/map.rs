//! The domain map's local rules against the partition: the owner and the
//! ghost images a rank computes for its own atoms are exactly the
//! partition's owners and ghosts (same order) with the same domains, after
//! the atoms moved; ghost owners and migration targets are neighbours; the
//! map survives JSON bit for bit and refuses requests it was not made for.

use ddmlip_atoms::build::SplitMix64;
use ddmlip_atoms::{Cell, System};
use ddmlip_domain::{
    partition_system_balanced, partition_system_mapped, Balance, Ghost, ImageScratch,
    PartitionError,
};

fn cases() -> Vec<(&'static str, System)> {
    let mut rng = SplitMix64::new(7);
    let mut cloud = |n: usize, lo: [f64; 3], hi: [f64; 3]| -> Vec<[f64; 3]> {
        (0..n)
            .map(|_| std::array::from_fn(|k| lo[k] + (hi[k] - lo[k]) * 0.5 * (rng.uniform() + 1.0)))
            .collect()
    };
    let tri = Cell::new([[14.0, 0.0, 0.0], [3.0, 13.0, 0.0], [-2.0, 1.5, 12.0]]);
    let bulk = cloud(400, [0.0; 3], [14.0, 13.0, 12.0]);
    let slab = cloud(300, [0.0, 0.0, 5.0], [12.0, 12.0, 11.0]);
    let drop = cloud(250, [-6.0; 3], [6.0; 3]);
    vec![
        (
            "triclinic bulk",
            System::new(bulk.clone(), vec![18; bulk.len()], Some(tri), [true; 3]),
        ),
        (
            "slab",
            System::new(
                slab.clone(),
                vec![18; slab.len()],
                Some(Cell::orthorhombic(12.0, 12.0, 30.0)),
                [true, true, false],
            ),
        ),
        (
            "cluster without cell",
            System::new(drop.clone(), vec![18; drop.len()], None, [false; 3]),
        ),
    ]
}

#[test]
fn local_rules_reproduce_the_partition_after_atoms_moved() {
    let width = 3.0;
    let mut rng = SplitMix64::new(99);
    for (name, sys) in cases() {
        for even in [false, true] {
            let balance = if even {
                Balance::EvenCounts
            } else {
                Balance::Geometric
            };
            for n_ranks in [1, 2, 3, 4, 6, 8] {
                let what = format!("{name}, {n_ranks} ranks, even counts {even}");
                let (first, map) =
                    partition_system_mapped(&sys, n_ranks, width, balance, None).unwrap();
                if sys.pbc == [true; 3] {
                    let plain = partition_system_balanced(&sys, n_ranks, width, balance).unwrap();
                    assert_eq!(
                        plain, first,
                        "{what}: open ends changed a periodic partition"
                    );
                }
                let old_owner: Vec<usize> = {
                    let mut o = vec![usize::MAX; sys.len()];
                    for d in &first.ranks {
                        for &j in &d.owned {
                            o[j] = d.rank;
                        }
                    }
                    o
                };
                // Every atom moves by up to 1.5 Å (less than the width), some
                // out of the first bounding box.
                let mut moved = sys.clone();
                for r in moved.positions.iter_mut() {
                    for x in r.iter_mut() {
                        *x += 0.85 * rng.uniform();
                    }
                }
                let (part, same) =
                    partition_system_mapped(&moved, n_ranks, width, balance, Some(&map)).unwrap();
                assert_eq!(same, map, "{what}");
                let mut owner = vec![usize::MAX; sys.len()];
                let mut row = vec![usize::MAX; sys.len()];
                for d in &part.ranks {
                    for (k, &j) in d.owned.iter().enumerate() {
                        assert_eq!(owner[j], usize::MAX, "{what}: atom {j} owned twice");
                        owner[j] = d.rank;
                        row[j] = k;
                    }
                }
                let mut expected: Vec<Vec<Ghost>> = vec![Vec::new(); n_ranks];
                let mut scratch = ImageScratch::default();
                let wrapped: Vec<_> = moved.positions.iter().map(|&r| map.wrap(r)).collect();
                for q in 0..n_ranks {
                    for &j in &part.ranks[q].owned {
                        let (f, w) = wrapped[j];
                        assert_eq!(map.owner(f), q, "{what}: owner of atom {j}");
                        map.for_each_image(f, q, &mut scratch, |to, m| {
                            expected[to].push(Ghost {
                                global: j,
                                shift: [w[0] + m[0], w[1] + m[1], w[2] + m[2]],
                                owner_rank: q,
                                owner_row: row[j],
                            });
                        });
                    }
                }
                for (j, &(f, w)) in wrapped.iter().enumerate() {
                    assert_eq!(map.owner(f), owner[j], "{what}: atom {j}");
                    let d = &part.ranks[owner[j]];
                    assert_eq!(d.owned_shifts[row[j]], w, "{what}: wrap of atom {j}");
                    // A short move lands in a neighbouring domain.
                    let o = old_owner[j];
                    assert!(
                        owner[j] == o || map.neighbours(o).contains(&owner[j]),
                        "{what}: atom {j} moved from rank {o} to {}, not a neighbour",
                        owner[j]
                    );
                }
                // Independently of the image rule: every owned atom sees all
                // of its neighbours within the width among its rank's rows.
                let cell = moved.cell_or_zero();
                let reach: Vec<i32> = vec![-1, 0, 1];
                for d in &part.ranks {
                    let rows = d.local_positions(&moved);
                    for (k, &i) in d.owned.iter().enumerate() {
                        let within = |a: [f64; 3], b: [f64; 3]| {
                            (0..3).map(|x| (a[x] - b[x]).powi(2)).sum::<f64>() < width * width
                        };
                        let seen = rows
                            .iter()
                            .enumerate()
                            .filter(|&(l, &r)| l != k && within(rows[k], r))
                            .count();
                        let mut truth = 0;
                        for (j, &rj) in moved.positions.iter().enumerate() {
                            for &a in &reach {
                                for &b in &reach {
                                    for &c in &reach {
                                        let s = [a, b, c];
                                        if (0..3).any(|x| s[x] != 0 && !moved.pbc[x])
                                            || (j == i && s == [0, 0, 0])
                                        {
                                            continue;
                                        }
                                        let v = cell.shift_vector(s);
                                        let img = [rj[0] + v[0], rj[1] + v[1], rj[2] + v[2]];
                                        truth += usize::from(within(moved.positions[i], img));
                                    }
                                }
                            }
                        }
                        assert_eq!(
                            seen, truth,
                            "{what}: neighbours of atom {i} on rank {}",
                            d.rank
                        );
                    }
                }
                for d in &part.ranks {
                    assert_eq!(
                        d.ghosts, expected[d.rank],
                        "{what}: ghosts of rank {}",
                        d.rank
                    );
                    let near = map.neighbours(d.rank);
                    assert!(!near.contains(&d.rank));
                    for g in &d.ghosts {
                        assert!(
                            g.owner_rank == d.rank || near.contains(&g.owner_rank),
                            "{what}: rank {} holds a ghost of rank {}, not a neighbour",
                            d.rank,
                            g.owner_rank
                        );
                    }
                    for &p in &near {
                        assert!(map.neighbours(p).contains(&d.rank), "{what}: not symmetric");
                    }
                }
            }
        }
    }
}

#[test]
fn map_round_trips_through_json_and_refuses_what_it_was_not_made_for() {
    for (name, sys) in cases() {
        let (_, map) = partition_system_mapped(&sys, 4, 3.0, Balance::EvenCounts, None).unwrap();
        let text = serde_json::to_string(&map).unwrap();
        let back: ddmlip_domain::DomainMap = serde_json::from_str(&text).unwrap();
        assert_eq!(back, map, "{name}");
        let err =
            partition_system_mapped(&sys, 3, 3.0, Balance::EvenCounts, Some(&map)).unwrap_err();
        assert!(
            matches!(err, PartitionError::MapMismatch(_)),
            "{name}: {err}"
        );
        let err =
            partition_system_mapped(&sys, 4, 2.5, Balance::EvenCounts, Some(&map)).unwrap_err();
        assert!(err.to_string().contains("ghost width"), "{name}: {err}");
        if let Some(cell) = sys.cell {
            let mut other = sys.clone();
            other.cell = Some(Cell::new(cell.matrix.map(|r| r.map(|x| x * 1.01))));
            let err = partition_system_mapped(&other, 4, 3.0, Balance::EvenCounts, Some(&map))
                .unwrap_err();
            assert!(err.to_string().contains("cell"), "{name}: {err}");
        }
    }
}
