//! The NequIP, Allegro and MACE archives (random-weight models exported by
//! `scripts/fixtures/make_pt2_mlip_fixtures.py`) through the real binary:
//! `validate` passes on 2, 3 and 4 ranks and repairs a wrong prior spec,
//! and `--backend mpi` under
//! `mpirun` equals the single-process run to 1e-10.

mod common;

use common::{
    pt2_archive as archive, replicated_reference_structure, validate_from_prior, wrong_local_prior,
};
use ddmlip_testkit::cli::output_text as text;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");
const MODELS: [&str; 3] = ["nequip", "allegro", "mace"];

/// The references' periodic 32-atom cell (species H, C, O) replicated
/// 2×2×1: 128 atoms in a 15.6 × 15.6 × 7.8 Å box, so that 4 ranks each
/// own atoms and read ghosts.
fn structure(dir: &Path) -> PathBuf {
    replicated_reference_structure(
        dir,
        "nequip_reference.json",
        "nequip",
        &["H", "C", "O"],
        "hco128.xyz",
        [2, 2, 1],
    )
}

#[test]
fn validate_passes_for_nequip_allegro_and_mace_on_2_3_and_4_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let s = structure(dir.path());
    for name in MODELS {
        let model = archive(&format!("{name}.pt2"));
        for ranks in ["2", "3", "4"] {
            let o = Command::new(BIN)
                .args(["validate", "--model"])
                .arg(&model)
                .arg("--structure")
                .arg(&s)
                .args(["--ranks", ranks])
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{name}, {ranks} ranks: {}",
                text(&o)
            );
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("\"passed\": true"),
                "{name}, {ranks} ranks: {}",
                text(&o)
            );
        }
    }
}

/// A prior spec whose gather and scatter are both `local` (ghost rows never
/// refreshed) fails on NequIP without auto-fix and is repaired with it.
#[test]
fn validate_fixes_a_wrong_prior_for_nequip() {
    let dir = tempfile::tempdir().unwrap();
    let s = structure(dir.path());
    let model = archive("nequip.pt2");
    let prior = wrong_local_prior(dir.path());
    let fixed = dir.path().join("fixed.json");
    let with_prior =
        validate_from_prior(model.to_str().unwrap(), s.to_str().unwrap(), &prior, &fixed);
    let run = |extra: &[&str]| {
        Command::new(BIN)
            .args(&with_prior)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = run(&["--no-autofix"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "fails without auto-fix: {}",
        text(&o)
    );
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("fix applied"),
        "{}",
        text(&o)
    );
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::*;
    use ddmlip_testkit::mpirun_available;
    use serde_json::Value;

    fn floats(v: &Value) -> Vec<f64> {
        match v {
            Value::Array(a) => a.iter().flat_map(floats).collect(),
            other => vec![other.as_f64().unwrap()],
        }
    }

    /// The one JSON object a successful `--json` run prints (rank 0's).
    fn json_of(o: &Output) -> Value {
        assert!(o.status.success(), "{}", text(o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "expected one JSON line; {}", text(o));
        serde_json::from_str(lines[0]).unwrap()
    }

    /// `got` equals `want` to 1e-10 of each quantity's largest value.
    fn assert_same(got: &Value, want: &Value, what: &str) {
        for key in ["energy", "forces", "stress", "atomic_energies"] {
            let (g, w) = (floats(&got[key]), floats(&want[key]));
            assert_eq!(g.len(), w.len(), "{what}: {key} length");
            let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(scale > 0.0, "{what}: {key} is zero");
            for (k, (a, b)) in g.iter().zip(&w).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-10 * scale,
                    "{what}: {key}[{k}] {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn pt2_models_under_mpirun_equal_the_single_process_run() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let s = structure(dir.path());
        for name in MODELS {
            let model = archive(&format!("{name}.pt2"));
            let single = Command::new(BIN)
                .args(["eval", "--json", "--model"])
                .arg(&model)
                .arg("--structure")
                .arg(&s)
                .output()
                .unwrap();
            let single = json_of(&single);
            for n in ["2", "4"] {
                let o = Command::new("mpirun")
                    .args(["--allow-run-as-root", "--oversubscribe", "-n", n])
                    .arg(BIN)
                    .args(["eval", "--backend", "mpi", "--json", "--model"])
                    .arg(&model)
                    .arg("--structure")
                    .arg(&s)
                    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                    .output()
                    .unwrap();
                assert_same(&json_of(&o), &single, &format!("{name}, mpirun -n {n}"));
            }
        }
    }
}
