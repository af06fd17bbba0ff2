//! Helpers shared by the binary's integration tests: argument lists, the
//! `.pt2` test archives and the structures built from their references.
#![allow(dead_code)]

use ddmlip_testkit::cli::write_replicated_xyz;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `ddmlip md ARGS` to completion.
pub fn md(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ddmlip"))
        .arg("md")
        .args(args)
        .output()
        .unwrap()
}

/// `COMMAND --model MODEL --structure STRUCTURE` followed by `extra`: the
/// argument list of a run of one model on one structure file.
pub fn model_args<'a>(
    command: &'a str,
    model: &'a str,
    structure: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![command, "--model", model, "--structure", structure];
    args.extend_from_slice(extra);
    args
}

/// `validate --model MODEL --structure STRUCTURE --ranks 4 --spec PRIOR
/// --spec-out FIXED`: a 4-rank validation that starts from the spec file
/// `prior` and writes the spec that worked to `fixed`.
pub fn validate_from_prior<'a>(
    model: &'a str,
    structure: &'a str,
    prior: &'a Path,
    fixed: &'a Path,
) -> Vec<&'a str> {
    model_args(
        "validate",
        model,
        structure,
        &[
            "--ranks",
            "4",
            "--spec",
            prior.to_str().unwrap(),
            "--spec-out",
            fixed.to_str().unwrap(),
        ],
    )
}

/// The path of a `torch.export` test archive (or reference JSON) of the
/// `ddmlip-pt2` crate's test data.
pub fn pt2_archive(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pt2/tests/data")
        .join(name)
}

/// Writes the periodic `fcc_periodic_32` structure of `model`'s first result
/// in the reference JSON `reference` (a file of the pt2 test data), replicated
/// `reps` times along the cell vectors, to `dir/file_name`, and returns that
/// path. `symbols[k]` names species index `k`.
pub fn replicated_reference_structure(
    dir: &Path,
    reference: &str,
    model: &str,
    symbols: &[&str],
    file_name: &str,
    reps: [usize; 3],
) -> PathBuf {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(pt2_archive(reference)).unwrap()).unwrap();
    let s = &reference["models"][model]["results"][0];
    assert_eq!(s["name"], "fcc_periodic_32");
    let row = |v: &Value| [0, 1, 2].map(|d| v[d].as_f64().unwrap());
    let cell = [0, 1, 2].map(|k| row(&s["cell"][k]));
    let positions: Vec<[f64; 3]> = s["positions"].as_array().unwrap().iter().map(row).collect();
    let names: Vec<&str> = (0..positions.len())
        .map(|k| {
            let species = s["species"][k].as_u64().unwrap() as usize;
            assert!(species < symbols.len(), "species index {species} unnamed");
            symbols[species]
        })
        .collect();
    let path = dir.join(file_name);
    write_replicated_xyz(&path, &cell, &positions, &names, reps);
    path
}

/// Writes `dir/prior.json`: the standard energy-model spec with gather and
/// scatter both `local`, so ghost rows are never refreshed (a wrong prior
/// for any message-passing model), and returns its path.
pub fn wrong_local_prior(dir: &Path) -> PathBuf {
    let mut spec: Value =
        serde_json::from_str(&ddmlip_spec::MLIPSpec::standard_energy_model().to_json()).unwrap();
    spec["policy"]["gather"] = Value::from("local");
    spec["policy"]["scatter"] = Value::from("local");
    let prior = dir.join("prior.json");
    std::fs::write(&prior, spec.to_string()).unwrap();
    prior
}
