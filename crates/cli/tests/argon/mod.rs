//! The argon crystals of the relax and progress tests, written as extended
//! XYZ.
#![allow(dead_code)]

use ddmlip_atoms::{Cell, System};
use std::path::Path;

/// FCC argon, 2×2×2 conventional cells with lattice constants `a` (Å, per
/// axis), every atom displaced by a deterministic wobble of up to `rattle`
/// Å; periodic in an orthorhombic cell, or (`periodic` false) a cluster
/// without a cell. Written to `path`.
pub fn write_fcc(path: &Path, a: [f64; 3], rattle: f64, periodic: bool) {
    let basis = [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
    ];
    let mut pos = Vec::new();
    let mut k = 0.0f64;
    for i in 0..2 {
        for j in 0..2 {
            for l in 0..2 {
                for b in basis {
                    k += 1.0;
                    pos.push([
                        (i as f64 + b[0]) * a[0] + rattle * (k * 1.3).sin(),
                        (j as f64 + b[1]) * a[1] + rattle * (k * 2.1).cos(),
                        (l as f64 + b[2]) * a[2] + rattle * (k * 0.7).sin(),
                    ]);
                }
            }
        }
    }
    let (cell, pbc) = if periodic {
        (
            Some(Cell::orthorhombic(2.0 * a[0], 2.0 * a[1], 2.0 * a[2])),
            [true; 3],
        )
    } else {
        (None, [false; 3])
    };
    let sys = System::new(pos, vec![18; 32], cell, pbc);
    ddmlip_atoms::extxyz::write_file(path, &[sys]).unwrap();
}
