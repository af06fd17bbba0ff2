//! The `lj` model against ASE's `ase.calculators.lj.LennardJones` (the
//! independent reference named in the design): energy, forces, stress and
//! per-atom energies on periodic, triclinic, slab and non-periodic systems.
//!
//! ASE runs in a `python3` subprocess; the systems go in as JSON on stdin and
//! ASE's results come back as JSON on stdout. ASE must be installed.

// Index loops walk ddmlip's and ASE's arrays in step; that reads clearer here.
#![allow(clippy::needless_range_loop)]

use ddmlip_atoms::build::{self, SplitMix64};
use ddmlip_atoms::{Cell, System};
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions, EvalResult};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// f64 agreement demanded by the task: relative to the quantity's scale.
const RTOL: f64 = 1e-10;

/// Runs ASE's LennardJones (shifted, `smooth=False`) on every system and
/// returns, per system: energy, forces, stress (or null), per-atom energies,
/// the per-atom count of neighbours within `rc` (to undo the shift) and
/// ASE's pair energy at the cutoff `e0`.
const ASE_SCRIPT: &str = r#"
import json, sys
try:
    import numpy as np
    from ase import Atoms
    from ase.calculators.lj import LennardJones
    from ase.neighborlist import neighbor_list
except ImportError as err:
    sys.stderr.write("ASE (python3 -m pip install ase) is required for this test: %s\n" % err)
    sys.exit(3)
req = json.load(sys.stdin)
result = []
for p, s in ((p, s) for p in req["params"] for s in req["systems"]):
    cell = s["cell"] if s["cell"] is not None else np.zeros((3, 3))
    atoms = Atoms(numbers=s["numbers"], positions=s["positions"], cell=cell, pbc=s["pbc"])
    atoms.calc = LennardJones(epsilon=p["epsilon"], sigma=p["sigma"], rc=p["cutoff"], smooth=False)
    energy = atoms.get_potential_energy()
    forces = atoms.get_forces()
    energies = atoms.calc.results["energies"]
    stress = atoms.get_stress().tolist() if atoms.cell.rank == 3 else None
    i = neighbor_list("i", atoms, p["cutoff"])
    counts = np.bincount(i, minlength=len(atoms))
    rc = p["cutoff"]
    e0 = 4 * p["epsilon"] * ((p["sigma"] / rc) ** 12 - (p["sigma"] / rc) ** 6)
    result.append({"energy": energy, "forces": forces.tolist(), "stress": stress,
                   "energies": energies.tolist(), "counts": counts.tolist(), "e0": e0})
print(json.dumps(result))
"#;

/// One system's reference values.
struct Reference {
    energy: f64,
    forces: Vec<[f64; 3]>,
    stress: Option<[f64; 6]>,
    energies: Vec<f64>,
    neighbour_counts: Vec<f64>,
    e0: f64,
}

/// ASE's results for every (ε, σ, cutoff) in `params` on every system, in
/// one Python run (importing ASE costs about a second of CPU); one
/// `Vec<Reference>` per parameter set.
fn run_ase(systems: &[System], params: &[(f64, f64, f64)]) -> Vec<Vec<Reference>> {
    let request = json!({
        "params": params.iter().map(|&(epsilon, sigma, cutoff)| {
            json!({"epsilon": epsilon, "sigma": sigma, "cutoff": cutoff})
        }).collect::<Vec<_>>(),
        "systems": systems.iter().map(|s| json!({
            "positions": s.positions,
            "numbers": s.numbers,
            "cell": s.cell.map(|c| c.matrix),
            "pbc": s.pbc,
        })).collect::<Vec<_>>(),
    });
    let mut child = Command::new("python3")
        .args(["-c", ASE_SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be on PATH to run the ASE reference");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the ASE reference failed (is ASE installed? `python3 -m pip install ase`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let refs: Vec<Reference> = parsed
        .iter()
        .map(|r| Reference {
            energy: r["energy"].as_f64().unwrap(),
            forces: serde_json::from_value(r["forces"].clone()).unwrap(),
            stress: serde_json::from_value(r["stress"].clone()).unwrap(),
            energies: serde_json::from_value(r["energies"].clone()).unwrap(),
            neighbour_counts: serde_json::from_value(r["counts"].clone()).unwrap(),
            e0: r["e0"].as_f64().unwrap(),
        })
        .collect();
    let mut per_params = Vec::new();
    let mut rest = refs.into_iter();
    for _ in params {
        per_params.push(rest.by_ref().take(systems.len()).collect());
    }
    per_params
}

/// The built-in's documented parameters (argon-like ε = 0.0104 eV,
/// σ = 3.4 Å, rc = 3σ) and those of the model files below.
const BUILTIN: (f64, f64, f64) = (0.0104, 3.4, 10.2);
const FILE: (f64, f64, f64) = (0.0123, 2.9, 7.5);

/// ASE's results for [`BUILTIN`] and [`FILE`] on [`systems`], computed once.
fn references() -> &'static [Vec<Reference>] {
    static REFS: OnceLock<Vec<Vec<Reference>>> = OnceLock::new();
    REFS.get_or_init(|| run_ase(&systems(), &[BUILTIN, FILE]))
}

/// Uniform in [0, 1) from the shared seeded generator.
struct Rng(SplitMix64);
impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }
    fn next(&mut self) -> f64 {
        0.5 * (self.0.uniform() + 1.0)
    }
}

/// FCC argon, 2×2×2 conventional cells (32 atoms, 10.52 Å box: smaller than
/// twice the 10.2 Å cutoff, so several periodic images interact), rattled so
/// that forces and shear stresses are non-zero.
fn fcc_argon() -> System {
    let mut sys = build::fcc(18, 5.26, 2);
    build::rattle_uniform(&mut sys, 0.05, 7);
    sys
}

/// `n` atoms at random fractional positions of `cell`, at least `min_dist`
/// apart (checked through the minimum image over neighbouring cells when
/// periodic), with positions wrapped or not.
fn random_system(cell: Cell, pbc: [bool; 3], n: usize, min_dist: f64, seed: u64) -> System {
    let mut rng = Rng::new(seed);
    let mut positions: Vec<[f64; 3]> = Vec::new();
    while positions.len() < n {
        let p = cell.to_cartesian([rng.next(), rng.next(), rng.next()]);
        let ok = positions.iter().all(|q| {
            let mut best = f64::INFINITY;
            for sx in -1..=1 {
                for sy in -1..=1 {
                    for sz in -1..=1 {
                        let s = [sx, sy, sz];
                        if (0..3).any(|k| s[k] != 0 && !pbc[k]) {
                            continue;
                        }
                        let t = cell.shift_vector(s);
                        let d: f64 = (0..3).map(|k| (p[k] - q[k] - t[k]).powi(2)).sum();
                        best = best.min(d.sqrt());
                    }
                }
            }
            best >= min_dist
        });
        if ok {
            positions.push(p);
        }
    }
    System::new(positions, vec![18; n], Some(cell), pbc)
}

fn triclinic() -> System {
    let cell = Cell::new([[9.0, 0.0, 0.0], [2.5, 8.5, 0.0], [1.5, -2.0, 9.5]]);
    random_system(cell, [true; 3], 24, 2.6, 11)
}

fn slab() -> System {
    let cell = Cell::new([[8.0, 0.0, 0.0], [3.0, 7.5, 0.0], [0.0, 0.0, 14.0]]);
    random_system(cell, [true, true, false], 18, 2.6, 12)
}

fn cluster() -> System {
    let mut s = random_system(Cell::orthorhombic(9.0, 9.0, 9.0), [false; 3], 20, 2.6, 13);
    s.cell = None;
    s
}

fn systems() -> Vec<System> {
    vec![fcc_argon(), triclinic(), slab(), cluster()]
}

fn assert_close(what: &str, got: f64, want: f64, scale: f64) {
    assert!(
        (got - want).abs() <= RTOL * scale,
        "{what}: ddmlip {got:e} vs ASE {want:e} (difference {:e}, allowed {:e})",
        (got - want).abs(),
        RTOL * scale
    );
}

/// Compares one evaluation of the whole batch with ASE. With `shift = false`
/// the ASE values are unshifted by hand: each pair within the cutoff gets
/// `e0` back, half to each atom (forces and stress do not depend on the shift).
fn compare(result: &EvalResult, batch: &[System], refs: &[Reference], shifted: bool) {
    let forces = result.forces().expect("forces");
    let stress = result.stress().expect("stress");
    let atomic = result.atomic_energies().expect("lj has per-atom energies");
    let mut offset = 0;
    for (s, (sys, r)) in batch.iter().zip(refs).enumerate() {
        let n = sys.len();
        let mut want_atomic = r.energies.clone();
        let mut want_energy = r.energy;
        if !shifted {
            for (e, c) in want_atomic.iter_mut().zip(&r.neighbour_counts) {
                *e += 0.5 * r.e0 * c;
            }
            want_energy += 0.5 * r.e0 * r.neighbour_counts.iter().sum::<f64>();
        }
        assert_close(
            &format!("system {s} energy"),
            result.energy().expect("energy")[s],
            want_energy,
            want_energy.abs(),
        );
        let e_scale = want_atomic.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        for i in 0..n {
            assert_close(
                &format!("system {s} atomic energy {i}"),
                atomic[offset + i],
                want_atomic[i],
                e_scale,
            );
        }
        let f_scale = r
            .forces
            .iter()
            .flatten()
            .fold(0.0f64, |m, f| m.max(f.abs()));
        assert!(f_scale > 1e-4, "system {s}: forces vanish, test is vacuous");
        for i in 0..n {
            for k in 0..3 {
                assert_close(
                    &format!("system {s} force atom {i} axis {k}"),
                    forces[offset + i][k],
                    r.forces[i][k],
                    f_scale,
                );
            }
        }
        match (stress[s], r.stress) {
            (Some(got), Some(want)) => {
                let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                for k in 0..6 {
                    assert_close(
                        &format!("system {s} stress component {k}"),
                        got[k],
                        want[k],
                        scale,
                    );
                }
            }
            (None, None) => {}
            (got, want) => panic!("system {s}: stress presence differs: {got:?} vs ASE {want:?}"),
        }
        offset += n;
    }
}

/// A Lennard-Jones model file with the [`FILE`] parameters.
fn lj_toml(shift: bool) -> String {
    let (epsilon, sigma, cutoff) = FILE;
    format!(
        "kind = \"lennard-jones\"\nepsilon = {epsilon:?}\nsigma = {sigma:?}\ncutoff = {cutoff:?}\nshift = {shift}\n"
    )
}

fn write_model_file(dir: &tempfile::TempDir, name: &str, body: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn builtin_lj_equals_ase() {
    let model = load_model("lj").unwrap();
    let batch = systems();
    let result = evaluate(model.as_ref(), &batch, &EvalOptions::default()).unwrap();
    let refs = &references()[0];
    compare(&result, &batch, refs, true);
}

#[test]
fn lj_model_file_shifted_equals_ase() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model_file(&dir, "lj.toml", &lj_toml(true));
    let model = load_model(&path).unwrap();
    let batch = systems();
    let result = evaluate(model.as_ref(), &batch, &EvalOptions::default()).unwrap();
    let refs = &references()[1];
    compare(&result, &batch, refs, true);
}

#[test]
fn lj_model_file_unshifted_equals_ase_plus_shift() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model_file(&dir, "lj_noshift.toml", &lj_toml(false));
    let model = load_model(&path).unwrap();
    let batch = systems();
    let result = evaluate(model.as_ref(), &batch, &EvalOptions::default()).unwrap();
    let refs = &references()[1];
    // The shift must actually matter here, or the unshifting is untested.
    assert!(refs.iter().all(|r| r.e0.abs() > 1e-6));
    compare(&result, &batch, refs, false);
}
