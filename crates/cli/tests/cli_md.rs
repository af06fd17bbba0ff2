//! `ddmlip md` through the real binary: files ASE reads back, momenta in and
//! out, restart from a checkpoint, SIGINT, a non-finite state, bad input.

mod common;

use common::md;
use ddmlip_atoms::Column;
use ddmlip_testkit::cli::{argon_fcc, momenta, path_str as s, read_xyz as read};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// 32 argon atoms (FCC 2×2×2, a = 5.3 Å, rattled), with a `momenta`
/// column when asked, written as extended XYZ into `dir`.
fn argon(dir: &Path, with_momenta: bool) -> PathBuf {
    let sys = argon_fcc(2, 0.05, with_momenta);
    let path = dir.join(if with_momenta { "ar_p.xyz" } else { "ar.xyz" });
    ddmlip_atoms::extxyz::write_file(&path, &[sys]).unwrap();
    path
}

#[test]
fn trajectory_log_and_output_carry_momenta_and_results() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), true);
    let (traj, log, out) = (
        dir.path().join("t.xyz"),
        dir.path().join("log.csv"),
        dir.path().join("final.xyz"),
    );
    let o = md(&[
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "nve",
        "--dt",
        "2",
        "--steps",
        "20",
        "--ranks",
        "2",
        "--traj",
        s(&traj),
        "--traj-every",
        "10",
        "--log",
        s(&log),
        "--log-every",
        "5",
        "--output",
        s(&out),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["steps"], 20);
    assert_eq!(summary["n_atoms"], 32);
    let frames = read(&traj);
    assert_eq!(frames.len(), 3, "frames at steps 0, 10, 20");
    // Step 0 carries the input momenta unchanged.
    let input = read(&st).remove(0);
    assert_eq!(momenta(&frames[0]), momenta(&input));
    for f in &frames {
        assert!(f.energy().is_some() && f.forces().is_some() && f.stress_voigt().is_some());
    }
    let last = read(&out).remove(0);
    assert_eq!(last.positions, frames[2].positions);
    assert_eq!(momenta(&last), momenta(&frames[2]));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("step,time_ps,temperature_K,potential_eV,kinetic_eV,total_eV,conserved_eV,pressure_GPa,volume_A3,rebuilds,migrated,ns_per_day"));
    assert_eq!(lines.len(), 1 + 5, "rows at steps 0, 5, 10, 15, 20");
    // The logged kinetic energy is Σ p²/2m of the frame's momenta.
    let m = ddmlip_atoms::elements::mass(18).unwrap();
    let ke: f64 = momenta(&frames[1]).iter().map(|p| p * p / (2.0 * m)).sum();
    let row: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("10,"))
        .unwrap()
        .split(',')
        .collect();
    let logged: f64 = row[4].parse().unwrap();
    assert!((logged - ke).abs() < 1e-9 * ke, "logged {logged} vs {ke}");
}

#[test]
fn restart_continues_bitwise_and_checks_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let common = |steps: &str, out: &Path, ck: &Path| -> Vec<String> {
        [
            "--model",
            "lj",
            "--structure",
            s(&st),
            "--ensemble",
            "langevin",
            "--temperature",
            "120",
            "--friction",
            "3",
            "--init-temperature",
            "120",
            "--seed",
            "9",
            "--dt",
            "4",
            "--skin",
            "0.3",
            "--ranks",
            "3",
            "--steps",
            steps,
            "--output",
            s(out),
            "--checkpoint",
            s(ck),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };
    let (whole, ck_whole) = (dir.path().join("whole.xyz"), dir.path().join("whole.ck"));
    let a: Vec<String> = common("40", &whole, &ck_whole);
    let o = md(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (half, ck) = (dir.path().join("half.xyz"), dir.path().join("half.ck"));
    let a = common("20", &half, &ck);
    assert!(md(&a.iter().map(String::as_str).collect::<Vec<_>>())
        .status
        .success());
    let resumed = dir.path().join("resumed.xyz");
    let mut a = common("20", &resumed, &ck);
    a.extend(["--restart".to_string(), s(&ck).to_string()]);
    let o = md(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (x, y) = (read(&whole).remove(0), read(&resumed).remove(0));
    assert_eq!(x.positions, y.positions, "40 steps ≠ 20 + restart + 20");
    assert_eq!(momenta(&x), momenta(&y));

    // A checkpoint of another structure, and of another format version.
    let other = dir.path().join("other.xyz");
    let mut sys = read(&st).remove(0);
    sys.numbers[0] = 36;
    ddmlip_atoms::extxyz::write_file(&other, &[sys]).unwrap();
    // A five-step restart of `structure` from `checkpoint` is refused with
    // exit 2 and a message that contains `needle`.
    let assert_restart_refused = |structure: &Path, checkpoint: &Path, needle: &str| {
        let o = md(&[
            "--model",
            "lj",
            "--structure",
            s(structure),
            "--ensemble",
            "langevin",
            "--temperature",
            "120",
            "--dt",
            "4",
            "--steps",
            "5",
            "--restart",
            s(checkpoint),
        ]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    assert_restart_refused(&other, &ck, "`numbers`");
    let text = std::fs::read_to_string(&ck)
        .unwrap()
        .replacen("\"version\":1", "\"version\":99", 1);
    let bad = dir.path().join("v99.ck");
    std::fs::write(&bad, text).unwrap();
    assert_restart_refused(&st, &bad, "`version` is 99");
}

#[test]
fn bad_input_exits_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let cases: &[(&[&str], &str)] = &[
        (&["--ensemble", "nve", "--dt", "0", "--steps", "5"], "--dt"),
        (&["--ensemble", "nve", "--dt", "-1", "--steps", "5"], "--dt"),
        (
            &["--ensemble", "nve", "--dt", "1", "--steps", "0"],
            "--steps",
        ),
        (
            &["--ensemble", "nve", "--dt", "1", "--steps", "-3"],
            "--steps",
        ),
        (
            &[
                "--ensemble",
                "langevin",
                "--dt",
                "1",
                "--steps",
                "5",
                "--temperature",
                "-10",
            ],
            "--temperature",
        ),
        (
            &[
                "--ensemble",
                "langevin",
                "--dt",
                "1",
                "--steps",
                "5",
                "--temperature",
                "10",
                "--friction",
                "-1",
            ],
            "--friction",
        ),
        (
            &["--ensemble", "langevin", "--dt", "1", "--steps", "5"],
            "--temperature",
        ),
        (
            &["--ensemble", "nvx", "--dt", "1", "--steps", "5"],
            "--ensemble",
        ),
        (
            &[
                "--ensemble",
                "nve",
                "--dt",
                "1",
                "--steps",
                "5",
                "--skin",
                "-0.5",
            ],
            "--skin",
        ),
    ];
    for (args, flag) in cases {
        let mut a = vec!["--model", "lj", "--structure", s(&st)];
        a.extend_from_slice(args);
        let o = md(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag),
            "{args:?}: message does not name {flag}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A state that is not finite stops the run with exit 1 naming the step, and
/// the checkpoint of an earlier run at the same path is kept as it was.
#[test]
fn non_finite_state_stops_with_exit_1_and_keeps_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let ck = dir.path().join("ck");
    let o = md(&[
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "nve",
        "--dt",
        "2",
        "--steps",
        "5",
        "--init-temperature",
        "50",
        "--checkpoint",
        s(&ck),
    ]);
    assert!(o.status.success());
    let before = std::fs::read(&ck).unwrap();
    // Momenta so large that the kinetic energy overflows.
    let mut sys = read(&st).remove(0);
    sys.properties
        .arrays
        .insert("momenta".into(), Column::Float(vec![1e300; 96], 3));
    let hot = dir.path().join("hot.xyz");
    ddmlip_atoms::extxyz::write_file(&hot, &[sys]).unwrap();
    let o = md(&[
        "--model",
        "lj",
        "--structure",
        s(&hot),
        "--ensemble",
        "nve",
        "--dt",
        "2",
        "--steps",
        "5",
        "--checkpoint",
        s(&ck),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("step 0") && err.contains("not finite"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&ck).unwrap(),
        before,
        "the last good checkpoint was overwritten"
    );
}

/// SIGINT stops the run after the current step, writes a checkpoint and
/// exits 130; the checkpoint restarts.
#[test]
fn sigint_writes_a_checkpoint_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let ck = dir.path().join("ck");
    let log = dir.path().join("log.csv");
    let mut child = Command::new(BIN)
        .args([
            "md",
            "--model",
            "lj",
            "--structure",
            s(&st),
            "--ensemble",
            "nve",
            "--dt",
            "1",
            "--steps",
            "100000000",
            "--init-temperature",
            "50",
            "--checkpoint",
            s(&ck),
            "--log",
            s(&log),
            "--log-every",
            "1",
        ])
        .spawn()
        .unwrap();
    // Wait until it is stepping.
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 5 {
        assert!(t0.elapsed().as_secs() < 60, "the run did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let ckv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ck).unwrap()).unwrap();
    let step = ckv["step"].as_u64().unwrap();
    assert!(step >= 4, "checkpoint at step {step}");
    let out = dir.path().join("out.xyz");
    let o = md(&[
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "nve",
        "--dt",
        "1",
        "--steps",
        "3",
        "--restart",
        s(&ck),
        "--output",
        s(&out),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["last_step"].as_u64().unwrap(), step + 3);
}

#[test]
fn relax_converges_writes_the_structure_and_rejects_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let out = dir.path().join("relaxed.xyz");
    let o = Command::new(BIN)
        .args([
            "relax",
            "--model",
            "lj",
            "--structure",
            s(&st),
            "--fmax",
            "1e-3",
            "--ranks",
            "2",
            "--output",
            s(&out),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["converged"], true);
    let relaxed = read(&out).remove(0);
    let fmax = relaxed
        .forces()
        .unwrap()
        .iter()
        .map(|f| (f[0] * f[0] + f[1] * f[1] + f[2] * f[2]).sqrt())
        .fold(0.0, f64::max);
    assert!(fmax < 1e-3, "written forces reach {fmax}");
    assert!(relaxed.energy().unwrap() < v["initial_energy"].as_f64().unwrap());
    let o = Command::new(BIN)
        .args([
            "relax",
            "--model",
            "lj",
            "--structure",
            s(&st),
            "--fmax",
            "1e-9",
            "--max-steps",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-steps"));
    for bad in [["--fmax", "0"], ["--fmax", "-1"], ["--max-steps", "0"]] {
        let o = Command::new(BIN)
            .args(["relax", "--model", "lj", "--structure", s(&st)])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(bad[0]),
            "{bad:?}"
        );
    }
}

#[test]
fn validate_compares_trajectories_and_names_the_first_departure() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), false);
    let base = [
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "langevin",
        "--temperature",
        "300",
        "--init-temperature",
        "600",
        "--dt",
        "2",
        "--steps",
        "60",
        "--skin",
        "0.3",
        "--ranks",
        "4",
        "--validate",
        "--json",
    ];
    let o = md(&base);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["frames_compared"], 61);
    assert!(v["largest"]["position_diff"].as_f64().unwrap() < 1e-8);
    // A tolerance below rounding: the report names where they first departed.
    let mut strict = base.to_vec();
    strict.extend(["--validate-atol", "1e-300"]);
    let o = md(&strict);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let first = &v["first_departure"];
    assert!(first["step"].as_u64().unwrap() <= 60);
    assert!(
        first["position_diff"].as_f64().unwrap() > 0.0
            || first["momentum_diff"].as_f64().unwrap() > 0.0
    );
}

/// `--ensemble npt` through the binary: a compressed argon crystal under a
/// 0 GPa target grows; bad barostat input exits 2 naming the flag.
#[test]
fn npt_runs_and_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let st = argon(dir.path(), true);
    let log = dir.path().join("log.csv");
    let npt = [
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "npt",
        "--dt",
        "5",
        "--temperature",
        "40",
        "--pressure",
        "0",
        "--pdamp",
        "200",
        "--compressibility",
        "0.3",
    ];
    let mut a = npt.to_vec();
    a.extend(["--steps", "200", "--ranks", "2", "--log", s(&log)]);
    let o = md(&a);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let col = |line: &str, k: usize| -> f64 { line.split(',').nth(k).unwrap().parse().unwrap() };
    let rows: Vec<&str> = text.lines().skip(1).collect();
    // Column 8 is the volume (Å³): the 10.6 Å box is compressed for argon.
    let (v0, v1) = (col(rows[0], 8), col(rows[rows.len() - 1], 8));
    assert!((v0 - 10.6f64.powi(3)).abs() < 1e-6, "{v0}");
    assert!(v1 > 1.01 * v0, "volume {v0} -> {v1}");
    // A structure without a periodic cell.
    let mut open = read(&st).remove(0);
    open.cell = None;
    open.pbc = [false; 3];
    let open_path = dir.path().join("open.xyz");
    ddmlip_atoms::extxyz::write_file(&open_path, &[open]).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--pdamp", "0"], "--pdamp"),
        (&["--pdamp", "-10"], "--pdamp"),
        (&["--compressibility", "0"], "--compressibility"),
        (&["--structure", s(&open_path)], "--ensemble npt"),
    ];
    for (extra, flag) in cases {
        let mut a = npt.to_vec();
        a.extend(["--steps", "2"]);
        if extra[0] == "--structure" {
            a[3] = extra[1];
        } else {
            a.extend_from_slice(extra);
        }
        let o = md(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(flag),
            "{extra:?}: message does not name {flag}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let mut a: Vec<&str> = npt.iter().copied().filter(|x| *x != "--pressure").collect();
    a.retain(|x| *x != "0");
    a.extend(["--steps", "2"]);
    let o = md(&a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--pressure"), "{err}");
}
