//! Bad input through the real binary: exit status 2, a message that names the
//! problem (and the file and line where there is one), and never a panic.

mod common;

use common::model_args;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// A good periodic structure, to isolate the one bad thing in each case.
const GOOD_XYZ: &str = "4\n\
Lattice=\"6.0 0.0 0.0 0.0 6.0 0.0 0.0 0.0 6.0\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n\
Ar 0.0 0.0 0.0\n\
Ar 3.0 3.0 0.0\n\
Ar 3.0 0.0 3.0\n\
Ar 0.0 3.0 3.0\n";

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn good(&self) -> PathBuf {
        self.file("good.xyz", GOOD_XYZ)
    }
}

/// Runs the binary and returns (status, stdout, stderr). A run that does not
/// finish within a minute is killed and fails the test: bad input must not hang.
fn run(args: &[&str]) -> (i32, String, String) {
    use std::io::Read;
    let mut child = Command::new(BIN)
        .args(args)
        // A panic would print its backtrace hint; make sure we would see it.
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("`ddmlip {}` did not finish within 60 s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Messages are short, well below a pipe buffer, so reading after exit is safe.
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code().unwrap_or(-1), stdout, stderr)
}

/// Asserts exit status 2, no panic, and that stderr contains every `needle`.
fn assert_bad_input(args: &[&str], needles: &[&str]) {
    let (status, _stdout, stderr) = run(args);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "`ddmlip {}` panicked:\n{stderr}",
        args.join(" ")
    );
    assert_eq!(
        status,
        2,
        "`ddmlip {}` should exit 2 (bad input), stderr:\n{stderr}",
        args.join(" ")
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "`ddmlip {}`: message should mention `{needle}`, got:\n{stderr}",
            args.join(" ")
        );
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn name(p: &Path) -> &str {
    p.file_name().unwrap().to_str().unwrap()
}

/// Every read path (eval, neighbors, partition) must reject a bad file the same way.
fn assert_all_commands_reject(path: &Path, needles: &[&str]) {
    assert_bad_input(&model_args("eval", "lj", s(path), &[]), needles);
    assert_bad_input(
        &["neighbors", "--structure", s(path), "--cutoff", "3.0"],
        needles,
    );
    assert_bad_input(
        &[
            "partition",
            "--structure",
            s(path),
            "--ranks",
            "2",
            "--cutoff",
            "3.0",
        ],
        needles,
    );
}

#[test]
fn atom_count_larger_than_atom_lines() {
    let c = Case::new();
    let p = c.file(
        "short.xyz",
        "3\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr 3 0 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 5", "atom count"]);
}

#[test]
fn atom_count_smaller_than_atom_lines() {
    let c = Case::new();
    let p = c.file(
        "long.xyz",
        "1\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr 3 0 0\n",
    );
    // The extra atom line is read as the next frame's count line.
    assert_all_commands_reject(&p, &[name(&p), "line 4", "count"]);
}

#[test]
fn non_numeric_column() {
    let c = Case::new();
    let p = c.file(
        "nonnum.xyz",
        "2\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr 3 abc 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 4", "abc"]);
}

#[test]
fn bad_lattice() {
    let c = Case::new();
    let p = c.file(
        "lattice.xyz",
        "2\nLattice=\"6 0 0 0 6\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 3 0 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 2", "Lattice"]);
    let p = c.file(
        "lattice_word.xyz",
        "2\nLattice=\"6 0 0 0 6 0 0 0 six\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 3 0 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 2", "Lattice"]);
}

#[test]
fn nan_position() {
    let c = Case::new();
    let p = c.file(
        "nan.xyz",
        "2\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr nan 0 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 4", "not finite"]);
}

#[test]
fn singular_cell_on_periodic_axis() {
    let c = Case::new();
    // Third vector is twice the first: zero volume with all axes periodic.
    let p = c.file(
        "singular.xyz",
        "2\nLattice=\"5 0 0 0 5 0 10 0 0\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 2 2 0\n",
    );
    assert_all_commands_reject(&p, &["singular"]);
    // A zero lattice vector on a periodic axis.
    let p = c.file(
        "zero_vector.xyz",
        "2\nLattice=\"5 0 0 0 5 0 0 0 0\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 2 2 0\n",
    );
    let (status, _, stderr) = run(&model_args("eval", "lj", s(&p), &[]));
    assert_eq!(status, 2, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_cutoff_for_neighbors_and_partition() {
    let c = Case::new();
    let good = c.good();
    for cutoff in ["0", "-1.5", "NaN", "nan", "inf"] {
        let arg = format!("--cutoff={cutoff}");
        assert_bad_input(&["neighbors", "--structure", s(&good), &arg], &["cutoff"]);
        assert_bad_input(
            &["partition", "--structure", s(&good), "--ranks", "2", &arg],
            &["cutoff"],
        );
    }
    // Not a number at all: a usage error, also status 2.
    assert_bad_input(
        &["neighbors", "--structure", s(&good), "--cutoff", "three"],
        &["cutoff"],
    );
}

#[test]
fn unknown_element_symbol() {
    let c = Case::new();
    let p = c.file(
        "element.xyz",
        "2\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nQq 3 0 0\n",
    );
    assert_all_commands_reject(&p, &[name(&p), "line 4", "Qq"]);
}

#[test]
fn unknown_model_name() {
    let c = Case::new();
    let good = c.good();
    // The message lists the models that do exist.
    assert_bad_input(
        &model_args("eval", "no-such-model", s(&good), &[]),
        &["no-such-model", "lj", "schnet-demo"],
    );
}

#[test]
fn malformed_model_toml() {
    let c = Case::new();
    let good = c.good();
    let cases = [
        (
            "wrong_type.toml",
            "kind = \"lennard-jones\"\nepsilon = \"big\"\nsigma = 3.4\ncutoff = 8.0\n",
            "epsilon",
        ),
        (
            "wrong_shift.toml",
            "kind = \"lennard-jones\"\nepsilon = 0.01\nsigma = 3.4\ncutoff = 8.0\nshift = 1\n",
            "shift",
        ),
        (
            "missing.toml",
            "kind = \"lennard-jones\"\nepsilon = 0.01\ncutoff = 8.0\n",
            "sigma",
        ),
        (
            "unknown.toml",
            "kind = \"lennard-jones\"\nepsilon = 0.01\nsigma = 3.4\ncutoff = 8.0\nsgima = 1.0\n",
            "sgima",
        ),
        (
            "negative.toml",
            "kind = \"lennard-jones\"\nepsilon = 0.01\nsigma = 3.4\ncutoff = -8.0\n",
            "cutoff",
        ),
        (
            "nan.toml",
            "kind = \"lennard-jones\"\nepsilon = nan\nsigma = 3.4\ncutoff = 8.0\n",
            "epsilon",
        ),
        ("no_kind.toml", "epsilon = 0.01\n", "kind"),
        ("bad_kind.toml", "kind = \"morse\"\n", "morse"),
        (
            "syntax.toml",
            "kind = \"lennard-jones\nepsilon = [\n",
            "syntax.toml",
        ),
    ];
    for (file, text, needle) in cases {
        let model = c.file(file, text);
        assert_bad_input(
            &model_args("eval", s(&model), s(&good), &[]),
            &[file, needle],
        );
    }
    assert_bad_input(
        &model_args("eval", "does-not-exist.toml", s(&good), &[]),
        &["does-not-exist.toml"],
    );
}

#[test]
fn species_the_model_lacks() {
    let c = Case::new();
    // Fermium (Z = 100) is past the demo models' 1–94 tables.
    let p = c.file(
        "fermium.xyz",
        "2\nProperties=species:S:1:pos:R:3\nFm 0 0 0\nAr 3 0 0\n",
    );
    for model in [
        "eam-demo",
        "bp-demo",
        "schnet-demo",
        "qeq-demo",
        "rebuild-demo",
    ] {
        assert_bad_input(
            &model_args("eval", model, s(&p), &[]),
            &[model, "Fm", "Z=100"],
        );
    }
}

#[test]
fn atoms_closer_than_minimum_distance() {
    let c = Case::new();
    let p = c.file(
        "close.xyz",
        "3\nProperties=species:S:1:pos:R:3\nAr 0 0 0\nAr 3 0 0\nAr 3 0 5e-7\n",
    );
    for model in ["lj", "schnet-demo"] {
        assert_bad_input(
            &model_args("eval", model, s(&p), &[]),
            &["atoms 1 and 2", "apart"],
        );
    }
    // The same through a periodic image: atom 1 sits 5e-7 Å from atom 0's image.
    let p = c.file(
        "close_image.xyz",
        "2\nLattice=\"6 0 0 0 6 0 0 0 6\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 5.9999995 0 0\n",
    );
    assert_bad_input(&model_args("eval", "lj", s(&p), &[]), &["apart"]);
}

#[test]
fn empty_file() {
    let c = Case::new();
    let p = c.file("empty.xyz", "");
    assert_all_commands_reject(&p, &[name(&p), "empty"]);
    let p = c.file("blank.xyz", "\n\n");
    let (status, _, stderr) = run(&model_args("eval", "lj", s(&p), &[]));
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("blank.xyz"), "{stderr}");
}

#[test]
fn missing_structure_file_is_named_once() {
    let c = Case::new();
    let p = c.dir.path().join("absent.xyz");
    let (status, _, stderr) = run(&model_args("eval", "lj", s(&p), &[]));
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("absent.xyz"), "{stderr}");
    // The OS reason is given once, not repeated by the error chain.
    let reason = "No such file or directory";
    assert!(
        stderr.matches(reason).count() <= 1,
        "repeated message: {stderr}"
    );
}

#[test]
fn zero_ranks() {
    let c = Case::new();
    let good = c.good();
    assert_bad_input(
        &model_args("eval", "lj", s(&good), &["--ranks", "0"]),
        &["--ranks"],
    );
    assert_bad_input(
        &[
            "partition",
            "--structure",
            s(&good),
            "--ranks",
            "0",
            "--cutoff",
            "3",
        ],
        &["--ranks"],
    );
    assert_bad_input(
        &model_args("eval", "lj", s(&good), &["--ranks=-1"]),
        &["--ranks"],
    );
}

#[test]
fn absurd_rank_counts_are_refused_not_hung() {
    let c = Case::new();
    let good = c.good();
    let huge = usize::MAX.to_string();
    assert_bad_input(
        &model_args("eval", "lj", s(&good), &["--ranks", &huge]),
        &["ranks"],
    );
    assert_bad_input(
        &[
            "partition",
            "--structure",
            s(&good),
            "--ranks",
            &huge,
            "--cutoff",
            "3",
        ],
        &["ranks"],
    );
}

#[test]
fn bad_spec_file_for_eval() {
    let c = Case::new();
    let good = c.good();
    let unknown = c.file("unknown_field.json", "{\"version\": 1, \"halo_dpeth\": 2}");
    let not_json = c.file("not_json.json", "{version: 1");
    for ranks in ["1", "2"] {
        assert_bad_input(
            &model_args(
                "eval",
                "lj",
                s(&good),
                &["--ranks", ranks, "--spec", s(&unknown)],
            ),
            &["halo_dpeth"],
        );
        assert_bad_input(
            &model_args(
                "eval",
                "lj",
                s(&good),
                &["--ranks", ranks, "--spec", s(&not_json)],
            ),
            &["JSON"],
        );
    }
    assert_bad_input(
        &model_args("eval", "lj", s(&good), &["--spec", "absent-spec.json"]),
        &["absent-spec.json"],
    );
}

#[test]
fn usage_errors_exit_2() {
    // Missing a required argument, an unknown subcommand, a bad enum value.
    assert_bad_input(&["eval", "--model", "lj"], &["--structure"]);
    assert_bad_input(&["frobnicate"], &["frobnicate"]);
    let c = Case::new();
    let good = c.good();
    assert_bad_input(
        &model_args("eval", "lj", s(&good), &["--dtype", "f16"]),
        &["f16"],
    );
}

#[test]
fn good_input_succeeds() {
    // The control: the same commands on a valid file exit 0.
    let c = Case::new();
    let good = c.good();
    for args in [
        vec!["eval", "--model", "lj", "--structure", s(&good), "--json"],
        vec!["neighbors", "--structure", s(&good), "--cutoff", "3.5"],
        vec![
            "partition",
            "--structure",
            s(&good),
            "--ranks",
            "2",
            "--cutoff",
            "3.0",
        ],
    ] {
        let (status, _, stderr) = run(&args);
        assert_eq!(status, 0, "`ddmlip {}`: {stderr}", args.join(" "));
    }
}

/// FCC Cu (a = 3.615 Å), `nx × ny × nz` conventional cells, periodic, as
/// extended XYZ text.
fn fcc_cu(nx: usize, ny: usize, nz: usize) -> String {
    let sys = ddmlip_testkit::build::fcc_box(29, 3.615, [nx, ny, nz]);
    let lines: Vec<String> = sys
        .positions
        .iter()
        .map(|p| format!("Cu {} {} {}", p[0], p[1], p[2]))
        .collect();
    let m = sys.cell.expect("a periodic crystal").matrix;
    format!(
        "{}\nLattice=\"{} 0 0 0 {} 0 0 0 {}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n{}\n",
        lines.len(),
        m[0][0],
        m[1][1],
        m[2][2],
        lines.join("\n")
    )
}

/// Ranks per finding in `eval --json`'s `partition_health` of frame 0:
/// (ranks owning no atoms, ranks holding every atom).
fn idle_and_whole(stdout: &str) -> (usize, usize) {
    let v: serde_json::Value = serde_json::from_str(stdout).unwrap();
    let ranks = v["partition_health"][0]["ranks"].as_array().unwrap();
    let count = |key: &str| ranks.iter().filter(|r| r[key] == 0).count();
    (count("owned"), count("remote"))
}

#[test]
fn more_ranks_than_the_system_can_use_run_and_warn() {
    let c = Case::new();
    // Two atoms 2.5 Å apart, open boundaries, lj's 10.2 Å cutoff: four ranks
    // cannot all own an atom, and every rank sees both atoms.
    let pair = c.file(
        "pair.xyz",
        "2\nProperties=species:S:1:pos:R:3 pbc=\"F F F\"\nAr 0 0 0\nAr 2.5 0 0\n",
    );
    let args = ["eval", "--model", "lj", "--structure", s(&pair)];
    let (status, single, stderr) = run(&[&args[..], &["--json"]].concat());
    assert_eq!(status, 0, "{stderr}");
    assert!(
        !stderr.contains("warning"),
        "one rank is no split:\n{stderr}"
    );

    let (status, text, stderr) = run(&[&args[..], &["--ranks", "4"]].concat());
    assert_eq!(status, 0, "a degenerate split still runs:\n{stderr}");
    assert!(text.contains("E = "), "{text}");
    for needle in [
        "warning: frame 0: degenerate split of 2 atoms over 4 ranks",
        "2 of 4 ranks own no atoms",
        "4 of 4 ranks hold every atom",
        "too thin",
        "ddmlip partition --structure",
    ] {
        assert!(stderr.contains(needle), "missing `{needle}` in:\n{stderr}");
    }

    let (status, json, stderr) = run(&[&args[..], &["--ranks", "4", "--json"]].concat());
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(idle_and_whole(&json), (2, 4));
    // The warning is advice: the answer is the single-process one.
    let energy = |out: &str| {
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        v["energy"][0].as_f64().unwrap()
    };
    let (e1, e4) = (energy(&single), energy(&json));
    assert!((e1 - e4).abs() <= 1e-12 * e1.abs(), "{e1} vs {e4}");

    // Control: a box long enough along the split axis (21.7 Å against twice
    // eam-demo's 5 Å ghost width) gives a healthy split and no warning.
    let slab = c.file("slab.xyz", &fcc_cu(6, 2, 2));
    let (status, json, stderr) = run(&model_args(
        "eval",
        "eam-demo",
        s(&slab),
        &["--ranks", "2", "--json"],
    ));
    assert_eq!(status, 0, "{stderr}");
    assert!(
        !stderr.contains("warning"),
        "healthy split warned:\n{stderr}"
    );
    assert_eq!(idle_and_whole(&json), (0, 0));
}

/// A reader that leaves early (`ddmlip eval --json | head -c 0`) ends the run
/// quietly with the SIGPIPE status, not a panic and a backtrace.
#[test]
fn closed_stdout_ends_quietly() {
    // 2,048 atoms: the JSON is far larger than a pipe's buffer, so the
    // binary's write meets the closed pipe whenever the read end goes.
    let mut xyz = String::from(
        "2048\nLattice=\"42.08 0.0 0.0 0.0 42.08 0.0 0.0 0.0 42.08\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n",
    );
    let a = 5.26;
    for (i, j, k) in (0..8).flat_map(|i| (0..8).flat_map(move |j| (0..8).map(move |k| (i, j, k)))) {
        for b in [
            [0.0, 0.0, 0.0],
            [0.0, 0.5, 0.5],
            [0.5, 0.0, 0.5],
            [0.5, 0.5, 0.0],
        ] {
            let p = [
                (i as f64 + b[0]) * a,
                (j as f64 + b[1]) * a,
                (k as f64 + b[2]) * a,
            ];
            xyz.push_str(&format!("Ar {} {} {}\n", p[0], p[1], p[2]));
        }
    }
    let case = Case::new();
    let file = case.file("ar2048.xyz", &xyz);
    let mut child = Command::new(BIN)
        .args(["eval", "--model", "lj", "--json", "--structure"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}
