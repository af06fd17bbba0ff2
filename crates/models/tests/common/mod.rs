//! The SevenNet fixture files (`{"checkpoints": {NAME: {"results": [...]}}}`,
//! upstream's float64 and float32 outputs per structure) read into cases,
//! and the differences of an evaluation to them.
#![allow(dead_code)]

use ddmlip_atoms::{Cell, System};
use ddmlip_runtime::EvalResult;
use serde_json::Value;

/// One fixture entry: the structure and upstream's outputs.
pub struct Case {
    pub name: String,
    pub system: System,
    pub f64: Value,
    pub f32: Value,
}

/// An array of 3-vectors.
pub fn vec3s(v: &Value) -> Vec<[f64; 3]> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            let r = r.as_array().expect("row");
            [
                r[0].as_f64().unwrap(),
                r[1].as_f64().unwrap(),
                r[2].as_f64().unwrap(),
            ]
        })
        .collect()
}

/// One entry of a fixture's `results`.
pub fn case(r: &Value) -> Case {
    let numbers = r["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap() as u32)
        .collect();
    let cell = vec3s(&r["cell"]);
    let pbc: Vec<bool> = r["pbc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_bool().unwrap())
        .collect();
    Case {
        name: r["name"].as_str().unwrap().to_string(),
        system: System::new(
            vec3s(&r["positions"]),
            numbers,
            Some(Cell::new([cell[0], cell[1], cell[2]])),
            [pbc[0], pbc[1], pbc[2]],
        ),
        f64: r["float64"].clone(),
        f32: r["float32"].clone(),
    }
}

/// The cases' structures, as one batch.
pub fn systems(cases: &[Case]) -> Vec<System> {
    cases.iter().map(|c| c.system.clone()).collect()
}

/// Largest differences to a reference block: energy per atom (eV/atom),
/// force component (eV/Å), stress component where the structure has one
/// (eV/Å³), per-atom energy (eV).
#[derive(Default, Debug)]
pub struct Gap {
    pub energy: f64,
    pub forces: f64,
    pub stress: f64,
    pub atomic: f64,
}

/// [`Gap`] of a batch evaluation of `cases` against `block(case)`.
pub fn gap(cases: &[Case], r: &EvalResult, block: impl Fn(&Case) -> &Value) -> Gap {
    let mut g = Gap::default();
    let energy = r.energy().expect("energy output");
    let forces = r.forces().expect("forces output");
    let atomic = r.atomic_energies().expect("per-atom energies");
    let stress = r.stress().expect("stress output");
    let mut offset = 0;
    for (s, c) in cases.iter().enumerate() {
        let reference = block(c);
        let n = c.system.len();
        let e_ref = reference["energy"].as_f64().unwrap();
        g.energy = g.energy.max((energy[s] - e_ref).abs() / n as f64);
        for (i, f) in vec3s(&reference["forces"]).iter().enumerate() {
            for k in 0..3 {
                g.forces = g.forces.max((forces[offset + i][k] - f[k]).abs());
            }
        }
        for (i, e) in reference["energies"].as_array().unwrap().iter().enumerate() {
            g.atomic = g
                .atomic
                .max((atomic[offset + i] - e.as_f64().unwrap()).abs());
        }
        if c.system.pbc.iter().all(|&p| p) {
            let st = stress[s].expect("stress of a periodic cell");
            for (k, v) in reference["stress"].as_array().unwrap().iter().enumerate() {
                g.stress = g.stress.max((st[k] - v.as_f64().unwrap()).abs());
            }
        } else if let Some(st) = stress[s] {
            for (k, v) in reference["stress"].as_array().unwrap().iter().enumerate() {
                g.stress = g.stress.max((st[k] - v.as_f64().unwrap()).abs());
            }
        }
        offset += n;
    }
    g
}

/// Per structure: energy per atom (eV/atom) and largest force component
/// (eV/Å) of `ours` minus `reference`, both read from `forces_of(case)`.
pub fn per_structure_gaps(
    cases: &[Case],
    energy: impl Fn(usize, &Case) -> f64,
    forces: impl Fn(usize, &Case) -> Vec<[f64; 3]>,
    reference: impl Fn(&Case) -> &Value,
) -> Vec<(f64, f64)> {
    cases
        .iter()
        .enumerate()
        .map(|(s, c)| {
            let r = reference(c);
            let e = (energy(s, c) - r["energy"].as_f64().unwrap()).abs() / c.system.len() as f64;
            let f = forces(s, c)
                .iter()
                .zip(vec3s(&r["forces"]))
                .flat_map(|(a, b)| (0..3).map(move |k| (a[k] - b[k]).abs()))
                .fold(0.0f64, f64::max);
            (e, f)
        })
        .collect()
}

/// Upstream's own float32-vs-float64 gap, from the fixture alone: the
/// largest energy per atom (eV/atom) and force component (eV/Å) over `cases`.
pub fn upstream_f32_gap(cases: &[Case]) -> (f64, f64) {
    per_structure_gaps(
        cases,
        |_, c| c.f32["energy"].as_f64().unwrap(),
        |_, c| vec3s(&c.f32["forces"]),
        |c| &c.f64,
    )
    .iter()
    .fold((0.0f64, 0.0f64), |m, &(e, f)| (m.0.max(e), m.1.max(f)))
}

/// Relative differences of a decomposed evaluation to a single-process one
/// of the same first structure: energy, force components (to the largest
/// single-process component) and stress components (to the largest
/// single-process stress component).
pub fn decomposed_gaps(single: &EvalResult, split: &EvalResult) -> (f64, f64, f64) {
    let (e1, er) = (
        single.energy().expect("energy output")[0],
        split.energy().expect("energy output")[0],
    );
    let e = (er - e1).abs() / e1.abs();
    let (f1, fr) = (
        single.forces().expect("forces output"),
        split.forces().expect("forces output"),
    );
    let scale = f1.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    let f = f1
        .iter()
        .flatten()
        .zip(fr.iter().flatten())
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs() / scale));
    let (s1, sr) = (
        single.stress().expect("stress output")[0].expect("periodic"),
        split.stress().expect("stress output")[0].expect("periodic"),
    );
    let sscale = s1.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let s = (0..6).fold(0.0f64, |m, k| m.max((s1[k] - sr[k]).abs() / sscale));
    (e, f, s)
}

pub mod sevenn_train;
