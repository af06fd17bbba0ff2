//! Imported archives against eager PyTorch float64 (the reference outputs
//! written by `scripts/fixtures/make_pt2_fixtures.py` next to the archives):
//! energy, per-atom energies, forces and stress on a periodic, a triclinic,
//! a cluster and a slab structure; and decomposed runs (2, 4 ranks) against
//! the single-process run.

use ddmlip_atoms::{Cell, System};
use ddmlip_engine::device::ReferenceSource;
use ddmlip_pt2::ImportedModel;
use ddmlip_runtime::{evaluate, EngineDevice, EvalOptions, EvalResult};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

const RTOL: f64 = 1e-10;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn reference(file: &str) -> Value {
    let text = std::fs::read_to_string(data(file)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(floats).collect(),
        other => vec![other.as_f64().unwrap()],
    }
}

/// The reference structure as a ddmlip system (species index k is
/// metadata.species[k]).
fn system(s: &Value, species: &[u32]) -> System {
    let pos = floats(&s["positions"]);
    let positions = pos.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
    let numbers = s["species"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| species[k.as_u64().unwrap() as usize])
        .collect();
    let c = floats(&s["cell"]);
    let cell = Cell::new([[c[0], c[1], c[2]], [c[3], c[4], c[5]], [c[6], c[7], c[8]]]);
    let pbc: Vec<bool> = s["pbc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    System::new(positions, numbers, Some(cell), [pbc[0], pbc[1], pbc[2]])
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= RTOL * scale,
            "{what}[{k}]: {g} vs {w} (scale {scale})"
        );
    }
}

fn run(model: &ImportedModel, sys: &System, ranks: usize) -> EvalResult {
    let opts = EvalOptions {
        ranks,
        ..EvalOptions::default()
    };
    evaluate(model, std::slice::from_ref(sys), &opts).unwrap()
}

/// [`run`] with the engine's ops on the reference device.
fn run_on_device(model: &ImportedModel, sys: &System, ranks: usize) -> EvalResult {
    let opts = EvalOptions {
        ranks,
        device: Some(EngineDevice(Arc::new(ReferenceSource))),
        ..EvalOptions::default()
    };
    evaluate(model, std::slice::from_ref(sys), &opts).unwrap()
}

fn out<'a>(r: &'a EvalResult, name: &str) -> &'a [f64] {
    &r.outputs[name].values
}

fn check_model(name: &str) {
    check_model_in("pt2_reference.json", name);
}

/// `name` against the eager outputs in the reference file `file`.
fn check_model_in(file: &str, name: &str) {
    let refs = reference(file);
    let entry = &refs["models"][name];
    let model = ImportedModel::load(data(&format!("{name}.pt2"))).unwrap();
    let species: Vec<u32> = entry["metadata"]["species"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap() as u32)
        .collect();
    let mut stresses = 0;
    for s in entry["results"].as_array().unwrap() {
        let label = format!("{name}/{}", s["name"].as_str().unwrap());
        let sys = system(s, &species);
        let r = &s["float64"];
        let single = run(&model, &sys, 1);
        assert_close(
            &format!("{label} energy"),
            out(&single, "energy"),
            &[r["energy"].as_f64().unwrap()],
        );
        assert_close(
            &format!("{label} energies"),
            out(&single, "atomic_energies"),
            &floats(&r["energies"]),
        );
        assert_close(
            &format!("{label} forces"),
            out(&single, "forces"),
            &floats(&r["forces"]),
        );
        if single.has_stress[0] {
            assert_close(
                &format!("{label} stress"),
                out(&single, "stress"),
                &floats(&r["stress"]),
            );
            stresses += 1;
        }
        // The engine's ops on a device (single process and split): the
        // same outputs.
        for ranks in [1, 2] {
            let on_device = run_on_device(&model, &sys, ranks);
            for key in ["energy", "atomic_energies", "forces"] {
                assert_close(
                    &format!("{label} {key} on a device, {ranks} rank(s)"),
                    out(&on_device, key),
                    out(&single, key),
                );
            }
        }
        for ranks in [2, 4] {
            let split = run(&model, &sys, ranks);
            assert_eq!(
                split.diagnostics.rank_sizes.len(),
                ranks,
                "{label}: ran on {ranks} ranks"
            );
            assert!(
                split
                    .diagnostics
                    .rank_sizes
                    .iter()
                    .all(|&(owned, _, _)| owned > 0),
                "{label}: every rank owns atoms: {:?}",
                split.diagnostics.rank_sizes
            );
            for key in ["energy", "atomic_energies", "forces"] {
                assert_close(
                    &format!("{label} {key} at {ranks} ranks"),
                    out(&split, key),
                    out(&single, key),
                );
            }
            if single.has_stress[0] {
                assert_close(
                    &format!("{label} stress at {ranks} ranks"),
                    out(&split, "stress"),
                    out(&single, "stress"),
                );
            }
        }
    }
    // The periodic, triclinic and slab structures have a stress.
    assert!(
        stresses >= 2,
        "{name}: stress compared on {stresses} structures"
    );
}

#[test]
fn pair_mlp_matches_eager_pytorch_and_decomposes() {
    check_model("pair_mlp");
}

#[test]
fn schnet_matches_eager_pytorch_and_decomposes() {
    check_model("schnet");
}

/// Several structures in one evaluation: the graph's `sum` is the
/// per-system reduction, so each system's energy is its own, and every
/// output equals the one-structure evaluation's.
#[test]
fn a_batch_equals_its_structures_one_by_one() {
    let refs = reference("pt2_reference.json");
    let entry = &refs["models"]["schnet"];
    let model = ImportedModel::load(data("schnet.pt2")).unwrap();
    let species = [1, 6, 8, 14];
    let systems: Vec<System> = entry["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| system(s, &species))
        .collect();
    let batch = evaluate(&model, &systems, &EvalOptions::default()).unwrap();
    let mut atom = 0;
    for (k, sys) in systems.iter().enumerate() {
        let one = run(&model, sys, 1);
        let n = sys.positions.len();
        assert_close(
            &format!("system {k} energy"),
            &out(&batch, "energy")[k..k + 1],
            out(&one, "energy"),
        );
        assert_close(
            &format!("system {k} forces"),
            &out(&batch, "forces")[3 * atom..3 * (atom + n)],
            out(&one, "forces"),
        );
        atom += n;
    }
}

#[test]
fn e3nn_tensor_product_matches_eager_pytorch_and_decomposes() {
    check_model("e3nn_tp");
}

// NequIP, Allegro and MACE (random weights) wrapped into the contract by
// `scripts/fixtures/make_pt2_mlip_fixtures.py`; eager references in
// `<name>_reference.json`.

#[test]
fn nequip_matches_eager_pytorch_and_decomposes() {
    check_model_in("nequip_reference.json", "nequip");
}

#[test]
fn allegro_matches_eager_pytorch_and_decomposes() {
    check_model_in("allegro_reference.json", "allegro");
}

#[test]
fn mace_matches_eager_pytorch_and_decomposes() {
    check_model_in("mace_reference.json", "mace");
}
