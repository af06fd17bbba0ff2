//! FIRE relaxation on a decomposed system: it reaches the lattice minimum
//! (checked with the single-process runtime), and split runs follow the
//! one-rank path.

mod common;

use common::*;
use ddmlip_atoms::System;
use ddmlip_md::{relax_threads, RelaxConfig};
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions};

#[test]
fn fire_reaches_the_lattice_minimum_on_1_and_4_ranks() {
    let model = load_model("lj").unwrap();
    // LJ FCC minimum near a = 2^(1/6)·σ·√2 ≈ 5.40 Å (truncated potential:
    // slightly different); a = 5.26 with a rattle leaves real forces.
    let (ideal, cell) = fcc_argon(3, 5.26, 0.0);
    let (rattled, _) = fcc_argon(3, 5.26, 0.25);
    let topo = argon_topology(ideal.len());
    let single = |pos: &[[f64; 3]]| {
        let sys = System::new(pos.to_vec(), topo.numbers.clone(), Some(cell), [true; 3]);
        evaluate(model.as_ref(), &[sys], &EvalOptions::default()).unwrap()
    };
    let e_ideal = single(&ideal).energy().expect("energy")[0];
    let config = RelaxConfig {
        fmax: 1e-6,
        max_steps: 2000,
        skin: 0.3,
        ..Default::default()
    };
    let one = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 1).unwrap();
    assert!(
        one.converged,
        "not converged after {} steps (fmax {})",
        one.steps, one.fmax
    );
    let last = one.last.clone().unwrap();
    let check = single(&last.positions);
    let fmax = check
        .forces()
        .expect("forces")
        .iter()
        .map(|f| (f[0] * f[0] + f[1] * f[1] + f[2] * f[2]).sqrt())
        .fold(0.0, f64::max);
    assert!(fmax < 1e-6, "independent max force {fmax}");
    assert!((check.energy().expect("energy")[0] - one.energy).abs() < 1e-9);
    eprintln!(
        "FIRE: {} steps, E {} → {} eV (ideal lattice {e_ideal} eV), fmax {fmax:e}",
        one.steps, one.initial_energy, one.energy
    );
    assert!(
        (one.energy - e_ideal).abs() < 1e-8,
        "E {} vs ideal {e_ideal}",
        one.energy
    );
    let four = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 4).unwrap();
    assert_eq!(four.steps, one.steps);
    let dx = max_distance(&four.last.unwrap().positions, &last.positions, &cell);
    assert!(dx < 1e-8, "4 ranks differ from 1 by {dx:e} Å");
}
