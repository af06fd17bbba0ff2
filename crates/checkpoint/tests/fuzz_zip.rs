//! Mutated valid checkpoints never panic the reader: the zip container
//! (mutated as bytes, so headers, lengths, offsets and CRCs break) and the
//! pickle inside a well-formed zip (mutated, then zipped with its CRC) give
//! a checkpoint or a typed error, quickly.

mod common;

use ddmlip_checkpoint::Checkpoint;
use proptest::prelude::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

include!("fuzz_mutate.in");

fn checkpoint(pickle: &[u8]) -> Vec<u8> {
    let storage: Vec<u8> = (0..20).collect();
    common::stored_zip(&[
        ("archive/data.pkl", pickle, 0),
        ("archive/byteorder", b"little", 0),
        ("archive/data/0", &storage, 0),
    ])
}

fn read(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let started = Instant::now();
    match Checkpoint::from_bytes(PathBuf::from("fuzz.pth"), bytes) {
        Ok(c) => {
            // Walking the object must not panic either.
            let _ = format!("{:?}", c.object());
        }
        Err(err) => prop_assert!(!err.to_string().is_empty()),
    }
    prop_assert!(started.elapsed() < Duration::from_secs(2));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_zip_containers_are_ok_or_a_typed_error(e in edits()) {
        let valid = checkpoint(&common::torch_style_pickle("FloatStorage", 5));
        read(mutate(&valid, &e))?;
    }

    #[test]
    fn mutated_pickles_in_a_valid_zip_are_ok_or_a_typed_error(e in edits()) {
        let pickle = mutate(&common::torch_style_pickle("FloatStorage", 5), &e);
        read(checkpoint(&pickle))?;
    }
}
