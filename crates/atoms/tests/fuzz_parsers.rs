//! Mutated valid inputs never panic the extended XYZ reader: every result is
//! `Ok` or a typed error, quickly. The edits splice in the tokens that broke
//! readers before (huge or tiny numbers, quotes, brackets, newlines).

use ddmlip_atoms::extxyz::read_str;
use proptest::prelude::*;
use std::time::{Duration, Instant};

include!("fuzz_mutate.in");

const VALID: &str = "3\n\
Lattice=\"5.0 0.0 0.0 0.0 5.0 0.0 0.0 0.0 10.0\" Properties=species:S:1:pos:R:3:forces:R:3:tag:I:1 energy=-1.5 stress=\"1 0 0 0 1 0 0 0 1\" pbc=\"T T F\" name=abc\n\
Si 0.0 0.0 5.0 0.1 0.2 0.3 1\n\
O 1.0 1.0 5.5 -0.1 0.0 0.0 2\n\
H 2.0 0.5 6.0 0.0 0.0 0.1 3\n\
2\n\
Properties=species:S:1:pos:R:3 pbc=\"F F F\"\n\
Ar 0 0 0\n\
Ar 3.4 0 0\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_extended_xyz_is_ok_or_a_typed_error(e in edits()) {
        let bytes = mutate(VALID.as_bytes(), &e);
        let text = String::from_utf8_lossy(&bytes);
        let started = Instant::now();
        match read_str(&text) {
            Ok(frames) => {
                for f in &frames {
                    // Reading is not checking: the checks must not panic either.
                    let _ = f.validate();
                }
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }
}
