//! The checkpoints written by `sevenn train` (`tests/data/sevenn-train/`,
//! made by `scripts/fixtures/make_sevenn_train_fixture.py`) and the three
//! checks every one of them gets against upstream's outputs: f64 equal to
//! upstream's f64, f32 within upstream's own f32 gap, decomposed equal to
//! one process.

use super::*;
use ddmlip_engine::{DType, Model};
use ddmlip_runtime::{evaluate, EvalOptions};
use serde_json::Value;
use std::path::PathBuf;

/// One `sevenn train` fixture: `NAME.pth`, `NAME.json` (upstream's outputs
/// and config), `NAME.yaml`.
pub struct SevennTrain {
    pub name: &'static str,
}

impl SevennTrain {
    fn path(&self, ext: &str) -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/sevenn-train/"
        ))
        .join(format!("{}.{ext}", self.name))
    }

    /// The fixture file: `{"config": ..., "checkpoints": {NAME: {"results": [...]}}}`.
    pub fn fixture(&self) -> Value {
        let text =
            std::fs::read_to_string(self.path("json")).expect("read the sevenn-train fixture");
        serde_json::from_str(&text).expect("parse the sevenn-train fixture")
    }

    /// The checkpoint, loaded as a user would (`--model NAME.pth`).
    pub fn model(&self) -> Box<dyn Model> {
        let path = self.path("pth");
        ddmlip_models::load_model(path.to_str().expect("utf-8 path")).expect("load the checkpoint")
    }

    /// Upstream's outputs per structure.
    pub fn cases(&self) -> Vec<Case> {
        self.fixture()["checkpoints"][self.name]["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(case)
            .collect()
    }

    /// f64 against upstream's f64 on the four structures (periodic,
    /// triclinic, slab, cluster).
    pub fn check_f64_matches_upstream(&self) {
        let m = self.model();
        let cases = self.cases();
        assert_eq!(cases.len(), 4, "periodic, triclinic, slab, cluster");
        let r = evaluate(m.as_ref(), &systems(&cases), &EvalOptions::default()).unwrap();
        let g = gap(&cases, &r, |c| &c.f64);
        eprintln!(
            "{} f64 vs upstream f64: energy {:.2e} eV/atom, forces {:.2e} eV/Å, stress {:.2e} eV/Å³, atomic {:.2e} eV",
            self.name, g.energy, g.forces, g.stress, g.atomic
        );
        assert!(g.energy < 1e-12, "energy off by {} eV/atom", g.energy);
        assert!(g.forces < 1e-11, "forces off by {} eV/Å", g.forces);
        assert!(g.stress < 1e-12, "stress off by {} eV/Å³", g.stress);
        assert!(g.atomic < 1e-11, "atomic energies off by {} eV", g.atomic);
    }

    /// f32 within the SevenNet family's bounds against upstream's float32
    /// calculator, and against upstream's f64 within upstream's own f32 gap
    /// over the four structures.
    pub fn check_f32_within_upstream_gap(&self) {
        let m = self.model();
        let cases = self.cases();
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
            "{} f32 vs upstream f64: energy {:.2e} eV/atom, forces {:.2e} eV/Å (upstream's f32 gap {:.2e}, {:.2e}); vs upstream f32: {:.2e}, {:.2e}",
            self.name, ours.energy, ours.forces, up_energy, up_forces, ours_vs_f32.energy, ours_vs_f32.forces
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

    /// Two and four ranks against one process, f64, on the 108-atom
    /// periodic alloy: energy, forces, stress and per-atom energies.
    pub fn check_decomposed_equals_single_process(&self) {
        let m = self.model();
        let cases: Vec<Case> = self
            .cases()
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
            let (a1, ar) = (
                single.atomic_energies().expect("atomic energies output"),
                split.atomic_energies().expect("atomic energies output"),
            );
            let a = a1
                .iter()
                .zip(ar)
                .fold(0.0f64, |m, (x, y)| m.max((x - y).abs() / x.abs().max(1e-3)));
            eprintln!(
                "{} {ranks} ranks vs 1: energy {e:.1e}, forces {f:.1e}, stress {s:.1e}, atomic {a:.1e} (relative)",
                self.name
            );
            assert!(
                e < 1e-10 && f < 1e-10 && s < 1e-10 && a < 1e-10,
                "{ranks} ranks differ: {e} {f} {s} {a}"
            );
        }
    }
}
