//! What `eval` and `validate` promise about their results through the real
//! binary: `--output` replaces every calculator result (checked by reading
//! back with ASE), is checked before computing and may be stdout; a batch is
//! evaluated frame by frame with per-frame JSON beside the batch-shaped
//! top level; `--spec` warns about specs never validated for the model;
//! overflowing models are refused; `validate --dtype f32` uses f32
//! tolerances; messages name the file.

mod common;

use common::{model_args, validate_from_prior};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn examples(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    ddmlip_testkit::cli::run_binary(BIN, args)
}

fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 with ASE");
    assert!(
        out.status.success(),
        "python/ASE failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// ASE saves a Cu crystal and a non-periodic cluster after a Lennard-Jones
/// calculation, with every result it has, `free_energy` made different.
const WRITE_STALE: &str = r#"
import sys, ase.io
from ase import Atoms
from ase.build import bulk
from ase.calculators.lj import LennardJones
frames = []
for k in range(3):
    a = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 3))
    a.rattle(0.05, seed=k)
    if k == 2:
        a = Atoms(a.get_chemical_symbols()[:32], positions=a.positions[:32])
    a.calc = LennardJones(sigma=2.3, epsilon=0.1, rc=5.0)
    a.get_potential_energy()
    a.calc.results["free_energy"] = a.calc.results["energy"] - 0.25
    frames.append(a)
ase.io.write(sys.argv[1], frames, format="extxyz")
"#;

const READ_BACK: &str = r#"
import sys, json, ase.io
out = []
for a in ase.io.read(sys.argv[1], index=":"):
    out.append({"energy": a.get_potential_energy(force_consistent=True),
                "plain": a.get_potential_energy(),
                "energies": a.get_potential_energies().tolist(),
                "keys": sorted(a.calc.results)})
print(json.dumps(out))
"#;

fn f64s(v: &Value) -> Vec<f64> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn output_replaces_every_stale_result_and_frames_stream_into_json() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("stale.xyz");
    python(WRITE_STALE, &[input.to_str().unwrap()]);
    let out = dir.path().join("out.xyz");
    let (code, stdout, stderr) = run(&model_args(
        "eval",
        "lj",
        input.to_str().unwrap(),
        &["--output", out.to_str().unwrap(), "--json"],
    ));
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    // Per-frame objects beside the batch-shaped top level (DESIGN.md §6).
    assert_eq!(v["model"], "lj");
    assert_eq!(v["units"]["energy"], "eV");
    let frames = v["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 3);
    let energy = f64s(&v["energy"]);
    let atomic = f64s(&v["atomic_energies"]);
    let forces: Vec<[f64; 3]> = serde_json::from_value(v["forces"].clone()).unwrap();
    assert_eq!(forces.len(), 108 + 108 + 32);
    assert_eq!(v["stress"].as_array().unwrap().len(), 3);
    assert!(v["stress"][2].is_null());
    let mut offset = 0;
    for (k, f) in frames.iter().enumerate() {
        let n = f["atoms"].as_u64().unwrap() as usize;
        assert_eq!(f["energy"].as_f64(), Some(energy[k]));
        let ff: Vec<[f64; 3]> = serde_json::from_value(f["forces"].clone()).unwrap();
        assert_eq!(ff, forces[offset..offset + n]);
        assert_eq!(f64s(&f["atomic_energies"]), atomic[offset..offset + n]);
        offset += n;
    }
    assert!(frames[2]["stress"].is_null());
    assert!(frames[2]["stress_null_reason"]
        .as_str()
        .unwrap()
        .contains("not periodic"));
    assert_eq!(frames[0]["stress"], v["stress"][0]);
    // ASE reads back the new results only: force-consistent energy is the
    // new energy, per-atom energies are the new ones, no stale stresses.
    let back: Vec<Value> =
        serde_json::from_str(&python(READ_BACK, &[out.to_str().unwrap()])).unwrap();
    let mut offset = 0;
    for (k, b) in back.iter().enumerate() {
        assert_eq!(b["energy"].as_f64(), Some(energy[k]), "frame {k}");
        assert_eq!(b["plain"].as_f64(), Some(energy[k]), "frame {k}");
        let e = f64s(&b["energies"]);
        assert_eq!(e, atomic[offset..offset + e.len()], "frame {k}");
        offset += e.len();
        let keys: Vec<String> = serde_json::from_value(b["keys"].clone()).unwrap();
        assert!(
            !keys.contains(&"stresses".to_string()),
            "frame {k}: {keys:?}"
        );
    }
}

#[test]
fn output_is_checked_before_computing_and_dash_is_stdout() {
    let cu = examples("cu864.xyz");
    let (code, stdout, stderr) = run(&model_args(
        "eval",
        "lj",
        cu.to_str().unwrap(),
        &["--output", "no-such-folder/out.xyz"],
    ));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("no-such-folder/out.xyz"), "{stderr}");
    assert!(stdout.is_empty(), "nothing was computed: {stdout}");
    let pair = examples("pair.xyz");
    let (code, stdout, stderr) = run(&model_args(
        "eval",
        "lj",
        pair.to_str().unwrap(),
        &["--output", "-"],
    ));
    assert_eq!(code, 0, "{stderr}");
    // The structure owns stdout; the summary went to stderr.
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("2"));
    assert!(lines.next().unwrap().contains("energy="), "{stdout}");
    assert!(stderr.contains("frame 0: 2 atoms"), "{stderr}");
}

#[test]
fn a_spec_never_validated_for_the_model_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let cu = examples("cu864.xyz");
    let prior = examples("prior.json");
    let eval = |model: &str, spec: &Path| {
        run(&model_args(
            "eval",
            model,
            cu.to_str().unwrap(),
            &["--ranks", "4", "--spec", spec.to_str().unwrap()],
        ))
    };
    let (code, _, stderr) = eval("rebuild-demo", &prior);
    assert_eq!(code, 0);
    assert!(stderr.contains("never validated"), "{stderr}");
    assert!(
        stderr.contains("ddmlip validate --model rebuild-demo"),
        "{stderr}"
    );
    let fixed = dir.path().join("fixed.json");
    let (code, stdout, stderr) = run(&validate_from_prior(
        "rebuild-demo",
        cu.to_str().unwrap(),
        &prior,
        &fixed,
    ));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&fixed).unwrap()).unwrap();
    assert_eq!(saved["validated"]["model"], "rebuild-demo");
    assert_eq!(saved["validated"]["ranks"], 4);
    assert_eq!(saved["validated"]["passed"], true);
    let (code, _, stderr) = eval("rebuild-demo", &fixed);
    assert_eq!(code, 0);
    assert!(!stderr.contains("warning"), "{stderr}");
    let (_, _, stderr) = eval("eam-demo", &fixed);
    assert!(
        stderr.contains("validated for model `rebuild-demo`"),
        "{stderr}"
    );
}

#[test]
fn overflowing_model_parameters_are_refused_not_printed_as_nan() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("big.toml");
    std::fs::write(
        &toml,
        "kind = \"lennard-jones\"\nepsilon = 1e308\nsigma = 3.4\ncutoff = 10.2\n",
    )
    .unwrap();
    let pair = examples("pair.xyz");
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec![
            "eval",
            "--model",
            toml.to_str().unwrap(),
            "--structure",
            pair.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(
            stderr.contains("epsilon") && stderr.contains("overflows"),
            "{stderr}"
        );
    }
}

#[test]
fn validate_dtype_f32_uses_f32_tolerances() {
    let cu = examples("cu864.xyz");
    let (code, stdout, stderr) = run(&model_args(
        "validate",
        "eam-demo",
        cu.to_str().unwrap(),
        &["--ranks", "2", "--dtype", "f32", "--json"],
    ));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["dtype"], "f32");
    assert_eq!(
        (v["atol"].as_f64(), v["rtol"].as_f64()),
        (Some(1e-4), Some(1e-5))
    );
    assert_eq!(v["spec"]["validated"]["dtype"], "f32");
    assert_eq!(v["attempts"][0]["passed"], true);
}

#[test]
fn messages_name_the_file_and_negative_numbers_reach_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.xyz");
    std::fs::write(
        &zero,
        "2\nLattice=\"5 0 0 0 5 0 0 0 0\" pbc=\"T T T\"\nAr 0 0 0\nAr 1 1 1\n",
    )
    .unwrap();
    for cmd in ["eval", "validate"] {
        let (code, _, stderr) = run(&[cmd, "--model", "lj", "--structure", zero.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("zero.xyz: frame 0: lattice vector 2"),
            "{cmd}: {stderr}"
        );
    }
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"version\": 1,").unwrap();
    let pair = examples("pair.xyz");
    let (code, _, stderr) = run(&model_args(
        "validate",
        "lj",
        pair.to_str().unwrap(),
        &["--spec", bad.to_str().unwrap()],
    ));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("bad.json") && stderr.contains("not valid JSON"),
        "{stderr}"
    );
    // `--cutoff -1` reaches the check that explains it, not the parser.
    for cmd in [
        &[
            "neighbors",
            "--structure",
            pair.to_str().unwrap(),
            "--cutoff",
            "-1",
        ][..],
        &[
            "partition",
            "--structure",
            pair.to_str().unwrap(),
            "--ranks",
            "2",
            "--cutoff",
            "-1",
        ][..],
    ] {
        let (code, _, stderr) = run(cmd);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("cutoff") && stderr.contains("-1"),
            "{stderr}"
        );
        assert!(!stderr.contains("unexpected argument"), "{stderr}");
    }
}

/// Atoms closer than the minimum distance are bad input on any rank count,
/// whichever rank finds them (not a failed rank, exit 1, on split runs).
#[test]
fn close_atoms_are_bad_input_on_every_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(examples("cu864.xyz")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // Put the last atom 5e-7 Å from the one before it (far from rank 0's
    // domain: atoms are written in order of increasing x).
    let prev: Vec<f64> = lines[lines.len() - 2]
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let n = lines.len();
    lines[n - 1] = format!("Cu {} {} {}", prev[0] + 5e-7, prev[1], prev[2]);
    let close = dir.path().join("close.xyz");
    std::fs::write(&close, lines.join("\n") + "\n").unwrap();
    for ranks in ["1", "2", "3", "4"] {
        let (code, stdout, stderr) = run(&model_args(
            "eval",
            "lj",
            close.to_str().unwrap(),
            &["--ranks", ranks],
        ));
        assert_eq!(code, 2, "--ranks {ranks}: {stdout}{stderr}");
        assert!(
            stderr.contains("atoms 862 and 863") && stderr.contains("apart"),
            "--ranks {ranks}: {stderr}"
        );
    }
}

/// `--structure -` reads stdin; an energy far outside any physical range
/// (atoms much closer than the model was made for) comes with a warning.
#[test]
fn stdin_input_and_absurd_energies_are_warned_about() {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["eval", "--model", "lj", "--structure", "-", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Two argon atoms 0.5 Å apart: lj's σ is 3.4 Å.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"2\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr 0.5 0 0\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = v["energy"][0].as_f64().unwrap();
    // 4ε[(σ/r)¹² − (σ/r)⁶] for one pair, shifted by its value at the cutoff.
    let pair = |r: f64| {
        let s6 = (3.4f64 / r).powi(6);
        4.0 * 0.0104 * (s6 * s6 - s6)
    };
    let want = pair(0.5) - pair(10.2);
    assert!((e - want).abs() <= 1e-12 * want.abs(), "{e} vs {want}");
    assert!(
        stderr.contains("far outside any physical range"),
        "{stderr}"
    );
}
