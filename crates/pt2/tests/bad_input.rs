//! Archives ddmlip must refuse, each with a typed error that says what is
//! wrong: unsupported ops (all listed with counts), static sizes (with how
//! to re-export), damaged or truncated archives, other layouts and
//! versions, graphs that break the input contract; and mutated archives,
//! which must give Ok or a typed error, never a panic or a hang.

mod common;

use common::{data, edit, members, zip};
use ddmlip_pt2::{ImportedModel, Pt2Archive, Pt2Error};
use proptest::prelude::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn read(bytes: &[u8]) -> Result<Pt2Archive, Pt2Error> {
    Pt2Archive::from_bytes(PathBuf::from("test.pt2"), bytes)
}

#[test]
fn the_fixture_writer_round_trips() {
    // The test's zip writer makes archives the reader takes: the baseline
    // that the damaged cases below differ from in one member only.
    let a = read(&zip(&members("pair_mlp.pt2"))).unwrap();
    assert_eq!(a.metadata.model, "pair_mlp");
    assert_eq!(a.program.nodes.len(), 40);
}

#[test]
fn unsupported_ops_are_all_listed_with_counts() {
    // schnet.pt2 with tanh, silu and sqrt renamed to erf, gelu and rsqrt in
    // its graph JSON (tests/data/schnet_unsupported_ops.pt2).
    let archive = Pt2Archive::read(data("schnet_unsupported_ops.pt2")).unwrap();
    let err = ImportedModel::new(archive).unwrap_err();
    let Pt2Error::UnsupportedOps(list) = &err else {
        panic!("expected UnsupportedOps, got {err}");
    };
    // Counted independently from the original graph JSON.
    let model: serde_json::Value = serde_json::from_slice(
        &members("schnet.pt2")
            .into_iter()
            .find(|(n, _)| n.ends_with("models/model.json"))
            .unwrap()
            .1,
    )
    .unwrap();
    let count = |target: &str| {
        model["graph_module"]["graph"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["target"] == target)
            .count()
    };
    let want = vec![
        (
            "aten.erf.default".to_string(),
            count("torch.ops.aten.tanh.default"),
        ),
        (
            "aten.gelu.default".to_string(),
            count("torch.ops.aten.silu.default"),
        ),
        (
            "aten.rsqrt.default".to_string(),
            count("torch.ops.aten.sqrt.default"),
        ),
    ];
    assert!(want.iter().all(|(_, n)| *n > 0));
    assert_eq!(list, &want);
    let message = err.to_string();
    for (op, n) in &want {
        assert!(message.contains(&format!("{op} ×{n}")), "{message}");
    }
}

#[test]
fn static_sizes_are_refused_with_how_to_reexport() {
    for name in [
        "pair_mlp_static.pt2",
        "schnet_static.pt2",
        "e3nn_tp_static.pt2",
    ] {
        let err = Pt2Archive::read(data(name)).unwrap_err();
        assert!(
            matches!(err, Pt2Error::StaticSizes { what: "atom", .. }),
            "{name}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("dynamic_shapes") && message.contains("Dim('atoms')"),
            "{message}"
        );
    }
}

#[test]
fn truncated_and_corrupted_archives_are_typed_errors() {
    let bytes = std::fs::read(data("pair_mlp.pt2")).unwrap();
    let truncated = read(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(
        matches!(
            truncated,
            Pt2Error::NotZip { .. } | Pt2Error::Corrupt { .. }
        ),
        "{truncated}"
    );
    // A flipped byte inside the graph JSON: the CRC catches it.
    let mut flipped = bytes.clone();
    let at = ddmlip_checkpoint::zip_members(&bytes)
        .unwrap()
        .into_iter()
        .find(|m| m.name.ends_with("models/model.json"))
        .unwrap()
        .payload
        .start
        + 100;
    flipped[at] ^= 0x20;
    let err = read(&flipped).unwrap_err();
    assert!(matches!(err, Pt2Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("corrupted"), "{err}");
    let not_zip = read(b"definitely not an archive").unwrap_err();
    assert!(matches!(not_zip, Pt2Error::NotZip { .. }), "{not_zip}");
}

#[test]
fn other_versions_and_layouts_are_refused_naming_the_supported_ones() {
    let m = members("pair_mlp.pt2");
    let v1 = read(&zip(&edit(&m, "/archive_version", |_| b"1".to_vec()))).unwrap_err();
    assert!(matches!(v1, Pt2Error::UnsupportedVersion { .. }), "{v1}");
    assert!(v1.to_string().contains("torch 2.9–2.11"), "{v1}");
    let schema9 = read(&zip(&edit(&m, "models/model.json", |d| {
        String::from_utf8_lossy(d)
            .replace(
                "\"schema_version\": {\"major\": 8",
                "\"schema_version\": {\"major\": 9",
            )
            .into_bytes()
    })))
    .unwrap_err();
    assert!(
        schema9.to_string().contains("graph schema 9.") && schema9.to_string().contains("8.x"),
        "{schema9}"
    );
    // An AOTInductor package holds compiled code.
    let mut aoti = m.clone();
    aoti.push((
        "pair_mlp/data/aotinductor/model/model.so".into(),
        vec![0u8; 16],
    ));
    let err = read(&zip(&aoti)).unwrap_err();
    assert!(matches!(err, Pt2Error::AotInductor { .. }), "{err}");
    assert!(err.to_string().contains("compiled code"), "{err}");
}

#[test]
fn graphs_off_the_contract_are_refused_naming_what_was_expected() {
    let m = members("pair_mlp.pt2");
    // positions declared float32.
    let f32_positions = edit(&m, "models/model.json", |d| {
        let mut v: serde_json::Value = serde_json::from_slice(d).unwrap();
        v["graph_module"]["graph"]["tensor_values"]["positions"]["dtype"] = 7.into();
        serde_json::to_vec(&v).unwrap()
    });
    let err = read(&zip(&f32_positions)).unwrap_err();
    assert!(matches!(err, Pt2Error::Contract { .. }), "{err}");
    assert!(err.to_string().contains("positions [N,3] float64"), "{err}");
    // One output only.
    let one_output = edit(&m, "models/model.json", |d| {
        let mut v: serde_json::Value = serde_json::from_slice(d).unwrap();
        v["graph_module"]["signature"]["output_specs"]
            .as_array_mut()
            .unwrap()
            .pop();
        serde_json::to_vec(&v).unwrap()
    });
    let err = read(&zip(&one_output)).unwrap_err();
    assert!(err.to_string().contains("expected 2 outputs"), "{err}");
    // No metadata.
    let no_meta: Vec<_> = m
        .iter()
        .filter(|(n, _)| !n.ends_with("extra/ddmlip.json"))
        .cloned()
        .collect();
    let err = read(&zip(&no_meta)).unwrap_err();
    assert!(matches!(err, Pt2Error::Metadata(_)), "{err}");
    // An impossible cutoff.
    let bad_cutoff = edit(&m, "extra/ddmlip.json", |d| {
        String::from_utf8_lossy(d)
            .replace("\"cutoff\": 4.0", "\"cutoff\": -1.0")
            .into_bytes()
    });
    let err = read(&zip(&bad_cutoff)).unwrap_err();
    assert!(
        err.to_string().contains("cutoff must be a positive"),
        "{err}"
    );
    // A weight file shorter than its shape.
    let short = edit(&m, "data/weights/weight_2", |d| d[..8].to_vec());
    let err = read(&zip(&short)).unwrap_err();
    assert!(matches!(err, Pt2Error::Weight { .. }), "{err}");
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = bytes.len().max(1);
        match *m {
            Mutation::Set(i, b) if !bytes.is_empty() => bytes[i % n] = b,
            Mutation::Remove(i) if !bytes.is_empty() => {
                bytes.remove(i % n);
            }
            Mutation::Truncate(i) => bytes.truncate(i % n),
            _ => {}
        }
    }
    bytes
}

fn within_two_seconds(f: impl FnOnce()) -> Result<(), TestCaseError> {
    let start = Instant::now();
    f();
    prop_assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    Ok(())
}

/// Three atoms in a periodic box, within the cutoff of each other.
fn small_system() -> ddmlip_atoms::System {
    let cell = ddmlip_atoms::Cell::new([[6.0, 0.0, 0.0], [0.0, 6.0, 0.0], [0.0, 0.0, 6.0]]);
    ddmlip_atoms::System::new(
        vec![[0.0; 3], [1.5, 0.2, 0.0], [0.3, 1.7, 0.4]],
        vec![1, 6, 8],
        Some(cell),
        [true; 3],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn mutated_archives_are_ok_or_a_typed_error(ms in proptest::collection::vec(mutation(), 1..6)) {
        let bytes = mutate(std::fs::read(data("pair_mlp.pt2")).unwrap(), &ms);
        within_two_seconds(|| { let _ = read(&bytes); })?;
    }

    #[test]
    fn mutated_graph_json_is_ok_or_a_typed_error(
        member in prop_oneof![Just("models/model.json"), Just("model_weights_config.json"), Just("extra/ddmlip.json")],
        ms in proptest::collection::vec(mutation(), 1..6),
    ) {
        let m = edit(&members("schnet.pt2"), member, |d| mutate(d.to_vec(), &ms));
        let bytes = zip(&m);
        within_two_seconds(|| {
            // What imports must also evaluate to a result or a typed error.
            if let Ok(model) = read(&bytes).and_then(ImportedModel::new) {
                let _ = ddmlip_runtime::evaluate(&model, &[small_system()], &ddmlip_runtime::EvalOptions::default());
            }
        })?;
    }
}
