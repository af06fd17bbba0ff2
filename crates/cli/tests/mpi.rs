//! `ddmlip eval --backend mpi` as real multi-process jobs under `mpirun`,
//! compared with the single-process run of the same binary.
//!
//! Without the `mpi` cargo feature only the "how to build it" message is
//! checked.

use ddmlip_testkit::build::{self, SplitMix64};
use std::path::Path;
use std::process::{Command, Output};

/// Extended XYZ text of one frame, written here independently of the
/// library's writer.
fn xyz_frame(lattice: [[f64; 3]; 3], symbols: &[&str], positions: &[[f64; 3]]) -> String {
    let mut s = format!("{}\n", positions.len());
    let l: Vec<String> = lattice
        .iter()
        .flatten()
        .map(|x| format!("{x:.17e}"))
        .collect();
    s.push_str(&format!(
        "Lattice=\"{}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n",
        l.join(" ")
    ));
    for (sym, p) in symbols.iter().zip(positions) {
        s.push_str(&format!(
            "{sym} {:.17e} {:.17e} {:.17e}\n",
            p[0], p[1], p[2]
        ));
    }
    s
}

/// FCC copper, `n³` conventional cells, rattled by up to `amp` Å per axis.
fn fcc_cu(n: usize, amp: f64, seed: u64) -> String {
    let mut sys = build::fcc(29, 3.615, n);
    build::rattle_uniform(&mut sys, amp, seed);
    let lattice = sys.cell.expect("a periodic crystal").matrix;
    xyz_frame(lattice, &vec!["Cu"; sys.len()], &sys.positions)
}

#[cfg(feature = "mpi")]
/// A strongly sheared (triclinic) cell holding a rattled 5×5×5 grid of
/// alternating Cu/Ni atoms, about 2.6 Å apart.
fn triclinic_cuni(seed: u64) -> String {
    let lattice = [[13.0, 0.0, 0.0], [4.0, 12.5, 0.0], [-3.0, 2.5, 13.5]];
    let n = 5;
    let mut r = SplitMix64::new(seed);
    let (mut pos, mut sym) = (Vec::new(), Vec::new());
    for i in 0..n {
        for j in 0..n {
            for k in 0..n {
                let f = [
                    (i as f64 + 0.5) / n as f64,
                    (j as f64 + 0.5) / n as f64,
                    (k as f64 + 0.5) / n as f64,
                ];
                let mut p = [0.0; 3];
                for (c, row) in lattice.iter().enumerate() {
                    for (x, v) in p.iter_mut().zip(row) {
                        *x += f[c] * v;
                    }
                }
                pos.push([
                    p[0] + 0.1 * r.uniform(),
                    p[1] + 0.1 * r.uniform(),
                    p[2] + 0.1 * r.uniform(),
                ]);
                sym.push(if (i + j + k) % 2 == 0 { "Cu" } else { "Ni" });
            }
        }
    }
    xyz_frame(lattice, &sym, &pos)
}

fn ddmlip() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ddmlip"))
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_backend_without_the_feature_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "cu.xyz", &fcc_cu(2, 0.05, 1));
    let o = ddmlip()
        .args(["eval", "--model", "lj", "--backend", "mpi", "--structure"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--features mpi"), "{}", describe(&o));
}

#[cfg(not(feature = "mpi"))]
#[test]
fn validate_mpi_backend_without_the_feature_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "cu.xyz", &fcc_cu(2, 0.05, 1));
    let o = ddmlip()
        .args([
            "validate",
            "--model",
            "lj",
            "--backend",
            "mpi",
            "--structure",
        ])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--features mpi"), "{}", describe(&o));
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::*;
    use serde_json::Value;
    use std::time::{Duration, Instant};

    use ddmlip_testkit::mpirun_available;

    /// `mpirun -n N ddmlip <args>`; allowed as root and oversubscribed, since
    /// test machines have fewer cores than ranks.
    fn mpirun(n: usize, args: &[&str], structure: &Path) -> (Output, Duration) {
        let start = Instant::now();
        let o = Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-n",
                &n.to_string(),
            ])
            .arg(env!("CARGO_BIN_EXE_ddmlip"))
            .args(args)
            .arg("--structure")
            .arg(structure)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .unwrap();
        (o, start.elapsed())
    }

    /// The one JSON object a successful `--json` run prints: stdout must hold
    /// exactly one line (rank 0's), which also proves no other rank printed.
    fn json_of(o: &Output) -> Value {
        assert!(o.status.success(), "{}", describe(o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "expected one JSON line; {}", describe(o));
        serde_json::from_str(lines[0]).unwrap()
    }

    fn floats(v: &Value) -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    }

    /// Asserts `got` equals `want` to 1e-10 relative (DESIGN §7): energy per
    /// system, force per atom (vector norm of the difference over the atom's
    /// force, floored at 1 % of the largest force so near-zero forces are not
    /// held to a relative bound of pure rounding noise), stress per system
    /// (over its largest component), atomic energies (over the largest).
    fn assert_same(got: &Value, want: &Value, what: &str) {
        const RTOL: f64 = 1e-10;
        let (eg, ew) = (floats(&got["energy"]), floats(&want["energy"]));
        assert_eq!(eg.len(), ew.len(), "{what}: systems");
        for (s, (g, w)) in eg.iter().zip(&ew).enumerate() {
            assert!(
                (g - w).abs() <= RTOL * w.abs(),
                "{what}: energy[{s}] {g} vs {w}"
            );
        }
        let fg: Vec<Vec<f64>> = got["forces"]
            .as_array()
            .unwrap()
            .iter()
            .map(floats)
            .collect();
        let fw: Vec<Vec<f64>> = want["forces"]
            .as_array()
            .unwrap()
            .iter()
            .map(floats)
            .collect();
        assert_eq!(fg.len(), fw.len(), "{what}: atoms");
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let fmax = fw.iter().map(|f| norm(f)).fold(0.0, f64::max);
        assert!(fmax > 1e-3, "{what}: forces are trivially zero");
        for (i, (g, w)) in fg.iter().zip(&fw).enumerate() {
            let diff: Vec<f64> = g.iter().zip(w).map(|(a, b)| a - b).collect();
            let scale = norm(w).max(1e-2 * fmax);
            assert!(
                norm(&diff) <= RTOL * scale,
                "{what}: force of atom {i}: {g:?} vs {w:?}"
            );
        }
        let sg = got["stress"].as_array().unwrap();
        let sw = want["stress"].as_array().unwrap();
        assert_eq!(sg.len(), sw.len(), "{what}: stress rows");
        for (s, (g, w)) in sg.iter().zip(sw).enumerate() {
            let (g, w) = (floats(g), floats(w));
            let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(scale > 0.0, "{what}: stress[{s}] is zero");
            for k in 0..6 {
                assert!(
                    (g[k] - w[k]).abs() <= RTOL * scale,
                    "{what}: stress[{s}][{k}] {} vs {}",
                    g[k],
                    w[k]
                );
            }
        }
        if let Some(aw) = want.get("atomic_energies") {
            let (ag, aw) = (floats(&got["atomic_energies"]), floats(aw));
            let scale = aw.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            for (i, (g, w)) in ag.iter().zip(&aw).enumerate() {
                assert!((g - w).abs() <= RTOL * scale, "{what}: atomic energy {i}");
            }
        }
    }

    /// One batch file with both cell kinds: FCC Cu 4×4×4 (256 atoms,
    /// orthorhombic) and a triclinic Cu/Ni crystal (125 atoms).
    fn batch_file(dir: &Path) -> std::path::PathBuf {
        let text = fcc_cu(4, 0.1, 7) + &triclinic_cuni(11);
        write(dir, "batch.xyz", &text)
    }

    fn mpi_equals_single_process(model: &str) {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = batch_file(dir.path());
        let single = ddmlip()
            .args(["eval", "--model", model, "--json", "--structure"])
            .arg(&f)
            .output()
            .unwrap();
        let single = json_of(&single);
        assert_eq!(floats(&single["energy"]).len(), 2);
        for n in [2usize, 4] {
            let (o, _) = mpirun(
                n,
                &["eval", "--backend", "mpi", "--model", model, "--json"],
                &f,
            );
            assert_same(&json_of(&o), &single, &format!("{model}, mpirun -n {n}"));
            if n == 4 {
                // Staggered even-count cuts, gathered over MPI.
                let args = ["eval", "--backend", "mpi", "--model", model, "--json"];
                let (o, _) = mpirun(n, &[&args[..], &["--balance", "atoms"]].concat(), &f);
                assert_same(
                    &json_of(&o),
                    &single,
                    &format!("{model}, mpirun -n {n} --balance atoms"),
                );
            }
            // The threads backend with the same rank count agrees too.
            let threads = ddmlip()
                .args([
                    "eval",
                    "--model",
                    model,
                    "--json",
                    "--ranks",
                    &n.to_string(),
                ])
                .arg("--structure")
                .arg(&f)
                .output()
                .unwrap();
            assert_same(
                &json_of(&threads),
                &single,
                &format!("{model}, threads {n}"),
            );
        }
    }

    #[test]
    fn lj_mpi_equals_single_process_on_2_and_4_ranks() {
        mpi_equals_single_process("lj");
    }

    #[test]
    fn schnet_demo_mpi_equals_single_process_on_2_and_4_ranks() {
        mpi_equals_single_process("schnet-demo");
    }

    /// Text mode prints one summary (rank 0's), a disagreeing `--ranks` is
    /// reported and ignored, and `--output` is written once with the same
    /// forces as the single-process JSON.
    #[test]
    fn rank_zero_alone_reports_and_writes() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "tri.xyz", &triclinic_cuni(5));
        let out = dir.path().join("out.xyz");
        let out_arg = out.to_str().unwrap();
        let args = ["eval", "--backend", "mpi", "--model", "lj", "--ranks", "7"];
        let (o, _) = mpirun(3, &[&args[..], &["--output", out_arg]].concat(), &f);
        assert!(o.status.success(), "{}", describe(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            stdout.matches("MPI: 3 process(es)").count(),
            1,
            "{}",
            describe(&o)
        );
        assert_eq!(stdout.matches("wrote ").count(), 1, "{}", describe(&o));
        assert_eq!(
            stderr.matches("--ranks 7 ignored").count(),
            1,
            "{}",
            describe(&o)
        );

        let frames = ddmlip_atoms::read_structure(&out).unwrap();
        assert_eq!(frames.len(), 1);
        let single = ddmlip()
            .args(["eval", "--model", "lj", "--json", "--structure"])
            .arg(&f)
            .output()
            .unwrap();
        let single = json_of(&single);
        let want_e = floats(&single["energy"])[0];
        let got_e = frames[0].energy().unwrap();
        assert!(
            (got_e - want_e).abs() <= 1e-10 * want_e.abs(),
            "{got_e} vs {want_e}"
        );
        let written = frames[0].forces().unwrap();
        let fw = single["forces"].as_array().unwrap();
        assert_eq!(written.len(), fw.len());
        for (g, w) in written.iter().zip(fw) {
            let w = floats(w);
            for k in 0..3 {
                assert!(
                    (g[k] - w[k]).abs() <= 1e-10 * (w[k].abs() + 1.0),
                    "{g:?} vs {w:?}"
                );
            }
        }
    }

    /// Every rank detects the unsupported element while reading; the job
    /// stops at once with status 2 and the message printed once.
    #[test]
    fn unsupported_element_fails_fast_with_its_message() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Americium (Z=95) parses fine but schnet-demo has parameters up to Z=94.
        let text = fcc_cu(2, 0.05, 3).replacen("\nCu ", "\nAm ", 1);
        let f = write(dir.path(), "am.xyz", &text);
        let (o, elapsed) = mpirun(
            4,
            &[
                "eval",
                "--backend",
                "mpi",
                "--model",
                "schnet-demo",
                "--json",
            ],
            &f,
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
        assert!(stderr.contains("Am (Z=95)"), "{}", describe(&o));
        assert_eq!(stderr.matches("Am (Z=95)").count(), 1, "{}", describe(&o));
        assert!(o.stdout.is_empty(), "{}", describe(&o));
        assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    }

    /// Two atoms 1e-8 Å apart: only the ranks holding that pair find it
    /// during the run. The failing rank aborts the job with its message; no
    /// peer is left waiting (their deadline is 120 s).
    #[test]
    fn a_rank_failing_during_the_run_aborts_the_job() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut text = fcc_cu(3, 0.05, 9);
        // Duplicate the last atom (nudged by 1e-8 Å) and bump the count.
        let last = text.lines().last().unwrap().to_string();
        let mut cols: Vec<String> = last.split_whitespace().map(String::from).collect();
        let x: f64 = cols[1].parse().unwrap();
        cols[1] = format!("{:.17e}", x + 1e-8);
        text.push_str(&(cols.join(" ") + "\n"));
        let text = text.replacen("108\n", "109\n", 1);
        let f = write(dir.path(), "close.xyz", &text);
        let (o, elapsed) = mpirun(4, &["eval", "--backend", "mpi", "--model", "lj"], &f);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", describe(&o));
        assert!(
            stderr.contains("atoms 107 and 108") || stderr.contains("atoms 108 and 107"),
            "{}",
            describe(&o)
        );
        assert!(stderr.contains("Å apart"), "{}", describe(&o));
        assert!(o.stdout.is_empty(), "{}", describe(&o));
        assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    }

    /// The report of `validate --json` (pretty JSON on stdout, rank 0 only).
    fn report_of(o: &Output) -> Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("one JSON report expected ({e}); {}", describe(o)))
    }

    #[test]
    fn validate_mpi_gives_the_threads_verdict_on_2_and_4_ranks() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "cu.xyz", &fcc_cu(3, 0.05, 7));
        for n in [2, 4] {
            let threads = ddmlip()
                .args(["validate", "--json", "--model", "schnet-demo", "--ranks"])
                .arg(n.to_string())
                .arg("--structure")
                .arg(&f)
                .output()
                .unwrap();
            assert_eq!(threads.status.code(), Some(0), "{}", describe(&threads));
            let (o, _) = mpirun(
                n,
                &[
                    "validate",
                    "--backend",
                    "mpi",
                    "--json",
                    "--model",
                    "schnet-demo",
                ],
                &f,
            );
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
            let (t, m) = (report_of(&threads), report_of(&o));
            assert_eq!(m["ok"], Value::Bool(true));
            assert_eq!(m["ranks"], Value::from(n));
            assert_eq!(m["spec"], t["spec"], "{n} ranks: same working spec");
            let (ta, ma) = (&t["attempts"], &m["attempts"]);
            assert_eq!(ma.as_array().unwrap().len(), ta.as_array().unwrap().len());
            // Same outputs passed, and handler firings summed over all MPI
            // ranks equal the threads backend's sum over its ranks.
            assert_eq!(ma[0]["passed_outputs"], ta[0]["passed_outputs"]);
            assert_eq!(ma[0]["handler_counts"], ta[0]["handler_counts"]);
            for (k, v) in ma[0]["max_rel_diff"].as_object().unwrap() {
                assert!(v.as_f64().unwrap() <= 1e-10, "{n} ranks, {k}: {v}");
            }
        }
    }

    #[test]
    fn validate_mpi_wrong_prior_fails_without_autofix_and_is_fixed_with_it() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "cu.xyz", &fcc_cu(3, 0.05, 11));
        // The standard energy-model spec with scatter switched to
        // halo_correction: wrong for a model that builds its own graph.
        let mut spec: Value =
            serde_json::from_str(&ddmlip_spec::MLIPSpec::standard_energy_model().to_json())
                .unwrap();
        spec["policy"]["scatter"] = Value::from("halo_correction");
        let prior = write(dir.path(), "prior.json", &spec.to_string());
        let out = dir.path().join("fixed.json");
        let (prior, out) = (prior.to_str().unwrap(), out.to_str().unwrap());
        let base = [
            "validate",
            "--backend",
            "mpi",
            "--model",
            "rebuild-demo",
            "--spec",
            prior,
            "--spec-out",
            out,
        ];
        let (o, _) = mpirun(4, &[&base[..], &["--no-autofix", "--json"]].concat(), &f);
        assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
        let r = report_of(&o);
        assert_eq!(r["ok"], Value::Bool(false));
        assert_eq!(r["attempts"].as_array().unwrap().len(), 1);
        // The wrong handler fired on every one of the 4 ranks.
        let fired = r["attempts"][0]["handler_counts"]["scatter:halo_correction"].as_u64();
        assert_eq!(fired, Some(4), "{}", describe(&o));

        let (o, _) = mpirun(4, &base, &f);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("fix applied"), "{}", describe(&o));
        let fixed: Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        assert_eq!(fixed["policy"]["scatter"], Value::from("local"));
    }

    #[test]
    fn validate_mpi_bad_input_exits_2_on_every_rank() {
        if !mpirun_available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "cu.xyz", &fcc_cu(2, 0.05, 3));
        let (o, t) = mpirun(
            2,
            &["validate", "--backend", "mpi", "--model", "no-such-model"],
            &f,
        );
        assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
        assert!(t < Duration::from_secs(60), "no hang: {t:?}");
    }
}
