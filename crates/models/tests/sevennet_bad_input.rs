//! Bad SevenNet input: an architecture the loader does not implement, a
//! truncated or corrupted `.pth`, a modality that does not exist, species
//! outside the model's list. Each is a typed error naming the file and the
//! config key, modality or species.

use ddmlip_atoms::{Cell, System};
use ddmlip_e3nn::E3nnError;
use ddmlip_models::{load_model_with_modal, ModelError, PRETRAINED_SEVENNETS};
use ddmlip_runtime::{evaluate, EvalOptions};
use std::path::{Path, PathBuf};

/// The cached checkpoint of a built-in name, fetched when missing.
fn checkpoint(name: &str) -> PathBuf {
    let spec = PRETRAINED_SEVENNETS
        .iter()
        .find(|p| p.name == name)
        .unwrap();
    if let Ok(p) = ddmlip_models::pretrained_sevennet_path(spec) {
        return p;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/fetch-sevennet.sh"
    );
    let st = std::process::Command::new("bash")
        .arg(script)
        .status()
        .unwrap();
    assert!(st.success(), "could not fetch the SevenNet checkpoints");
    ddmlip_models::pretrained_sevennet_path(spec).unwrap()
}

fn load_err(path: &Path, modal: Option<&str>) -> ModelError {
    match load_model_with_modal(path.to_str().unwrap(), modal) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

/// A copy of `src` whose pickle has `from` replaced by `to`, in `dir`.
fn patched_checkpoint(src: &Path, from: &[u8], to: &[u8], dir: &Path) -> PathBuf {
    let out = dir.join("patched.pth");
    ddmlip_testkit::pth::patch_pickle(src, from, to, &out);
    out
}

#[test]
fn unsupported_architecture_names_the_file_and_config_key() {
    let dir = tempfile::tempdir().unwrap();
    // self_connection_type: 'linear' → 'convex', a type sevenn does not have.
    let path = patched_checkpoint(
        &checkpoint("sevennet-0"),
        b"X\x06\x00\x00\x00linear",
        b"X\x06\x00\x00\x00convex",
        dir.path(),
    );
    let err = load_err(&path, None);
    let msg = err.to_string();
    match &err {
        ModelError::SevenNet {
            source: E3nnError::UnsupportedConfig { key, value, .. },
            ..
        } => {
            assert_eq!(key, "self_connection_type");
            assert!(value.contains("convex"), "{value}");
        }
        other => panic!("expected an unsupported config key, got {other:?}"),
    }
    assert!(
        msg.contains("patched.pth") && msg.contains("self_connection_type"),
        "{msg}"
    );
}

/// The `sevenn train` checkpoints of the tests' data with an activation
/// name changed: a radial-MLP activation other than SiLU (which sevenn
/// allows, but this loader does not implement) and a gate activation that
/// sevenn itself does not have are refused naming the config key, before
/// any weight is read.
#[test]
fn user_trained_config_with_unimplemented_activations_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let src = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/sevenn-train/sevenn_train_full.pth"
    ));
    // Every `silu` of the config (the pickle memoises the string): the
    // radial MLP's is the first one checked.
    let cases: [(&[u8], &[u8], &str, &str); 2] = [
        (
            b"X\x04\x00\x00\x00silu",
            b"X\x04\x00\x00\x00relu",
            "act_radial",
            "relu",
        ),
        (
            b"X\x04\x00\x00\x00tanh",
            b"X\x04\x00\x00\x00gelu",
            "act_scalar.o",
            "gelu",
        ),
    ];
    for (from, to, want_key, want_value) in cases {
        let path = patched_checkpoint(&src, from, to, dir.path());
        let err = load_err(&path, None);
        match &err {
            ModelError::SevenNet {
                source: E3nnError::UnsupportedConfig { key, value, .. },
                ..
            } => {
                assert_eq!(key, want_key);
                assert!(value.contains(want_value), "{value}");
            }
            other => panic!("expected an unsupported config key, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("patched.pth") && msg.contains(want_key),
            "{msg}"
        );
    }
}

#[test]
fn truncated_checkpoint_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(checkpoint("sevennet-l3i5")).unwrap();
    let path = dir.path().join("half.pth");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(&path, None);
    assert!(
        matches!(
            &err,
            ModelError::SevenNet {
                source: E3nnError::CheckpointRead(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("half.pth"), "{err}");
}

#[test]
fn corrupted_pickle_names_the_file_and_the_fault() {
    let dir = tempfile::tempdir().unwrap();
    let src = checkpoint("sevennet-mf-0");
    let mut zip = std::fs::read(&src).unwrap();
    let (range, _) = ddmlip_testkit::pth::pickle_entry(&zip);
    // 0xff is no pickle opcode.
    let mid = range.start + range.len() / 2;
    zip[mid..mid + 16].fill(0xff);
    let path = dir.path().join("corrupt.pth");
    std::fs::write(&path, zip).unwrap();
    let err = load_err(&path, Some("PBE"));
    assert!(
        matches!(
            &err,
            ModelError::SevenNet {
                source: E3nnError::CheckpointRead(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("corrupt.pth"), "{err}");
}

#[test]
fn modal_missing_or_unknown_lists_the_valid_names() {
    let path = checkpoint("sevennet-mf-0");
    for given in [None, Some("HSE06")] {
        let err = load_err(&path, given);
        match &err {
            ModelError::SevenNet {
                source: E3nnError::Modal { given: g, valid },
                ..
            } => {
                assert_eq!(g.as_deref(), given);
                assert_eq!(valid, &["R2SCAN".to_string(), "PBE".to_string()]);
            }
            other => panic!("expected a modal error, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("R2SCAN, PBE") && msg.contains("checkpoint_sevennet_mf_0.pth"),
            "{msg}"
        );
    }
    // A modal for a single-fidelity checkpoint, or for a model that is no
    // SevenNet, is refused too.
    let err = load_err(&checkpoint("sevennet-l3i5"), Some("PBE"));
    assert!(
        matches!(&err, ModelError::SevenNet { source: E3nnError::Modal { valid, .. }, .. } if valid.is_empty()),
        "{err:?}"
    );
    let err = load_model_with_modal("lj", Some("PBE")).err().unwrap();
    assert!(
        matches!(err, ModelError::ModalNotApplicable { .. }),
        "{err:?}"
    );
}

#[test]
fn species_outside_the_model_list_is_named() {
    checkpoint("sevennet-l3i5");
    let m = load_model_with_modal("sevennet-l3i5", None).unwrap();
    // Og (Z = 118) is not one of the 89 species.
    let sys = System::new(
        vec![[0.0; 3], [0.0, 0.0, 2.5]],
        vec![14, 118],
        Some(Cell::new([
            [10.0, 0.0, 0.0],
            [0.0, 10.0, 0.0],
            [0.0, 0.0, 10.0],
        ])),
        [true; 3],
    );
    let err = evaluate(m.as_ref(), &[sys], &EvalOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Og (Z=118)") && err.contains("sevennet-l3i5"),
        "{err}"
    );
}
