//! The second `sevenn train` checkpoint of the tests' data (variant `full`
//! of `scripts/fixtures/make_sevenn_train_fixture.py`): every architecture
//! key a user can change beyond the training defaults, together — four
//! O(3) layers whose third gate sees odd scalars (0o, tanh), biases on
//! every network Linear (`use_bias_in_linear`), the fully connected
//! readout (`readout_as_fcn`, relu), shifted-softplus gates, per-layer
//! self-connections and a numeric `conv_denominator`. Through the op
//! engine against the real upstream code's outputs on four structures
//! (periodic, triclinic, slab, cluster), single process and decomposed.

mod common;

use common::*;
use ddmlip_engine::{DType, Model};
use ddmlip_runtime::{evaluate, EvalOptions};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

const NAME: &str = "sevenn_train_full";

fn data(file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/sevenn-train/"
    ))
    .join(file)
}

fn fixtures() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| {
        let text = std::fs::read_to_string(data(&format!("{NAME}.json")))
            .expect("read the sevenn-train fixture");
        serde_json::from_str(&text).expect("parse the sevenn-train fixture")
    })
}

fn model() -> Box<dyn Model> {
    let path = data(&format!("{NAME}.pth"));
    ddmlip_models::load_model(path.to_str().expect("utf-8 path")).expect("load the checkpoint")
}

fn cases() -> Vec<Case> {
    fixtures()["checkpoints"][NAME]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(case)
        .collect()
}

/// The fixture really exercises the keys it is meant to: its config as
/// upstream recorded it.
#[test]
fn fixture_config_has_the_non_default_keys() {
    let c = &fixtures()["config"];
    assert_eq!(c["num_convolution_layer"], 4);
    assert_eq!(c["is_parity"], true);
    assert_eq!(c["use_bias_in_linear"], true);
    assert_eq!(c["readout_as_fcn"], true);
    assert_eq!(c["act_scalar"]["o"], "tanh");
    assert_eq!(c["act_gate"]["e"], "ssp");
}

#[test]
fn full_config_checkpoint_f64_matches_upstream_f64() {
    let m = model();
    let cases = cases();
    assert_eq!(cases.len(), 4, "periodic, triclinic, slab, cluster");
    let r = evaluate(m.as_ref(), &systems(&cases), &EvalOptions::default()).unwrap();
    let g = gap(&cases, &r, |c| &c.f64);
    eprintln!(
        "sevenn-train full f64 vs upstream f64: energy {:.2e} eV/atom, forces {:.2e} eV/Å, stress {:.2e} eV/Å³, atomic {:.2e} eV",
        g.energy, g.forces, g.stress, g.atomic
    );
    assert!(g.energy < 1e-12, "energy off by {} eV/atom", g.energy);
    assert!(g.forces < 1e-11, "forces off by {} eV/Å", g.forces);
    assert!(g.stress < 1e-12, "stress off by {} eV/Å³", g.stress);
    assert!(g.atomic < 1e-11, "atomic energies off by {} eV", g.atomic);
}

#[test]
fn full_config_checkpoint_f32_within_upstreams_f32_gap() {
    let m = model();
    let cases = cases();
    let r = evaluate(
        m.as_ref(),
        &systems(&cases),
        &EvalOptions {
            dtype: DType::F32,
            ..Default::default()
        },
    )
    .unwrap();
    let ours_vs_f32 = gap(&cases, &r, |c| &c.f32);
    let ours = gap(&cases, &r, |c| &c.f64);
    // Upstream's own float32-vs-float64 gap, from the fixture alone.
    let (up_energy, up_forces) = upstream_f32_gap(&cases);
    eprintln!(
        "sevenn-train full f32 vs upstream f64: energy {:.2e} eV/atom, forces {:.2e} eV/Å (upstream's f32 gap {:.2e}, {:.2e}); vs upstream f32: {:.2e}, {:.2e}",
        ours.energy, ours.forces, up_energy, up_forces, ours_vs_f32.energy, ours_vs_f32.forces
    );
    assert!(
        up_forces > 0.0 && up_energy > 0.0,
        "the fixture's f32 differs from its f64"
    );
    assert!(
        ours_vs_f32.energy < 5e-6,
        "f32 energy off upstream's f32 by {} eV/atom",
        ours_vs_f32.energy
    );
    assert!(
        ours_vs_f32.forces < 5e-5,
        "f32 forces off upstream's f32 by {} eV/Å",
        ours_vs_f32.forces
    );
    // Within upstream's own f32 gap (measured: forces 0.29×, energies 0.48×).
    assert!(
        ours.energy <= up_energy,
        "f32 energy vs upstream f64 {} eV/atom, upstream's own f32 gap {}",
        ours.energy,
        up_energy
    );
    assert!(
        ours.forces <= up_forces,
        "f32 forces vs upstream f64 {} eV/Å, upstream's own f32 gap {}",
        ours.forces,
        up_forces
    );
}

/// Two and four ranks against one process, f64, on the 108-atom periodic
/// alloy: four layers need four cutoffs of ghosts.
#[test]
fn full_config_checkpoint_decomposed_equals_single_process() {
    let m = model();
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.name == "alloy_fcc_108")
        .collect();
    assert_eq!(cases.len(), 1);
    let frames = systems(&cases);
    let single = evaluate(m.as_ref(), &frames, &EvalOptions::default()).unwrap();
    for ranks in [2, 4] {
        let split = evaluate(
            m.as_ref(),
            &frames,
            &EvalOptions {
                ranks,
                ..Default::default()
            },
        )
        .unwrap();
        let (e, f, s) = decomposed_gaps(&single, &split);
        eprintln!(
            "sevenn-train full {ranks} ranks vs 1: energy {e:.1e}, forces {f:.1e}, stress {s:.1e} (relative)"
        );
        assert!(
            e < 1e-10 && f < 1e-10 && s < 1e-10,
            "{ranks} ranks differ: {e} {f} {s}"
        );
    }
}
