//! `ddmlip md --backend mpi` under `mpirun`: a step that reuses its pair
//! list makes one collective (from the summary's traffic counters), and
//! point-to-point migration gives the same final state as gathering every
//! position at each rebuild.
#![cfg(feature = "mpi")]

use ddmlip_testkit::cli::{argon_fcc, require_mpirun};
use std::path::Path;
use std::process::Command;

fn mpi_md(structure: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "4"])
        .arg(env!("CARGO_BIN_EXE_ddmlip"))
        .args(["md", "--model", "lj", "--structure"])
        .arg(structure)
        .args([
            "--ensemble",
            "langevin",
            "--temperature",
            "900",
            "--init-temperature",
            "900",
            "--seed",
            "8",
            "--dt",
            "2",
            "--steps",
            "80",
            "--skin",
            "0.3",
            "--backend",
            "mpi",
            "--json",
            "--output",
        ])
        .arg(out)
        .args(extra)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON summary ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

#[test]
fn mpi_md_makes_one_collective_per_plain_step() {
    require_mpirun();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    ddmlip_atoms::extxyz::write_file(&st, &[argon_fcc(3, 0.1, false)]).unwrap();
    let (a, b) = (dir.path().join("p2p.xyz"), dir.path().join("coll.xyz"));
    let p2p = mpi_md(&st, &a, &[]);
    let t = &p2p["traffic"];
    let plain = t["plain_steps"].as_u64().unwrap();
    let rebuilds = t["rebuild_steps"].as_u64().unwrap();
    assert_eq!(plain + rebuilds, 80, "{t}");
    assert!(plain > 40 && rebuilds > 0, "{t}");
    assert_eq!(t["plain_collectives"].as_u64().unwrap(), plain, "{t}");
    assert!(p2p["migrated"].as_u64().unwrap() > 0, "{p2p}");
    let coll = mpi_md(&st, &b, &["--migration", "collective"]);
    assert_eq!(coll["rebuilds"], p2p["rebuilds"]);
    let (x, y) = (
        ddmlip_atoms::extxyz::read_file(&a).unwrap().remove(0),
        ddmlip_atoms::extxyz::read_file(&b).unwrap().remove(0),
    );
    assert_eq!(
        x.positions, y.positions,
        "point to point differs from collective"
    );
}
