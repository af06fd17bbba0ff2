//! The progress bar of `md` and `relax` is drawn only on a terminal: a
//! piped run (as here) writes nothing to stderr, and its stdout is the
//! summary alone.

use ddmlip_atoms::{Cell, System};
use std::path::Path;
use std::process::Command;

fn argon(path: &Path) {
    let basis = [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
    ];
    let mut pos = Vec::new();
    for i in 0..2 {
        for j in 0..2 {
            for l in 0..2 {
                for (k, b) in basis.iter().enumerate() {
                    let wobble = 0.04 * ((i * 7 + j * 3 + l + k) as f64).sin();
                    pos.push([
                        (i as f64 + b[0]) * 5.3 + wobble,
                        (j as f64 + b[1]) * 5.3 - wobble,
                        (l as f64 + b[2]) * 5.3 + 0.5 * wobble,
                    ]);
                }
            }
        }
    }
    let sys = System::new(
        pos,
        vec![18; 32],
        Some(Cell::orthorhombic(10.6, 10.6, 10.6)),
        [true; 3],
    );
    ddmlip_atoms::extxyz::write_file(path, &[sys]).unwrap();
}

#[test]
fn piped_md_and_relax_draw_no_progress_bar() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    argon(&st);
    let st = st.to_str().unwrap();
    let runs: [&[&str]; 2] = [
        &[
            "md",
            "--model",
            "lj",
            "--structure",
            st,
            "--ensemble",
            "nve",
            "--dt",
            "2",
            "--steps",
            "30",
            "--json",
        ],
        &[
            "relax",
            "--model",
            "lj",
            "--structure",
            st,
            "--cell",
            "--fmax",
            "1e-3",
            "--json",
        ],
    ];
    for args in runs {
        let o = Command::new(env!("CARGO_BIN_EXE_ddmlip"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            o.stderr.is_empty(),
            "{args:?} wrote to a piped stderr: {:?}",
            String::from_utf8_lossy(&o.stderr)
        );
        // stdout is exactly one JSON object.
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v.is_object());
    }
}
