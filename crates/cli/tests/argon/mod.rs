//! The argon crystals of the relax and progress tests, written as extended
//! XYZ.
#![allow(dead_code)]

use ddmlip_testkit::cli::argon_fcc_in;
use std::path::Path;

/// FCC argon, 2×2×2 conventional cells with lattice constants `a` (Å, per
/// axis), every atom displaced by a deterministic wobble of up to `rattle`
/// Å; periodic in an orthorhombic cell, or (`periodic` false) a cluster
/// without a cell. Written to `path`.
pub fn write_fcc(path: &Path, a: [f64; 3], rattle: f64, periodic: bool) {
    let sys = argon_fcc_in(2, a, rattle, periodic, false);
    ddmlip_atoms::extxyz::write_file(path, &[sys]).unwrap();
}
