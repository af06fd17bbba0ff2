//! `EvalOptions::profile` on the built-in models the engine runs (lj,
//! schnet-demo, SevenNet-0 on the CPU), in one process and on two ranks:
//! one profile per rank, naming ops each model is known to use, whose
//! totals lie inside (and cover most of) the forward and backward times
//! the runtime measured; off by default.

use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions, EvalResult};

fn run(model: &str, ranks: usize, profile: bool) -> EvalResult {
    let model = load_model(model).unwrap();
    let crystal = ddmlip_atoms::build::demo_copper(4);
    evaluate(
        model.as_ref(),
        &[crystal],
        &EvalOptions {
            ranks,
            profile,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Checks the profiles of `r` against its timings and the ops `known`
/// (forward and backward) that the model is known to use.
fn check(r: &EvalResult, ranks: usize, known: &[&str]) {
    let d = &r.diagnostics;
    assert_eq!(d.profiles.len(), ranks);
    for (p, t) in d.profiles.iter().zip(&d.rank_timings) {
        for op in known {
            assert!(p.forward_op(op).is_some(), "no forward `{op}` in {p:?}");
            assert!(p.backward_op(op).is_some(), "no backward `{op}` in {p:?}");
        }
        // Each total is timed within its phase, and is most of it (the
        // rest: the runtime's own steps and the loop between ops).
        let (fw, bw) = (p.forward_s(), p.backward_s());
        assert!(
            fw <= t.forward && fw >= 0.5 * t.forward,
            "forward {fw} of {t:?}"
        );
        assert!(
            bw <= t.backward && bw >= 0.5 * t.backward,
            "backward {bw} of {t:?}"
        );
    }
}

#[test]
fn lj_profile_names_its_pair_sum_and_energy_sum() {
    check(&run("lj", 1, true), 1, &["pair_sum:lj_pair", "segment_sum"]);
    check(&run("lj", 2, true), 2, &["pair_sum:lj_pair", "segment_sum"]);
}

#[test]
fn schnet_demo_profile_names_its_layers() {
    check(&run("schnet-demo", 1, true), 1, &["matmul", "gather"]);
    check(&run("schnet-demo", 2, true), 2, &["matmul", "gather"]);
}

#[test]
fn sevennet_profile_on_the_cpu() {
    let path = ddmlip_testkit::sevennet_checkpoint();
    let model = load_model(path.to_str().unwrap()).unwrap();
    let si = ddmlip_atoms::build::rattled_silicon(2);
    let r = evaluate(
        model.as_ref(),
        &[si],
        &EvalOptions {
            profile: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Its edge features and the first interaction's convolution (op names
    // carry the layer).
    check(
        &r,
        1,
        &["rowwise:sevennet_edge_features", "message:0_convolution"],
    );
}

#[test]
fn no_profile_by_default() {
    assert!(run("lj", 1, false).diagnostics.profiles.is_empty());
    assert!(run("lj", 2, false).diagnostics.profiles.is_empty());
}
