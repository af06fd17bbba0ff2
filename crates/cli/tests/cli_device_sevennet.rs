//! `--device cuda` with SevenNet through the real binary on a machine
//! without a usable GPU (CI): exit status 2 with a message that says why,
//! and a missing checkpoint named as such. The GPU itself is covered by
//! `scripts/gpu-check.sh`.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn gpu_usable() -> bool {
    cfg!(feature = "cuda") && std::path::Path::new("/dev/nvidia0").exists()
}

#[test]
fn sevennet_on_cuda_without_a_usable_gpu_is_exit_2_saying_why() {
    if gpu_usable() {
        eprintln!("SKIPPED: this machine has a GPU; scripts/gpu-check.sh covers it");
        return;
    }
    ddmlip_testkit::sevennet_checkpoint();
    let dir = tempfile::tempdir().unwrap();
    let xyz = dir.path().join("si.xyz");
    std::fs::write(
        &xyz,
        "2\nLattice=\"5.43 0 0 0 5.43 0 0 0 5.43\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nSi 0 0 0\nSi 1.36 1.36 1.36\n",
    )
    .unwrap();
    let xyz = xyz.to_str().unwrap();
    for args in [
        vec![
            "eval",
            "--model",
            "sevennet-0",
            "--structure",
            xyz,
            "--device",
            "cuda",
        ],
        vec![
            "bench",
            "model",
            "--model",
            "sevennet-0",
            "--crystal",
            "si",
            "--repeat",
            "1",
            "--device",
            "cuda",
        ],
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let why = if cfg!(feature = "cuda") {
            "no CUDA driver library found"
        } else {
            "built without CUDA support"
        };
        assert!(
            err.contains(why) && err.contains("--device cpu"),
            "{args:?}: {err}"
        );
    }
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
