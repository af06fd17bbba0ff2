//! The progress bar of `md` and `relax` is drawn only on a terminal: a
//! piped run (as here) writes nothing to stderr, and its stdout is the
//! summary alone.

mod argon;

use std::process::Command;

#[test]
fn piped_md_and_relax_draw_no_progress_bar() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    argon::write_fcc(&st, [5.3; 3], 0.04, true);
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
