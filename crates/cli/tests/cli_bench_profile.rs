//! `ddmlip bench model --profile`: the op-time table (and `profile` in
//! `--json`) for a built-in model and an imported NequIP archive, on one
//! and two ranks; its total lies within the measured step time and it
//! names ops each model is known to use; without the flag there is none.

use ddmlip_testkit::cli::write_replicated_xyz;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn bench(args: &[&str]) -> (String, String) {
    let out = Command::new(BIN)
        .args(["bench", "model", "--repeats", "2", "--threads", "1"])
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The record's profile: ops known to appear, and a total (forward +
/// backward, per evaluation, summed over ranks) that is positive and at most
/// the ranks' share of the median step (it times parts of the step).
fn check_profile(record: &Value, known: &[&str]) {
    let p = &record["profile"];
    let ranks = record["ranks"].as_f64().unwrap();
    let median = record["median_s"].as_f64().unwrap();
    let mut total = 0.0;
    for phase in ["forward", "backward"] {
        let list = p[phase].as_array().unwrap();
        for op in known {
            assert!(
                list.iter().any(|t| t["op"] == *op),
                "no {phase} `{op}` in {p}"
            );
        }
        for t in list {
            assert!(t["calls"].as_u64().unwrap() >= 1, "{t}");
            total += t["seconds"].as_f64().unwrap();
        }
    }
    assert!(total > 0.0, "{p}");
    // Each rank's profiled time is within its own step; 10 % slack for the
    // mean of per-step profiles against the median step.
    assert!(
        total <= 1.1 * ranks * median,
        "{total} s against {median} s × {ranks}"
    );
}

#[test]
fn profile_of_lj_on_one_and_two_ranks() {
    let (json, _) = bench(&[
        "--model",
        "lj",
        "--repeat",
        "4",
        "--ranks",
        "1,2",
        "--profile",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let records = v["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    for r in records {
        check_profile(r, &["pair_sum:lj_pair"]);
    }
}

/// The NequIP reference's periodic 32-atom H/C/O cell replicated 2×2×2.
fn hco256(dir: &Path) -> PathBuf {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pt2/tests/data");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("nequip_reference.json")).unwrap())
            .unwrap();
    let s = &reference["models"]["nequip"]["results"][0];
    assert_eq!(s["name"], "fcc_periodic_32");
    let row = |v: &Value| [0, 1, 2].map(|d| v[d].as_f64().unwrap());
    let cell = [0, 1, 2].map(|k| row(&s["cell"][k]));
    let positions: Vec<[f64; 3]> = s["positions"].as_array().unwrap().iter().map(row).collect();
    let names: Vec<&str> = (0..positions.len())
        .map(|k| ["H", "C", "O"][s["species"][k].as_u64().unwrap() as usize])
        .collect();
    let path = dir.join("hco256.xyz");
    write_replicated_xyz(&path, &cell, &positions, &names, [2, 2, 2]);
    path
}

#[test]
fn profile_table_of_imported_nequip() {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pt2/tests/data/nequip.pt2");
    let archive = archive.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let xyz = hco256(dir.path());
    let xyz = xyz.to_str().unwrap();
    let (table, _) = bench(&[
        "--model",
        archive,
        "--dtype",
        "f64",
        "--structure",
        xyz,
        "--profile",
    ]);
    assert!(table.contains("op times per evaluation"), "{table}");
    for line in [
        "forward  matmul",
        "backward matmul",
        "forward  scatter_add",
        "forward  silu",
    ] {
        assert!(table.contains(line), "no `{line}` in\n{table}");
    }
    let (json, _) = bench(&[
        "--model",
        archive,
        "--dtype",
        "f64",
        "--structure",
        xyz,
        "--profile",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&json).unwrap();
    check_profile(
        &v["records"][0],
        &["matmul", "scatter_add", "silu", "gather"],
    );
}

#[test]
fn no_profile_without_the_flag() {
    let (json, _) = bench(&["--model", "lj", "--repeat", "3", "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert!(v["records"][0].get("profile").is_none(), "{json}");
    let (table, _) = bench(&["--model", "lj", "--repeat", "3"]);
    assert!(!table.contains("op times"), "{table}");
}
