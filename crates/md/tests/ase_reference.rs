//! NVE with `lj` against ASE's `VelocityVerlet` with ASE's `LennardJones`
//! from the same start, and the unit constants against `ase.units`.
//!
//! ASE runs in a `python3` subprocess (JSON on stdin and stdout); ASE must
//! be installed (`scripts/ci-setup.sh` installs it).

mod common;

use common::*;
use ddmlip_md::{maxwell_boltzmann, units, Ensemble, MdConfig, StartState};
use ddmlip_models::load_model;
use serde_json::{json, Value};

const ASE_SCRIPT: &str = r#"
import json, sys
import numpy as np
from ase import Atoms, units
from ase.calculators.lj import LennardJones
from ase.md.verlet import VelocityVerlet
req = json.load(sys.stdin)
atoms = Atoms(numbers=req["numbers"], positions=req["positions"], cell=req["cell"], pbc=True)
atoms.set_masses(req["masses"])
atoms.set_momenta(np.array(req["momenta"]))
atoms.calc = LennardJones(epsilon=0.0104, sigma=3.4, rc=10.2, smooth=False)
dyn = VelocityVerlet(atoms, timestep=req["dt_fs"] * units.fs)
dyn.run(req["steps"])
print(json.dumps({
    "positions": atoms.get_positions().tolist(),
    "momenta": atoms.get_momenta().tolist(),
    "fs": units.fs, "kB": units.kB, "GPa": units.GPa,
}))
"#;

fn run_ase(request: &Value) -> Value {
    run_python_json(ASE_SCRIPT, request)
}

fn rows(v: &Value) -> Vec<[f64; 3]> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let r = r.as_array().unwrap();
            [
                r[0].as_f64().unwrap(),
                r[1].as_f64().unwrap(),
                r[2].as_f64().unwrap(),
            ]
        })
        .collect()
}

#[test]
fn nve_lj_equals_ase_velocity_verlet_on_1_4_8_ranks() {
    let (pos, cell) = fcc_argon(3, 5.3, 0.1);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 80.0, 2);
    let steps = 200;
    let reference = run_ase(&json!({
        "numbers": topo.numbers,
        "positions": pos,
        "cell": cell.matrix,
        "masses": topo.masses,
        "momenta": p,
        "dt_fs": 2.0,
        "steps": steps,
    }));
    // The same unit system, to the last bit.
    assert_eq!(reference["fs"].as_f64().unwrap(), units::fs());
    assert_eq!(reference["kB"].as_f64().unwrap(), units::boltzmann());
    assert_eq!(reference["GPa"].as_f64().unwrap(), units::gpa());
    let ase_pos = rows(&reference["positions"]);
    let ase_mom = rows(&reference["momenta"]);
    let start = StartState::fresh(cell, pos, p);
    let model = load_model("lj").unwrap();
    for ranks in [1, 4, 8] {
        let mut config = MdConfig::new(Ensemble::Nve, 2.0, steps);
        config.final_frame = true;
        let (summary, got) = run(model.as_ref(), &topo, &start, &config, ranks);
        let last = got.last.unwrap();
        let dx = max_distance(&last.positions, &ase_pos, &cell);
        let dp = max_abs_diff(&last.momenta, &ase_mom);
        eprintln!(
            "{ranks} ranks: max |Δr| = {dx:e} Å, max |Δp| = {dp:e}, {} rebuilds",
            summary.rebuilds
        );
        assert!(
            dx < 1e-8,
            "{ranks} ranks: positions differ from ASE by {dx:e} Å"
        );
        assert!(
            dp < 1e-8,
            "{ranks} ranks: momenta differ from ASE by {dp:e}"
        );
    }
}
