//! `--device cpu|cuda[:N]` through the real binary. On a machine without a
//! GPU (CI) `--device cuda` must end with exit status 2 and a message that
//! says why, whatever the build: without the `cuda` feature, or with it and
//! no CUDA driver.

mod common;

use common::model_args;
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

const XYZ: &str = "4\n\
Lattice=\"10.6 0.0 0.0 0.0 10.6 0.0 0.0 0.0 10.6\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n\
Ar 0.0 0.0 0.0\n\
Ar 2.7 2.6 0.1\n\
Ar 2.6 0.1 2.65\n\
Ar 0.05 2.6 2.7\n";

fn structure(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("ar.xyz");
    std::fs::write(&path, XYZ).unwrap();
    path
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// A two-step NVE `md` run of `lj` on `xyz`, followed by `extra`.
fn short_md<'a>(xyz: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = model_args(
        "md",
        "lj",
        xyz,
        &["--ensemble", "nve", "--dt", "1", "--steps", "2"],
    );
    args.extend_from_slice(extra);
    args
}

/// A GPU that this build could use is present: the no-GPU cases do not apply.
fn gpu_usable() -> bool {
    cfg!(feature = "cuda") && std::path::Path::new("/dev/nvidia0").exists()
}

#[test]
fn device_cuda_without_a_usable_gpu_is_exit_2_saying_why() {
    if gpu_usable() {
        eprintln!("SKIPPED: this machine has a GPU; scripts/gpu-check.sh covers it");
        return;
    }
    // The SevenNet cases resolve the checkpoint before the device.
    ddmlip_testkit::sevennet_checkpoint();
    let dir = tempfile::tempdir().unwrap();
    let xyz = structure(&dir);
    let xyz = xyz.to_str().unwrap();
    let xyz_si = dir.path().join("si.xyz");
    std::fs::write(&xyz_si, SI_XYZ).unwrap();
    let xyz_si = xyz_si.to_str().unwrap();
    for args in [
        model_args("eval", "lj", xyz, &["--device", "cuda"]),
        model_args("eval", "lj", xyz, &["--device", "cuda:1"]),
        vec![
            "bench", "model", "--model", "lj", "--repeat", "1", "--device", "cuda",
        ],
        model_args("eval", "sevennet-0", xyz, &["--device", "cuda"]),
        vec![
            "bench",
            "model",
            "--model",
            "sevennet-0",
            "--crystal",
            "si",
            "--repeat",
            "1",
            "--device",
            "cuda",
        ],
        short_md(xyz, &["--device", "cuda"]),
        model_args("relax", "sevennet-0", xyz_si, &["--device", "cuda"]),
        model_args("eval", "lj", xyz, &["--device", "cuda", "--ranks", "2"]),
        model_args(
            "eval",
            "lj",
            xyz,
            &["--device", "cuda", "--ranks", "2", "--gpus", "all"],
        ),
        short_md(xyz, &["--device", "cuda", "--ranks", "2"]),
        short_md(xyz, &["--device", "cuda", "--ranks", "2", "--validate"]),
        model_args("relax", "lj", xyz, &["--device", "cuda", "--ranks", "3"]),
        model_args("validate", "lj", xyz, &["--device", "cuda", "--ranks", "2"]),
        model_args("validate", "sevennet-0", xyz_si, &["--device", "cuda"]),
        // Through the op engine: models without CUDA kernels of their own,
        // or any model with --engine-ops.
        model_args("eval", "eam-demo", xyz, &["--device", "cuda"]),
        model_args("eval", "lj", xyz, &["--device", "cuda", "--engine-ops"]),
        model_args("validate", "eam-demo", xyz, &["--device", "cuda"]),
        short_md(xyz, &["--device", "cuda", "--engine-ops"]),
        model_args(
            "relax",
            "eam-demo",
            xyz,
            &["--device", "cuda", "--ranks", "2"],
        ),
        vec![
            "bench",
            "model",
            "--model",
            "schnet-demo",
            "--repeat",
            "1",
            "--device",
            "cuda",
            "--engine-ops",
        ],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let why = if cfg!(feature = "cuda") {
            "no CUDA driver library found"
        } else {
            "built without CUDA support"
        };
        assert!(
            err.contains(why) && err.contains("--device cpu"),
            "{args:?}: {err}"
        );
    }
}

/// `--engine-ops` puts the op engine's ops on a GPU: without `--device
/// cuda` it is a usage error; the op engine on a GPU runs one process, so
/// `--backend mpi` and `--gpus` are refused with it.
#[test]
fn engine_ops_need_a_gpu_and_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let xyz = structure(&dir);
    let xyz = xyz.to_str().unwrap();
    let (code, _, err) = run(&model_args("eval", "schnet-demo", xyz, &["--engine-ops"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs --device cuda"), "{err}");
    for command in ["eval", "validate", "relax"] {
        for extra in [&["--backend", "mpi"][..], &["--gpus", "0"][..]] {
            let mut args = model_args(command, "eam-demo", xyz, &["--device", "cuda"]);
            args.extend_from_slice(extra);
            let (code, _, err) = run(&args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(err.contains("not supported with it yet"), "{args:?}: {err}");
        }
    }
}

#[test]
fn device_names_are_checked_and_cpu_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let xyz = structure(&dir);
    let xyz = xyz.to_str().unwrap();
    for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
        let (code, _, err) = run(&model_args("eval", "lj", xyz, &["--device", bad]));
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("expected cpu, cuda or cuda:N"), "{bad}: {err}");
    }
    let (code, default, err) = run(&model_args("eval", "lj", xyz, &["--json"]));
    assert_eq!(code, 0, "{err}");
    let (code, cpu, err) = run(&model_args(
        "eval",
        "lj",
        xyz,
        &["--json", "--device", "cpu"],
    ));
    assert_eq!(code, 0, "{err}");
    assert_eq!(default, cpu);
}

/// Two silicon atoms in a diamond cell (SevenNet-0 knows Si).
const SI_XYZ: &str = "2\nLattice=\"5.43 0 0 0 5.43 0 0 0 5.43\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nSi 0.02 0 0\nSi 1.36 1.33 1.37\n";

/// `md`/`relax --device cuda` run their ranks as threads sharing one GPU:
/// MPI is refused naming the flag, before any device is opened (so the
/// answer is the same with and without a GPU).
#[test]
fn md_and_relax_on_a_gpu_refuse_what_needs_the_cpu_engine() {
    let dir = tempfile::tempdir().unwrap();
    let xyz = structure(&dir);
    let xyz = xyz.to_str().unwrap();
    let md = short_md(xyz, &[]);
    let relax = model_args("relax", "lj", xyz, &[]);
    for (base, extra, flag) in [
        (&md[..], &["--backend", "mpi"][..], "--backend mpi"),
        (&relax[..], &["--backend", "mpi"][..], "--backend mpi"),
    ] {
        let args: Vec<&str> = base
            .iter()
            .chain(extra)
            .chain(&["--device", "cuda"])
            .copied()
            .collect();
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(flag)
                && err.contains("threads sharing one GPU")
                && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// `validate --device cuda` checks the GPU models' own split: what belongs
/// to spec inference or to MPI is refused naming the flag, and so is a
/// split into fewer than two ranks, before any device is opened.
#[test]
fn validate_and_eval_on_a_gpu_refuse_what_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let xyz = structure(&dir);
    let xyz = xyz.to_str().unwrap();
    let spec = dir.path().join("spec.json");
    std::fs::write(&spec, "{}").unwrap();
    let spec = spec.to_str().unwrap();
    for (extra, says) in [
        (&["--spec", spec][..], "--spec does not apply"),
        (&["--spec-out", spec][..], "--spec-out does not apply"),
        (&["--backend", "mpi"][..], "--backend mpi"),
        (&["--ranks", "1"][..], "--ranks must be at least 2"),
    ] {
        let args = model_args(
            "validate",
            "lj",
            xyz,
            &[extra, &["--device", "cuda"]].concat(),
        );
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    for (extra, says) in [
        (
            &["--gpus", "0,x", "--device", "cuda"][..],
            "expected `all` or a comma-separated list",
        ),
        (
            &["--gpus", "0"][..],
            "--gpus places the ranks of a GPU run: it needs --device cuda",
        ),
    ] {
        let args = model_args("eval", "lj", xyz, extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    let args = model_args("eval", "lj", xyz, &["--spec", spec, "--device", "cuda"]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--spec does not apply to --device cuda"),
        "{err}"
    );
}
