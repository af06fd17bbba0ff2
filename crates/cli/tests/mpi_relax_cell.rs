//! `ddmlip relax --cell --backend mpi` as a real 3-process job under
//! `mpirun`, compared with the same relaxation on 3 thread ranks.
#![cfg(feature = "mpi")]

mod argon;

use std::process::Command;

#[test]
fn mpi_relax_cell_equals_thread_ranks() {
    if !ddmlip_testkit::mpirun_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    // Strained orthorhombic: every diagonal cell row has work to do.
    argon::write_fcc(&st, [5.4, 5.25, 5.3], 0.08, true);
    let args = [
        "relax",
        "--model",
        "lj",
        "--structure",
        st.to_str().unwrap(),
        "--cell",
        "--pressure",
        "0.1",
        "--fmax",
        "1e-4",
        "--json",
    ];
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_ddmlip"))
        .args(args)
        .args(["--backend", "mpi"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Only rank 0 reports.
    let mpi: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ddmlip"))
        .args(args)
        .args(["--ranks", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let threads: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(mpi["converged"], true);
    assert_eq!(mpi["ranks"], 3);
    assert_eq!(mpi["steps"], threads["steps"]);
    let (e1, e2) = (
        mpi["energy"].as_f64().unwrap(),
        threads["energy"].as_f64().unwrap(),
    );
    assert!((e1 - e2).abs() < 1e-10 * e1.abs(), "MPI {e1}, threads {e2}");
    let h = |v: &serde_json::Value| -> Vec<f64> {
        serde_json::from_value::<[[f64; 3]; 3]>(v["cell"].clone())
            .unwrap()
            .iter()
            .flatten()
            .copied()
            .collect()
    };
    let dh = h(&mpi)
        .iter()
        .zip(h(&threads))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(dh < 1e-9, "MPI and threads cells differ by {dh:e} Å");
}
