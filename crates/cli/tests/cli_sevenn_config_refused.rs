//! A SevenNet checkpoint whose config asks for what ddmlip does not
//! implement, through the real binary: exit status 2, no panic, and a
//! message naming the file and the config key.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

#[test]
fn unimplemented_config_key_exits_2_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let src = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/tests/data/sevenn-train/sevenn_train_full.pth"
    ));
    // The config's `silu` (memoised once in the pickle, the radial MLP's
    // activation among its uses) becomes `relu`: valid for sevenn, not
    // implemented in ddmlip's radial MLP.
    let model = dir.path().join("relu_radial.pth");
    ddmlip_testkit::pth::patch_pickle(
        &src,
        b"X\x04\x00\x00\x00silu",
        b"X\x04\x00\x00\x00relu",
        &model,
    );
    let structure = dir.path().join("cu.xyz");
    std::fs::write(
        &structure,
        "2\nLattice=\"3.6 0 0 0 3.6 0 0 0 3.6\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n\
         Cu 0 0 0\nCu 1.8 1.8 0\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args([
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--structure",
            structure.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("relu_radial.pth") && err.contains("act_radial") && err.contains("relu"),
        "{err}"
    );
}
