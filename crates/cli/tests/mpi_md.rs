//! `ddmlip md --backend mpi` as a real 3-process job under `mpirun`,
//! compared with the same job on 3 thread ranks of one process.
#![cfg(feature = "mpi")]

use ddmlip_testkit::cli::{argon_fcc, momenta, require_mpirun};
use std::path::Path;
use std::process::Command;

/// 108 argon atoms (FCC 3×3×3, a = 5.3 Å, rattled) written to `path`.
fn argon(path: &Path) {
    ddmlip_atoms::extxyz::write_file(path, &[argon_fcc(3, 0.1, false)]).unwrap();
}

#[test]
fn mpi_md_equals_thread_ranks() {
    require_mpirun();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    argon(&st);
    let (a, b, ck) = (
        dir.path().join("mpi.xyz"),
        dir.path().join("thr.xyz"),
        dir.path().join("mpi.ck"),
    );
    let args = |out: &Path| -> Vec<String> {
        [
            "md",
            "--model",
            "lj",
            "--structure",
            st.to_str().unwrap(),
            "--ensemble",
            "langevin",
            "--temperature",
            "500",
            "--init-temperature",
            "500",
            "--seed",
            "4",
            "--dt",
            "2",
            "--steps",
            "60",
            "--skin",
            "0.3",
            "--output",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_ddmlip"))
        .args(args(&a))
        .args(["--backend", "mpi", "--checkpoint", ck.to_str().unwrap()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(ck.exists(), "rank 0 wrote no checkpoint");
    let o = Command::new(env!("CARGO_BIN_EXE_ddmlip"))
        .args(args(&b))
        .args(["--ranks", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (x, y) = (
        ddmlip_atoms::extxyz::read_file(&a).unwrap().remove(0),
        ddmlip_atoms::extxyz::read_file(&b).unwrap().remove(0),
    );
    // Same partition and ops; thread ranks may split a gradient into pieces
    // that MPI sums in one pass, so the two agree to rounding.
    let dx = x
        .positions
        .iter()
        .zip(&y.positions)
        .flat_map(|(p, q)| (0..3).map(move |k| (p[k] - q[k]).abs()))
        .fold(0.0, f64::max);
    assert!(dx < 1e-9, "MPI and threads differ by {dx:e} Å");
    let dp = momenta(&x)
        .iter()
        .zip(momenta(&y))
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    assert!(dp < 1e-9, "momenta differ by {dp:e}");
}
