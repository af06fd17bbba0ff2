//! A checkpoint written by `sevenn train` (O(3) irreps, `nequip`
//! self-connections; the test data of ddmlip-models) through the real
//! binary: `eval --model FILE.pth` gives upstream's float64 energy and
//! forces, on one rank and on three.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn data(file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/tests/data/sevenn-train/"
    ))
    .join(file)
}

/// The fixture's triclinic alloy as extended XYZ (shortest round-trip
/// decimals, so the binary reads the same f64 positions), with upstream's
/// float64 energy (eV) and forces (eV/Å).
fn triclinic(dir: &tempfile::TempDir) -> (PathBuf, f64, Vec<f64>) {
    let text = std::fs::read_to_string(data("sevenn_train_parity.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let r = v["checkpoints"]["sevenn_train_parity"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "alloy_triclinic_32")
        .expect("the triclinic structure")
        .clone();
    let lattice: Vec<String> = flat(&r["cell"]).iter().map(|v| v.to_string()).collect();
    let mut xyz = format!(
        "{}\nLattice=\"{}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n",
        r["numbers"].as_array().unwrap().len(),
        lattice.join(" ")
    );
    for (z, p) in r["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["positions"].as_array().unwrap())
    {
        let symbol = match z.as_u64().unwrap() {
            28 => "Ni",
            29 => "Cu",
            79 => "Au",
            other => panic!("unexpected element {other}"),
        };
        let p: Vec<String> = p
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap().to_string())
            .collect();
        xyz.push_str(&format!("{symbol} {}\n", p.join(" ")));
    }
    let path = dir.path().join("triclinic.xyz");
    std::fs::write(&path, xyz).unwrap();
    let forces = flat(&r["float64"]["forces"]);
    (path, r["float64"]["energy"].as_f64().unwrap(), forces)
}

/// The rows of a JSON matrix, concatenated.
fn flat(x: &serde_json::Value) -> Vec<f64> {
    x.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect()
}

#[test]
fn eval_of_a_sevenn_train_checkpoint_matches_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let (structure, e_ref, f_ref) = triclinic(&dir);
    let model = data("sevenn_train_parity.pth");
    for ranks in ["1", "3"] {
        let out = Command::new(BIN)
            .args([
                "eval",
                "--model",
                model.to_str().unwrap(),
                "--structure",
                structure.to_str().unwrap(),
                "--ranks",
                ranks,
                "--json",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let e = v["energy"][0].as_f64().unwrap();
        assert!((e - e_ref).abs() < 1e-10, "{ranks} ranks: E {e} vs {e_ref}");
        let f = flat(&v["forces"]);
        assert_eq!(f.len(), f_ref.len());
        let worst = f
            .iter()
            .zip(&f_ref)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 1e-10, "{ranks} ranks: forces off by {worst} eV/Å");
    }
}
