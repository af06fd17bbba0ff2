//! `--device cuda` with a SevenNet checkpoint that does not exist: named
//! as such. The refusal without a usable GPU is in `cli_device.rs`, with
//! the other models'; the GPU itself is covered by `scripts/gpu-check.sh`.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_sevennet_checkpoint_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere.pth");
    let (code, err) = run(&[
        "eval",
        "--model",
        missing.to_str().unwrap(),
        "--structure",
        "unused.xyz",
        "--device",
        "cuda",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("nowhere.pth") && err.contains("no such file"),
        "{err}"
    );
}
