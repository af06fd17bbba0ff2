//! `torch.export` archives through the real binary: `--model PATH.pt2` in
//! `eval` and `validate` (passing on 2 and 4 ranks, and fixing a wrong
//! prior spec), `models --inspect`, and the bad archives (exit 2 with a
//! message that says what is wrong).

mod common;

use common::{
    model_args, pt2_archive as archive, replicated_reference_structure, validate_from_prior,
    wrong_local_prior,
};
use ddmlip_testkit::cli::output_text as text;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn ddmlip(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// The reference's periodic structure replicated 2×2×2 (256 atoms, box
/// 15.6 Å), so that 4 ranks have remote atoms.
fn structure(dir: &Path) -> PathBuf {
    replicated_reference_structure(
        dir,
        "pt2_reference.json",
        "schnet",
        &["H", "C", "O", "Si"],
        "fcc256.xyz",
        [2, 2, 2],
    )
}

#[test]
fn eval_runs_an_imported_archive_and_splits_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = structure(dir.path());
    let model = archive("schnet.pt2");
    let energy = |ranks: &str| {
        let o = ddmlip(&model_args(
            "eval",
            model.to_str().unwrap(),
            s.to_str().unwrap(),
            &["--ranks", ranks],
        ));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let e = out
            .split("E = ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        e.parse::<f64>().unwrap()
    };
    // 8 copies of the reference cell: 8 × the eager energy of one.
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(archive("pt2_reference.json")).unwrap())
            .unwrap();
    let one = reference["models"]["schnet"]["results"][0]["float64"]["energy"]
        .as_f64()
        .unwrap();
    let e1 = energy("1");
    assert!(
        (e1 - 8.0 * one).abs() < 1e-9 * one.abs().max(1.0),
        "{e1} vs 8 × {one}"
    );
    assert!((energy("4") - e1).abs() < 1e-9 * e1.abs().max(1.0));
}

#[test]
fn validate_passes_on_2_and_4_ranks_and_fixes_a_wrong_prior() {
    let dir = tempfile::tempdir().unwrap();
    let s = structure(dir.path());
    let model = archive("schnet.pt2");
    for ranks in ["2", "4"] {
        let o = ddmlip(&model_args(
            "validate",
            model.to_str().unwrap(),
            s.to_str().unwrap(),
            &["--ranks", ranks],
        ));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("\"passed\": true"),
            "{}",
            text(&o)
        );
    }
    // Scatter and gather both `local`: messages are summed onto owned atoms
    // only and ghost rows are read as they are, so after the first
    // interaction block a ghost's features lack its messages and the second
    // block reads stale rows. (Either exchange alone repairs the ghosts.)
    let prior = wrong_local_prior(dir.path());
    let fixed = dir.path().join("fixed.json");
    let with_prior =
        validate_from_prior(model.to_str().unwrap(), s.to_str().unwrap(), &prior, &fixed);
    let o = ddmlip(&[&with_prior[..], &["--no-autofix"]].concat());
    assert_eq!(
        o.status.code(),
        Some(1),
        "the wrong prior fails without auto-fix: {}",
        text(&o)
    );
    let o = ddmlip(&with_prior);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("fix applied"),
        "{}",
        text(&o)
    );
    let fixed: Value = serde_json::from_str(&std::fs::read_to_string(&fixed).unwrap()).unwrap();
    let policy = &fixed["policy"];
    assert!(
        policy["gather"] == "halo_read" || policy["scatter"] != "local",
        "{policy}"
    );
}

#[test]
fn models_inspect_prints_op_coverage() {
    let o = ddmlip(&[
        "models",
        "--inspect",
        archive("schnet_unsupported_ops.pt2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // schnet.pt2 with tanh (1 node), silu (4) and sqrt (1) renamed to erf,
    // gelu and rsqrt; the library's tests count them from the graph JSON.
    for want in [
        "size symbols: atoms = s28, edges = s35",
        "positions: [s28, 3]",
        "edge_index: [2, s35]",
        "     4  aten.gelu.default  UNSUPPORTED",
        "coverage: 3 of 24 ops unsupported (6 nodes)",
        "model: schnet (cutoff 4 Å",
    ] {
        assert!(out.contains(want), "missing `{want}` in:\n{out}");
    }
    let o = ddmlip(&[
        "models",
        "--inspect",
        archive("e3nn_tp.pt2").to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("coverage: every op is supported"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_archives_exit_2_saying_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let s = structure(dir.path());
    let bytes = std::fs::read(archive("pair_mlp.pt2")).unwrap();
    let truncated = dir.path().join("truncated.pt2");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let missing = dir.path().join("missing.pt2");
    let cases = [
        (
            archive("schnet_unsupported_ops.pt2"),
            vec![
                "does not support",
                "aten.erf.default ×1, aten.gelu.default ×4, aten.rsqrt.default ×1",
            ],
        ),
        (
            archive("schnet_static.pt2"),
            vec!["static atom count", "dynamic_shapes"],
        ),
        (truncated, vec!["truncated"]),
        (missing, vec!["cannot read"]),
    ];
    for (path, wants) in cases {
        for cmd in ["eval", "validate"] {
            let o = ddmlip(&model_args(
                cmd,
                path.to_str().unwrap(),
                s.to_str().unwrap(),
                &[],
            ));
            assert_eq!(o.status.code(), Some(2), "{}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!err.contains("panicked"), "{}", text(&o));
            for w in &wants {
                assert!(err.contains(w), "missing `{w}`: {}", text(&o));
            }
        }
    }
}
