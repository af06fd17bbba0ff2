//! The second `sevenn train` checkpoint of the tests' data (variant `full`
//! of `scripts/fixtures/make_sevenn_train_fixture.py`): every architecture
//! key a user can change beyond the training defaults, together — four
//! O(3) layers whose third gate sees odd scalars (0o, tanh), biases on
//! every network Linear (`use_bias_in_linear`), the fully connected
//! readout (`readout_as_fcn`, relu), shifted-softplus gates, per-layer
//! self-connections and a numeric `conv_denominator`. Through the op
//! engine against the real upstream code's outputs on four structures
//! (periodic, triclinic, slab, cluster), single process and decomposed
//! (four layers need four cutoffs of ghosts).
//!
//! f32 measured: forces 0.29×, energies 0.48× upstream's own f32 gap.

mod common;

use common::sevenn_train::SevennTrain;

const FIXTURE: SevennTrain = SevennTrain {
    name: "sevenn_train_full",
};

/// The fixture really exercises the keys it is meant to: its config as
/// upstream recorded it.
#[test]
fn fixture_config_has_the_non_default_keys() {
    let fixture = FIXTURE.fixture();
    let c = &fixture["config"];
    assert_eq!(c["num_convolution_layer"], 4);
    assert_eq!(c["is_parity"], true);
    assert_eq!(c["use_bias_in_linear"], true);
    assert_eq!(c["readout_as_fcn"], true);
    assert_eq!(c["act_scalar"]["o"], "tanh");
    assert_eq!(c["act_gate"]["e"], "ssp");
}

#[test]
fn full_config_checkpoint_f64_matches_upstream_f64() {
    FIXTURE.check_f64_matches_upstream();
}

#[test]
fn full_config_checkpoint_f32_within_upstreams_f32_gap() {
    FIXTURE.check_f32_within_upstream_gap();
}

#[test]
fn full_config_checkpoint_decomposed_equals_single_process() {
    FIXTURE.check_decomposed_equals_single_process();
}
