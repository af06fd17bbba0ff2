//! Hand-built checkpoints: a strided view with a non-zero offset, and the
//! error paths (missing data.pkl, other storage classes, short storages,
//! compressed entries). Expected values are worked out by hand.

mod common;

use common::{stored_zip, torch_style_pickle};
use ddmlip_checkpoint::{Checkpoint, CheckpointError, PyValue};

/// Storage of `n` float32 values 0.0, 1.0, 2.0, ...
fn ramp(n: usize) -> Vec<u8> {
    (0..n).flat_map(|k| (k as f32).to_le_bytes()).collect()
}

fn open(zip: Vec<u8>) -> Result<Checkpoint, CheckpointError> {
    Checkpoint::from_bytes("synthetic.pth".into(), zip)
}

#[test]
fn strided_view_with_offset_is_decoded_row_major() {
    let pkl = torch_style_pickle("FloatStorage", 6);
    let storage = ramp(6);
    let zip = stored_zip(&[
        ("my_model/data.pkl", &pkl, 0),
        ("my_model/byteorder", b"little", 0),
        ("my_model/data/0", &storage, 0),
        ("my_model/version", b"3\n", 0),
    ]);
    let c = open(zip).unwrap();
    assert_eq!(c.root_dir(), "my_model/");
    assert_eq!(c.num_storages(), 1);
    let Some(PyValue::Tensor(view)) = c.object().get("w") else {
        panic!("no tensor");
    };
    // Element (i, j) = storage[1 + i*1 + j*2]: [[1, 3], [2, 4]].
    let t = c.tensor(view).unwrap();
    assert_eq!(t.shape, [2, 2]);
    assert_eq!(t.data, [1.0, 3.0, 2.0, 4.0]);
    // Hand-edited views that do not fit the storage are rejected, not indexed.
    for (shape, stride) in [
        (vec![2, 2], vec![1]),
        (vec![3, 3], vec![1, 2]), // last index 1 + 2 + 4 = 7 >= 6
        (vec![usize::MAX, 2], vec![0, 0]),
    ] {
        let bad = ddmlip_checkpoint::TensorRef {
            shape,
            stride,
            ..view.clone()
        };
        assert!(c.tensor(&bad).is_err(), "{bad:?}");
    }
    // state_dict() needs a `model_state_dict` key: a clear error otherwise.
    assert!(
        matches!(c.state_dict(), Err(CheckpointError::MissingKey(k)) if k == "model_state_dict")
    );
}

#[test]
fn invalid_archives_give_clear_errors() {
    let pkl = torch_style_pickle("FloatStorage", 6);

    let no_pickle = stored_zip(&[("archive/data/0", &ramp(6), 0)]);
    let err = open(no_pickle).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::NotTorchZip { reason, .. } if reason.contains("data.pkl")),
        "{err}"
    );

    // Storage shorter than its declared 6 elements.
    let short = stored_zip(&[
        ("archive/data.pkl", &pkl, 0),
        ("archive/data/0", &ramp(3), 0),
    ]);
    let c = open(short).unwrap();
    let Some(PyValue::Tensor(view)) = c.object().get("w") else {
        panic!()
    };
    assert!(matches!(
        c.tensor(view),
        Err(CheckpointError::InvalidTensor { .. })
    ));

    // Storage entry missing altogether.
    let missing = stored_zip(&[("archive/data.pkl", &pkl, 0)]);
    let c = open(missing).unwrap();
    let Some(PyValue::Tensor(view)) = c.object().get("w") else {
        panic!()
    };
    assert!(matches!(
        c.tensor(view),
        Err(CheckpointError::InvalidTensor { .. })
    ));

    // A float64 storage is described but not decoded; the error names the class.
    let dpkl = torch_style_pickle("DoubleStorage", 6);
    let double = stored_zip(&[
        ("archive/data.pkl", &dpkl, 0),
        ("archive/data/0", &[0u8; 48], 0),
    ]);
    let c = open(double).unwrap();
    let Some(PyValue::Tensor(view)) = c.object().get("w") else {
        panic!()
    };
    let err = c.tensor(view).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Unsupported(m) if m.contains("torch.DoubleStorage")),
        "{err}"
    );

    // A deflated data.pkl.
    let compressed = stored_zip(&[("archive/data.pkl", &pkl, 8)]);
    assert!(matches!(
        open(compressed),
        Err(CheckpointError::Unsupported(_))
    ));

    // Central directory pointing past the end of the file.
    let mut bad = stored_zip(&[("archive/data.pkl", &pkl, 0)]);
    let n = bad.len();
    bad[n - 6..n - 2].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(open(bad), Err(CheckpointError::Zip { .. })));
}

/// `{'model_state_dict': {'layer.weight': <2×2 view of storage '0'>}}`, the
/// view as in `torch_style_pickle` (offset 1, stride (1, 2)).
fn state_dict_pickle() -> Vec<u8> {
    common::P::default()
        .op(b"\x80\x02}(")
        .str("model_state_dict")
        .op(b"}(")
        .str("layer.weight")
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b"(")
        .op(b"(")
        .str("storage")
        .global("torch", "FloatStorage")
        .str("0")
        .str("cpu")
        .int1(6)
        .op(b"tQ")
        .int1(1)
        .int1(2)
        .int1(2)
        .op(b"\x86")
        .int1(1)
        .int1(2)
        .op(b"\x86\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .op(b"tR")
        .op(b"u")
        .op(b"u.")
        .0
}

#[test]
fn non_finite_weights_are_an_error_naming_the_tensor() {
    let open_with = |storage: &[u8]| {
        let pkl = state_dict_pickle();
        open(stored_zip(&[
            ("m/data.pkl", &pkl, 0),
            ("m/data/0", storage, 0),
            ("m/version", b"3\n", 0),
        ]))
        .unwrap()
    };
    let c = open_with(&ramp(6));
    let sd = c.state_dict().unwrap();
    assert_eq!(sd[0].0, "layer.weight");
    assert_eq!(sd[0].1.data, [1.0, 3.0, 2.0, 4.0]);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        // Storage value 3 is element (0, 1), flat index 1 of the view.
        let mut storage = ramp(6);
        storage[12..16].copy_from_slice(&bad.to_le_bytes());
        let e = open_with(&storage).state_dict().unwrap_err();
        assert!(
            matches!(&e, CheckpointError::NonFinite { tensor, index: 1, .. } if tensor == "layer.weight"),
            "{e:?}"
        );
        assert!(e.to_string().contains("`layer.weight`"), "{e}");
    }
    // A value outside the view is never read, so it cannot poison the model.
    let mut storage = ramp(6);
    storage[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(open_with(&storage).state_dict().is_ok());
}
