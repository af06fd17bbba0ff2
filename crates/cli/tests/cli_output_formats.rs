//! `eval --output` in every written format, through the real binary, read
//! back with ASE: extended XYZ (also gzip) carries the results; a POSCAR and
//! a LAMMPS data file (also gzip) carry the structure of a one-frame input;
//! a one-frame format given a batch is refused (exit 2) before computing;
//! every written file is read again as `--structure`.

mod common;

use common::model_args;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn run(args: &[&str]) -> (i32, String, String) {
    ddmlip_testkit::cli::run_binary(BIN, args)
}

fn python(script: &str, dir: &Path) -> Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3 with ASE");
    assert!(
        out.status.success(),
        "python/ASE failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A rattled primitive (triclinic) Cu crystal, one frame, and a two-frame
/// batch of it.
const WRITE_INPUTS: &str = r#"
import sys, json
from ase.build import bulk
from ase.io import write
d = sys.argv[1]
a = bulk("Cu", "fcc", a=3.615).repeat((3, 3, 3))
a.rattle(0.05, seed=3)
write(d + "/one.xyz", a)
write(d + "/two.xyz", [a, a])
from ase.io import read
a = read(d + "/one.xyz")  # what the binary reads: the printed digits
print(json.dumps(dict(cellpar=a.cell.cellpar().tolist(), numbers=a.numbers.tolist(),
                      positions=a.positions.tolist(), cell=a.cell.tolist(),
                      distances=a.get_all_distances().ravel().tolist())))
"#;

/// What ASE reads back from each written file.
const READ_OUTPUTS: &str = r#"
import sys, json
from ase.io import read
d = sys.argv[1]
out = {}
for name, kw in [("out.vasp", dict(format="vasp")),
                 ("out.data", dict(format="lammps-data", atom_style="atomic")),
                 ("data.out.gz", dict(format="lammps-data", atom_style="atomic")),
                 ("out.xyz.gz", dict())]:
    a = read(d + "/" + name, **kw)
    r = dict(cellpar=a.cell.cellpar().tolist(), numbers=a.numbers.tolist(),
             positions=a.positions.tolist(), cell=a.cell.tolist(),
             distances=a.get_all_distances().ravel().tolist())
    if a.calc is not None:
        r["energy"] = a.get_potential_energy()
        r["forces"] = a.get_forces().tolist()
    out[name] = r
print(json.dumps(out))
"#;

fn floats(v: &Value) -> Vec<f64> {
    fn walk(v: &Value, out: &mut Vec<f64>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Number(n) => out.push(n.as_f64().unwrap()),
            _ => panic!("not a number: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

fn assert_close(what: &str, got: &Value, want: &Value, tol: f64) {
    let (g, w) = (floats(got), floats(want));
    assert_eq!(g.len(), w.len(), "{what}");
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}: {a} vs {b}");
    }
}

#[test]
fn eval_output_formats_read_back_in_ase() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = python(WRITE_INPUTS, d);
    let one = d.join("one.xyz");
    let mut energy = None;
    for name in ["out.vasp", "out.data", "data.out.gz", "out.xyz.gz"] {
        let out = d.join(name);
        let (code, stdout, stderr) = run(&model_args(
            "eval",
            "lj",
            one.to_str().unwrap(),
            &["--output", out.to_str().unwrap(), "--json"],
        ));
        assert_eq!(code, 0, "{name}: {stderr}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        energy = Some((
            report["frames"][0]["energy"].clone(),
            report["forces"].clone(),
        ));
    }
    let (energy, forces) = energy.unwrap();
    let back = python(READ_OUTPUTS, d);
    for name in ["out.vasp", "out.data", "data.out.gz", "out.xyz.gz"] {
        let b = &back[name];
        assert_eq!(b["numbers"], input["numbers"], "{name} species");
        // LAMMPS data rotates the cell into its lower-triangular form:
        // lengths, angles and distances are what stays.
        assert_close(
            &format!("{name} cell"),
            &b["cellpar"],
            &input["cellpar"],
            1e-10,
        );
        assert_close(
            &format!("{name} distances"),
            &b["distances"],
            &input["distances"],
            1e-10,
        );
        if !name.contains("data") {
            assert_close(
                &format!("{name} positions"),
                &b["positions"],
                &input["positions"],
                1e-12,
            );
            assert_close(
                &format!("{name} lattice"),
                &b["cell"],
                &input["cell"],
                1e-12,
            );
        }
    }
    // Extended XYZ carries the results; the other formats cannot.
    assert_close("energy", &back["out.xyz.gz"]["energy"], &energy, 1e-12);
    assert_close("forces", &back["out.xyz.gz"]["forces"], &forces, 1e-12);
    for name in ["out.vasp", "out.data", "data.out.gz"] {
        assert!(back[name].get("energy").is_none(), "{name}");
    }
    // Each written file is an input again (gzip and one-frame formats are
    // read too): the energy of the rotated / reprinted structure agrees.
    for name in ["out.vasp", "out.data", "data.out.gz", "out.xyz.gz"] {
        let (code, stdout, stderr) = run(&model_args(
            "eval",
            "lj",
            d.join(name).to_str().unwrap(),
            &["--json"],
        ));
        assert_eq!(code, 0, "{name}: {stderr}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        assert_close(
            &format!("{name} as input: energy"),
            &report["frames"][0]["energy"],
            &energy,
            1e-9,
        );
    }
}

#[test]
fn one_frame_formats_refuse_a_batch_before_computing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python(WRITE_INPUTS, d);
    for name in ["out.vasp", "out.lmp", "POSCAR.gz"] {
        let out = d.join(name);
        let (code, _, stderr) = run(&model_args(
            "eval",
            "lj",
            d.join("two.xyz").to_str().unwrap(),
            &["--output", out.to_str().unwrap()],
        ));
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(
            stderr.contains("holds one frame") && stderr.contains("two.xyz"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!out.exists(), "{name} was created");
    }
    // A batch written as extended XYZ is fine.
    let out = d.join("two.out.xyz");
    let (code, _, stderr) = run(&model_args(
        "eval",
        "lj",
        d.join("two.xyz").to_str().unwrap(),
        &["--output", out.to_str().unwrap()],
    ));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ddmlip_atoms::read_structure(&out).unwrap().len(), 2);
}
