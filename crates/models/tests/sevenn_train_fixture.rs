//! A checkpoint written by `sevenn train` with sevenn's training defaults
//! (O(3) irreps, `nequip` self-connections, element-wise reference-energy
//! shifts; made by `scripts/fixtures/make_sevenn_train_fixture.py`) through
//! the op engine, against the real upstream code's outputs on four
//! structures (periodic, triclinic, slab, cluster), single process and
//! decomposed.
//!
//! f32: with edge vectors from f64 positions rounded once and edge features
//! computed in f64, forces are 0.36× and energies 0.58× upstream's own f32
//! gap (with f32 edge features 1.02× and 1.17×; from f32 positions the
//! forces were 2.8×).

mod common;

use common::sevenn_train::SevennTrain;

const FIXTURE: SevennTrain = SevennTrain {
    name: "sevenn_train_parity",
};

#[test]
fn sevenn_train_checkpoint_f64_matches_upstream_f64() {
    FIXTURE.check_f64_matches_upstream();
}

#[test]
fn sevenn_train_checkpoint_f32_matches_upstream_f32() {
    FIXTURE.check_f32_within_upstream_gap();
}

#[test]
fn sevenn_train_checkpoint_decomposed_equals_single_process() {
    FIXTURE.check_decomposed_equals_single_process();
}
