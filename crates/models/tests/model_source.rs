//! `model_source`: the parameters a backend with its own kernels (the GPU)
//! takes, resolved from the same names and paths as `load_model`.

use ddmlip_models::{load_model, model_source, LennardJones, ModelError, ModelSource, SchNetDemo};

#[test]
fn names_and_files_resolve_as_load_model_does() {
    assert_eq!(
        model_source("lj").unwrap(),
        Some(ModelSource::LennardJones(LennardJones::argon()))
    );
    // schnet-demo: the weights its CPU graph is built from, at its cutoff.
    let Some(ModelSource::SchNet(w)) = model_source("schnet-demo").unwrap() else {
        panic!("schnet-demo has a ModelSource form");
    };
    assert_eq!(w, SchNetDemo::default().weights());
    assert_eq!(w.cutoff, load_model("schnet-demo").unwrap().cutoff());
    assert_eq!(w.layers.len(), 3);
    // Models without such a form, and unknown names.
    for name in ["eam-demo", "bp-demo", "x.pt2"] {
        assert_eq!(model_source(name).unwrap(), None, "{name}");
    }
    assert!(matches!(
        model_source("no-such-model"),
        Err(ModelError::Unknown { .. })
    ));
    assert!(matches!(
        model_source("missing.pth"),
        Err(ModelError::Io { .. })
    ));
    // A Lennard-Jones file: the parameters load_model reads, checked the same way.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ne.toml");
    std::fs::write(
        &file,
        "kind = \"lennard-jones\"\nepsilon = 0.0031\nsigma = 2.74\ncutoff = 7.0\nshift = true\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let Some(ModelSource::LennardJones(lj)) = model_source(path).unwrap() else {
        panic!("a Lennard-Jones file");
    };
    assert_eq!(
        (lj.epsilon, lj.sigma, lj.cutoff, lj.shift),
        (0.0031, 2.74, 7.0, true)
    );
    assert_eq!(load_model(path).unwrap().cutoff(), lj.cutoff);
    std::fs::write(
        &file,
        "kind = \"lennard-jones\"\nepsilon = -1.0\nsigma = 2.74\ncutoff = 7.0\n",
    )
    .unwrap();
    assert!(matches!(
        model_source(path),
        Err(ModelError::Invalid { .. })
    ));
    // A checkpoint path resolves to itself without reading it.
    let ck = dir.path().join("model.pth");
    std::fs::write(&ck, b"not read here").unwrap();
    assert_eq!(
        model_source(ck.to_str().unwrap()).unwrap(),
        Some(ModelSource::SevenNetCheckpoint(ck.clone()))
    );
}
