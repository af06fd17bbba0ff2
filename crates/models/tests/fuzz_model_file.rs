//! Mutated valid TOML model files never panic the loader: a model or a
//! typed error, quickly. A model that loads is also asked for its cutoff.

use ddmlip_models::load_model;
use proptest::prelude::*;
use std::time::{Duration, Instant};

include!("fuzz_mutate.in");

const VALID: &str =
    "kind = \"lennard-jones\"\nepsilon = 0.0104\nsigma = 3.4\ncutoff = 10.2\nshift = true\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn mutated_toml_model_files_load_or_give_a_typed_error(e in edits()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.toml");
        std::fs::write(&path, mutate(VALID.as_bytes(), &e)).unwrap();
        let started = Instant::now();
        match load_model(path.to_str().unwrap()) {
            Ok(model) => prop_assert!(model.cutoff().is_finite() && model.cutoff() > 0.0),
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }
}
