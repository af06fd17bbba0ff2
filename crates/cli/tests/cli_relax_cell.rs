//! `ddmlip relax --cell [--pressure GPA]` through the real binary: the
//! written structure carries the relaxed cell and a stress of −pressure,
//! split runs report what one rank reports, and bad flags exit 2 naming the
//! flag.

mod argon;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// 32 argon atoms (FCC 2×2×2 at a = 5.2 Å, rattled), periodic or a cluster.
fn argon(dir: &Path, periodic: bool) -> PathBuf {
    let path = dir.join(if periodic { "ar.xyz" } else { "ar_cluster.xyz" });
    argon::write_fcc(&path, [5.2; 3], 0.05, periodic);
    path
}

fn relax(args: &[&str]) -> Output {
    Command::new(BIN).arg("relax").args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn relax_cell_writes_the_relaxed_cell_with_stress_at_minus_the_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), true);
    let out = dir.path().join("relaxed.xyz");
    let fmax = 1e-4;
    let pressure = 0.2;
    let mut summaries = Vec::new();
    for ranks in ["1", "2"] {
        let o = relax(&[
            "--model",
            "lj",
            "--structure",
            s(&st),
            "--cell",
            "--pressure",
            "0.2",
            "--fmax",
            "1e-4",
            "--ranks",
            ranks,
            "--output",
            s(&out),
            "--json",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["converged"], true);
        summaries.push(v);
    }
    let (one, two) = (&summaries[0], &summaries[1]);
    assert_eq!(one["steps"], two["steps"]);
    let (e1, e2) = (
        one["energy"].as_f64().unwrap(),
        two["energy"].as_f64().unwrap(),
    );
    assert!(
        (e1 - e2).abs() < 1e-10 * e1.abs(),
        "1 rank {e1}, 2 ranks {e2}"
    );
    // The file holds the relaxed cell (to the text format's rounding) and
    // its stress.
    let relaxed = ddmlip_atoms::extxyz::read_file(&out).unwrap().remove(0);
    let cell = relaxed.cell.unwrap();
    let json_cell: [[f64; 3]; 3] = serde_json::from_value(two["cell"].clone()).unwrap();
    for (x, y) in cell.matrix.iter().flatten().zip(json_cell.iter().flatten()) {
        assert!((x - y).abs() < 1e-12, "{:?} vs {json_cell:?}", cell.matrix);
    }
    let v0 = 10.4f64.powi(3);
    assert!(
        (cell.volume() - v0).abs() > 1.0,
        "the cell did not move: V = {}",
        cell.volume()
    );
    let stress = relaxed.stress_voigt().unwrap();
    // Each generalized cell row is below fmax: |σ + P·I| ≤ N·fmax·‖F‖/V,
    // with ‖F‖ ≤ √3·(largest length ratio) for this near-cubic cell.
    let ratio = cell.length(0).max(cell.length(1)).max(cell.length(2)) / 10.4;
    let bound = 32.0 * fmax * 3f64.sqrt() * ratio / cell.volume();
    let p = pressure * 0.006_241_509_074_460_763; // GPa → eV/Å³
    for (k, target) in [-p, -p, -p, 0.0, 0.0, 0.0].into_iter().enumerate() {
        assert!(
            (stress[k] - target).abs() <= bound,
            "stress[{k}] = {} vs {target} (bound {bound:e})",
            stress[k]
        );
    }
    let text = relax(&[
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--cell",
        "--fmax",
        "1e-3",
    ]);
    assert!(text.status.success());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("UnitCellFilter") && stdout.contains("P = "),
        "{stdout}"
    );
}

#[test]
fn relax_cell_bad_flags_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let periodic = argon(dir.path(), true);
    let cluster = argon(dir.path(), false);
    let cases: [(&[&str], &Path, &str); 4] = [
        (&["--pressure", "1"], &periodic, "--pressure"),
        (&["--cell"], &cluster, "--cell"),
        (&["--cell", "--pressure", "nan"], &periodic, "--pressure"),
        (&["--cell", "--pressure", "inf"], &periodic, "--pressure"),
    ];
    for (flags, structure, named) in cases {
        let o = relax(
            &["--model", "lj", "--structure", s(structure)]
                .iter()
                .chain(flags)
                .copied()
                .collect::<Vec<_>>(),
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
        assert!(o.stdout.is_empty(), "{flags:?}");
    }
}
