//! MPI backend: runs the `mpi_selftest` example under `mpirun`.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ddmlip_testkit::mpirun_available;

/// Path of the example binary, built on demand with the same profile.
fn selftest_binary() -> PathBuf {
    // Test binaries live in <target>/<profile>/deps; examples in
    // <target>/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let binary = profile_dir.join("examples").join("mpi_selftest");
    // `cargo test --features mpi` builds examples itself; only a filtered run
    // (e.g. `--test mpi`) needs the extra build.
    if binary.exists() {
        return binary;
    }
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "ddmlip-comm",
            "--features",
            "mpi",
            "--example",
            "mpi_selftest",
        ])
        .args(if profile_dir.ends_with("release") {
            &["--release"][..]
        } else {
            &[][..]
        })
        .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "building the selftest example failed");
    assert!(binary.exists(), "{} missing", binary.display());
    binary
}

fn mpirun(n: usize, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let output = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            &n.to_string(),
        ])
        .arg(selftest_binary())
        .args(args)
        .output()
        .unwrap();
    (output, start.elapsed())
}

#[test]
fn selftest_passes_on_2_and_4_ranks() {
    if !mpirun_available() {
        return;
    }
    for n in [2, 4] {
        let (output, _) = mpirun(n, &[]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "n={n}: status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            output.status
        );
        assert!(
            stdout.contains(&format!("mpi selftest ok size={n}")),
            "n={n}: stdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
}

#[test]
fn aborting_rank_ends_the_job_with_its_message() {
    if !mpirun_available() {
        return;
    }
    // Build first so the timing below measures only the job.
    selftest_binary();
    let (output, elapsed) = mpirun(3, &["abort", "1"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "job must fail; stderr:\n{stderr}");
    assert!(
        stderr.contains("rank 1: deliberate failure on rank 1"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("unexpectedly returned"),
        "a waiting rank outlived the abort; stderr:\n{stderr}"
    );
    // Startup under an oversubscribed mpirun takes a few seconds; the waiting
    // ranks' own deadline is 120 s, so this bound proves the abort ended them.
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
}
