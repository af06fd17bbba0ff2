//! Extreme geometry through the real binary: coordinates and cells far
//! outside the physical range, and requests that cannot fit in memory, exit
//! with status 2 and a message naming the value or the size, quickly; cells
//! with many images within the cutoff work.

mod common;

use common::model_args;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// Runs the binary; fails the test when it takes more than 30 s (a hang).
fn run(args: &[&str]) -> (i32, String, String) {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("`ddmlip {}` did not finish within 30 s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// ASE's `bulk("Ar", "fcc", a=5.26)`: one atom in the primitive FCC cell,
/// whose 3.72 Å nearest-neighbour distance puts many images in a cutoff.
const ARGON_PRIMITIVE: &str = "1\nLattice=\"0 2.63 2.63 2.63 0 2.63 2.63 2.63 0\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\n";

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn two_atoms(lattice: &str, pbc: &str, second: &str) -> String {
    format!(
        "2\nLattice=\"{lattice}\" Properties=species:S:1:pos:R:3 pbc=\"{pbc}\"\nAr 0 0 5\nAr {second}\n"
    )
}

fn assert_bad_input(args: &[&str], needle: &str) {
    let (code, _, stderr) = run(args);
    assert_eq!(code, 2, "`{}`: {stderr}", args.join(" "));
    assert!(stderr.contains(needle), "`{}`: {stderr}", args.join(" "));
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn coordinates_and_cells_out_of_range_exit_2_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            two_atoms("5 0 0 0 5 0 0 0 10", "T T F", "1 1 1e308"),
            "1e308",
        ),
        (
            two_atoms("5 0 0 0 5 0 0 0 10", "T T F", "1 1 9223372036854775807"),
            "9.223372036854776e18",
        ),
        (two_atoms("1e30 0 0 0 5 0 0 0 5", "T T T", "1 1 1"), "1e30"),
    ];
    for (k, (text, value)) in cases.iter().enumerate() {
        let path = write(&dir, &format!("case{k}.xyz"), text);
        let p = path.to_str().unwrap();
        assert_bad_input(&["neighbors", "--structure", p, "--cutoff", "5"], value);
        assert_bad_input(&model_args("eval", "lj", p, &[]), value);
        assert_bad_input(&model_args("eval", "lj", p, &["--ranks", "3"]), value);
        assert_bad_input(
            &[
                "partition",
                "--structure",
                p,
                "--ranks",
                "2",
                "--cutoff",
                "5",
            ],
            value,
        );
    }
}

#[test]
fn requests_that_cannot_fit_exit_2_with_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let argon = write(&dir, "ar.xyz", ARGON_PRIMITIVE);
    let ar = argon.to_str().unwrap();
    assert_bad_input(&["neighbors", "--structure", ar, "--cutoff", "20000"], "iB");
    assert_bad_input(
        &[
            "partition",
            "--structure",
            ar,
            "--ranks",
            "2",
            "--cutoff",
            "5000",
        ],
        "iB",
    );
    // A nearly flat cell: refused as too costly to search, naming the heights.
    let flat = write(
        &dir,
        "flat.xyz",
        &two_atoms("5 0 0 4.999 0.001 0 0 0 5", "T T T", "1 0 1"),
    );
    assert_bad_input(
        &[
            "neighbors",
            "--structure",
            flat.to_str().unwrap(),
            "--cutoff",
            "5",
        ],
        "niggli",
    );
}

#[test]
fn small_cells_with_many_images_work() {
    let dir = tempfile::tempdir().unwrap();
    // `partition --ranks 2 --cutoff 21` on this cell used to abort asking
    // for 4.3 GiB.
    let argon = write(&dir, "ar.xyz", ARGON_PRIMITIVE);
    let ar = argon.to_str().unwrap();
    let (code, stdout, stderr) = run(&[
        "partition",
        "--structure",
        ar,
        "--ranks",
        "2",
        "--cutoff",
        "21",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["n_ranks"], 2);
    // A 0.5 Å Si cell and a 5.01 Å neighbourhood: (2·10+1)³-ish images.
    let si = write(
        &dir,
        "si.xyz",
        "1\nLattice=\"0.5 0 0 0 0.5 0 0 0 0.5\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nSi 0.1 0.2 0.3\n",
    );
    let (code, stdout, stderr) = run(&[
        "neighbors",
        "--structure",
        si.to_str().unwrap(),
        "--cutoff",
        "5.01",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let expected = {
        let mut n = 0;
        for x in -11i64..=11 {
            for y in -11i64..=11 {
                for z in -11i64..=11 {
                    let d2 = (x * x + y * y + z * z) as f64 * 0.25;
                    if d2 > 0.0 && d2 < 5.01 * 5.01 {
                        n += 1;
                    }
                }
            }
        }
        n
    };
    assert_eq!(json["n_pairs"], expected, "{json}");
}
