//! `trace_and_validate_with`: the decomposed runs go through the given
//! runner (the hook an MPI backend plugs into), the reference does not.

mod common;

use common::*;
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions};
use ddmlip_spec::{MLIPSpec, ScatterMode};
use ddmlip_validate::{trace_and_validate, trace_and_validate_with, ValidateOptions};
use std::time::Duration;

fn options(prior: Option<MLIPSpec>, autofix: bool) -> ValidateOptions {
    ValidateOptions {
        ranks: 2,
        prior,
        autofix,
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

#[test]
fn runner_sees_every_attempt_and_gives_the_threads_verdict() {
    let model = load_model("rebuild-demo").unwrap();
    let batch = vec![fcc_cu(3)];
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::HaloCorrection;
    let opts = options(Some(prior), true);
    let mut seen: Vec<EvalOptions> = Vec::new();
    let with = trace_and_validate_with(model.as_ref(), &batch, &opts, &mut |o| {
        seen.push(o.clone());
        evaluate(model.as_ref(), &batch, o)
    })
    .unwrap();
    let plain = trace_and_validate(model.as_ref(), &batch, &opts).unwrap();
    assert!(with.ok && plain.ok);
    assert_eq!(with.spec.signature(), plain.spec.signature());
    assert_eq!(with.attempts.len(), plain.attempts.len());
    // Called once per attempt (never for the reference), with the attempt's spec.
    assert_eq!(seen.len(), with.attempts.len());
    assert!(seen.len() >= 2, "the wrong prior needed a fix");
    for (o, a) in seen.iter().zip(&with.attempts) {
        assert_eq!(o.ranks, 2);
        assert!(o.trace && o.check_finite);
        assert_eq!(
            o.spec.as_ref().map(MLIPSpec::signature),
            Some(a.spec.signature())
        );
    }
}

#[test]
fn the_runner_result_is_what_gets_compared() {
    // A runner that doubles every force must fail on forces with a least-
    // squares ratio of 2, however right the spec is.
    let model = load_model("schnet-demo").unwrap();
    let batch = vec![fcc_cu(3)];
    let r = trace_and_validate_with(model.as_ref(), &batch, &options(None, false), &mut |o| {
        let mut res = evaluate(model.as_ref(), &batch, o)?;
        if let Some(f) = res.outputs.get_mut("forces") {
            f.values.iter_mut().for_each(|x| *x *= 2.0);
        }
        Ok(res)
    })
    .unwrap();
    assert!(!r.ok);
    let a = &r.attempts[0];
    assert!(a.failed_outputs.contains(&"forces".to_string()));
    assert!(a.passed_outputs.contains(&"energy".to_string()));
    assert!((a.ratio["forces"] - 2.0).abs() < 1e-9, "{:?}", a.ratio);
}
