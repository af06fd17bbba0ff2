//! Mutated valid spec JSON never panics the reader: `Ok` (then `check` and
//! `signature` run too) or a typed error, quickly.

use ddmlip_spec::MLIPSpec;
use proptest::prelude::*;
use std::time::{Duration, Instant};

include!("fuzz_mutate.in");

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_spec_json_is_ok_or_a_typed_error(e in edits()) {
        // A spec with every field set, as `validate --spec-out` writes it.
        let valid = MLIPSpec::standard_energy_model().to_json();
        let bytes = mutate(valid.as_bytes(), &e);
        let text = String::from_utf8_lossy(&bytes);
        let started = Instant::now();
        match MLIPSpec::from_json(&text) {
            Ok(spec) => {
                let _ = spec.check();
                let _ = spec.signature();
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }
}
