//! The SevenNet family through the real binary: `ddmlip models` lists the
//! wheel's four checkpoints, `--modal` picks a fidelity of SevenNet-MF-0 and
//! is refused (exit 2, valid names listed) where missing or wrong, and an
//! unsupported architecture or a species outside the model's list is exit 2
//! with the file named.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// Silicon, 8 atoms in the conventional diamond cell (periodic).
const SI8: &str = "8\n\
Lattice=\"5.43 0.0 0.0 0.0 5.43 0.0 0.0 0.0 5.43\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n\
Si 0.0 0.0 0.0\n\
Si 1.3575 1.3575 1.3575\n\
Si 0.0 2.715 2.715\n\
Si 1.3575 4.0725 4.0725\n\
Si 2.715 0.0 2.715\n\
Si 4.0725 1.3575 4.0725\n\
Si 2.715 2.715 0.0\n\
Si 4.0725 4.0725 1.3575\n";

fn fetch() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/fetch-sevennet.sh"
    );
    let st = Command::new("bash").arg(script).status().unwrap();
    assert!(st.success(), "could not fetch the SevenNet checkpoints");
}

fn run(args: &[&str]) -> (i32, String, String) {
    ddmlip_testkit::cli::run_binary(BIN, args)
}

fn si8(dir: &tempfile::TempDir) -> PathBuf {
    let p = dir.path().join("si8.xyz");
    std::fs::write(&p, SI8).unwrap();
    p
}

#[test]
fn models_lists_the_four_wheel_checkpoints() {
    fetch();
    let (code, out, err) = run(&["models"]);
    assert_eq!(code, 0, "{err}");
    for name in [
        "sevennet-0 ",
        "sevennet-0-22may2024",
        "sevennet-l3i5",
        "sevennet-mf-0",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{out}"));
        assert!(line.contains("checkpoint at"), "{line}");
    }
}

#[test]
fn modal_picks_a_fidelity_and_is_checked() {
    fetch();
    let dir = tempfile::tempdir().unwrap();
    let s = si8(&dir);
    let s = s.to_str().unwrap();
    let energy = |modal: &str| -> f64 {
        let (code, out, err) = run(&[
            "eval",
            "--model",
            "sevennet-mf-0",
            "--modal",
            modal,
            "--structure",
            s,
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["energy"][0].as_f64().unwrap()
    };
    let (pbe, r2scan) = (energy("PBE"), energy("R2SCAN"));
    // The two fidelities are different reference energies (shifts differ by eV per atom).
    assert!((pbe - r2scan).abs() > 1.0, "PBE {pbe} vs R2SCAN {r2scan}");
    for args in [
        vec!["eval", "--model", "sevennet-mf-0", "--structure", s],
        vec![
            "eval",
            "--model",
            "sevennet-mf-0",
            "--modal",
            "HSE06",
            "--structure",
            s,
        ],
        vec![
            "validate",
            "--model",
            "sevennet-mf-0",
            "--structure",
            s,
            "--ranks",
            "2",
        ],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("R2SCAN, PBE"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = run(&[
        "eval",
        "--model",
        "sevennet-l3i5",
        "--modal",
        "PBE",
        "--structure",
        s,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no modals"), "{err}");
}

#[test]
fn unknown_species_names_the_structure_file() {
    fetch();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("oganesson.xyz");
    std::fs::write(
        &p,
        "2\nLattice=\"10 0 0 0 10 0 0 0 10\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nSi 0 0 0\nOg 0 0 2.5\n",
    )
    .unwrap();
    let (code, _, err) = run(&[
        "eval",
        "--model",
        "sevennet-0-22may2024",
        "--structure",
        p.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("oganesson.xyz") && err.contains("Og (Z=118)"),
        "{err}"
    );
}
