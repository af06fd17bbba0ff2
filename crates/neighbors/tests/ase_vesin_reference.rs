//! Pair sets against ASE (`ase.neighborlist.neighbor_list`) and vesin, run
//! through `python3` on identical inputs. Requires `pip install ase vesin`.

mod common;

use common::{fcc, triples, Rng};
use ddmlip_atoms::Cell;
use ddmlip_neighbors::{neighbor_list, NeighborOptions};
use std::io::Write;
use std::process::{Command, Stdio};

/// Reads systems from stdin (one per line: name, cutoff, 9 cell numbers,
/// 3 pbc flags, then x y z per atom) and prints, per system and per library,
/// a header line `name library count` followed by `i j s0 s1 s2` lines.
const SCRIPT: &str = r#"
import sys
import numpy as np
try:
    import ase
    from ase.neighborlist import neighbor_list
    import vesin
except ImportError as e:
    print("IMPORT-ERROR", e)
    sys.exit(3)
for line in sys.stdin:
    f = line.split()
    if not f:
        continue
    name, cutoff = f[0], float(f[1])
    cell = np.array([float(x) for x in f[2:11]]).reshape(3, 3)
    pbc = [x == "1" for x in f[11:14]]
    pos = np.array([float(x) for x in f[14:]]).reshape(-1, 3)
    atoms = ase.Atoms("H%d" % len(pos), positions=pos, cell=cell, pbc=pbc)
    i, j, S = neighbor_list("ijS", atoms, cutoff, self_interaction=False)
    print(name, "ase", len(i))
    for a, b, s in zip(i, j, S):
        print(a, b, s[0], s[1], s[2])
    nl = vesin.NeighborList(cutoff=cutoff, full_list=True)
    box = cell if any(pbc) else np.zeros((3, 3))
    i, j, S = nl.compute(points=pos, box=box, periodic=pbc, quantities="ijS")
    print(name, "vesin", len(i))
    for a, b, s in zip(i, j, S):
        print(a, b, s[0], s[1], s[2])
"#;

struct Case {
    name: &'static str,
    cutoff: f64,
    cell: [[f64; 3]; 3],
    pbc: [bool; 3],
    positions: Vec<[f64; 3]>,
}

fn cases() -> Vec<Case> {
    let mut rng = Rng::new(2024);
    let mut cases = Vec::new();

    let (mut positions, cell) = fcc(3.615, 3);
    for p in &mut positions {
        for x in p.iter_mut() {
            *x += rng.uniform(-0.05, 0.05);
        }
    }
    cases.push(Case {
        name: "fcc_cu_3x3x3",
        cutoff: 5.0,
        cell,
        pbc: [true; 3],
        positions,
    });

    // Strongly skewed triclinic cell, some atoms outside it.
    let cell = [[9.0, 0.0, 0.0], [6.5, 8.0, 0.0], [-4.0, 3.5, 8.5]];
    let c = Cell::new(cell);
    let positions = (0..60)
        .map(|_| {
            c.to_cartesian([
                rng.uniform(-0.5, 1.5),
                rng.uniform(-0.5, 1.5),
                rng.uniform(-0.2, 1.2),
            ])
        })
        .collect();
    cases.push(Case {
        name: "triclinic",
        cutoff: 4.5,
        cell,
        pbc: [true; 3],
        positions,
    });

    // Slab periodic in-plane, open along z, atoms spread over 12 Å.
    let cell = [[7.2, 0.0, 0.0], [2.0, 6.9, 0.0], [0.0, 0.0, 30.0]];
    let positions = (0..50)
        .map(|_| {
            [
                rng.uniform(-1.0, 9.0),
                rng.uniform(0.0, 7.0),
                rng.uniform(5.0, 17.0),
            ]
        })
        .collect();
    cases.push(Case {
        name: "slab_ttf",
        cutoff: 4.0,
        cell,
        pbc: [true, true, false],
        positions,
    });

    // Wire periodic along a only.
    let cell = [[5.0, 0.0, 0.0], [0.0, 20.0, 0.0], [0.0, 0.0, 20.0]];
    let positions = (0..20)
        .map(|_| {
            [
                rng.uniform(0.0, 5.0),
                rng.uniform(8.0, 12.0),
                rng.uniform(8.0, 12.0),
            ]
        })
        .collect();
    cases.push(Case {
        name: "wire_tff",
        cutoff: 6.0,
        cell,
        pbc: [true, false, false],
        positions,
    });

    // Molecule without a cell, far from the origin.
    let positions = (0..40)
        .map(|_| {
            [
                1000.0 + rng.uniform(0.0, 9.0),
                -500.0 + rng.uniform(0.0, 9.0),
                rng.uniform(0.0, 9.0),
            ]
        })
        .collect();
    cases.push(Case {
        name: "molecule",
        cutoff: 3.0,
        cell: [[0.0; 3]; 3],
        pbc: [false; 3],
        positions,
    });

    // Triclinic cell smaller than the cutoff on every axis.
    let cell = [[2.1, 0.0, 0.0], [0.7, 2.3, 0.0], [0.4, -0.5, 2.6]];
    let c = Cell::new(cell);
    let positions = (0..3)
        .map(|_| {
            c.to_cartesian([
                rng.uniform(0.0, 1.0),
                rng.uniform(0.0, 1.0),
                rng.uniform(0.0, 1.0),
            ])
        })
        .collect();
    cases.push(Case {
        name: "small_cell",
        cutoff: 5.0,
        cell,
        pbc: [true; 3],
        positions,
    });
    cases
}

#[test]
fn pair_sets_match_ase_and_vesin() {
    let cases = cases();
    let mut input = String::new();
    for case in &cases {
        input += &format!("{} {:e}", case.name, case.cutoff);
        for x in case.cell.iter().flatten() {
            input += &format!(" {x:e}");
        }
        for p in case.pbc {
            input += if p { " 1" } else { " 0" };
        }
        for x in case.positions.iter().flatten() {
            input += &format!(" {x:e}");
        }
        input += "\n";
    }
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is required for this test (then `pip install ase vesin`)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python reference failed; install the references with `pip install ase vesin`.\nstdout: {}\nstderr: {}",
        stdout.lines().next().unwrap_or(""),
        String::from_utf8_lossy(&output.stderr)
    );

    let mut lines = stdout.lines();
    for case in &cases {
        let ours = neighbor_list(
            &case.positions,
            Some(&Cell::new(case.cell)),
            case.pbc,
            &NeighborOptions {
                cutoff: case.cutoff,
                half: false,
            },
        )
        .unwrap();
        assert!(
            !ours.is_empty(),
            "{}: the case should have pairs",
            case.name
        );
        for library in ["ase", "vesin"] {
            let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
            assert_eq!(header[..2], [case.name, library]);
            let count: usize = header[2].parse().unwrap();
            let mut theirs: Vec<(u32, u32, [i32; 3])> = (0..count)
                .map(|_| {
                    let v: Vec<i64> = lines
                        .next()
                        .unwrap()
                        .split_whitespace()
                        .map(|x| x.parse().unwrap())
                        .collect();
                    (
                        v[0] as u32,
                        v[1] as u32,
                        [v[2] as i32, v[3] as i32, v[4] as i32],
                    )
                })
                .collect();
            theirs.sort();
            assert_eq!(
                ours.len(),
                count,
                "{}: pair count differs from {library}",
                case.name
            );
            assert_eq!(
                triples(&ours),
                theirs,
                "{}: (i, j, S) differ from {library}",
                case.name
            );
        }
    }
}
