//! Diagnostic corpus: one case per auto-fix rule and per diagnostic. Each
//! wrong spec must fail (auto-fix off) or be fixed (auto-fix on); the
//! reference is always the single-process run of the same model.

mod common;

use common::*;
use ddmlip_engine::Model;
use ddmlip_models::load_model;
use ddmlip_spec::{MLIPSpec, ScatterMode};
use ddmlip_validate::{trace_and_validate, StopReason, TraceReport, ValidateOptions};
use std::time::{Duration, Instant};

fn options(ranks: usize, prior: Option<MLIPSpec>, autofix: bool) -> ValidateOptions {
    ValidateOptions {
        ranks,
        prior,
        autofix,
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn run(
    model: &dyn Model,
    n: usize,
    ranks: usize,
    prior: Option<MLIPSpec>,
    autofix: bool,
) -> TraceReport {
    let batch = vec![fcc_cu(n)];
    trace_and_validate(model, &batch, &options(ranks, prior, autofix)).unwrap()
}

/// A wrong prior fails without auto-fix and is fixed with it; the fix's
/// rationale names the rule.
fn wrong_prior_case(
    model: &dyn Model,
    n: usize,
    ranks: usize,
    prior: MLIPSpec,
    rule_words: &[&str],
) -> TraceReport {
    let off = run(model, n, ranks, Some(prior.clone()), false);
    assert!(!off.ok, "no false pass: {}", off.render());
    assert_eq!(off.attempts.len(), 1);
    assert!(off.next_action.starts_with("FAIL"), "{}", off.next_action);
    let on = run(model, n, ranks, Some(prior), true);
    assert!(on.ok, "{}", on.render());
    let fix = on.fix_applied.clone().expect("a fix was applied");
    for w in rule_words {
        assert!(fix.contains(w), "fix rationale lacks `{w}`: {fix}");
    }
    assert!(on.next_action.contains("OK"), "{}", on.next_action);
    assert!(on.next_action.contains("fix applied"), "{}", on.next_action);
    on
}

#[test]
fn declared_specs_pass_first_time() {
    for name in [
        "lj",
        "eam-demo",
        "bp-demo",
        "schnet-demo",
        "qeq-demo",
        "rebuild-demo",
    ] {
        let model = load_model(name).unwrap();
        let r = run(model.as_ref(), 3, 2, None, true);
        assert!(r.ok, "{name}: {}", r.render());
        assert_eq!(r.attempts.len(), 1, "{name}");
        assert!(r.fix_applied.is_none());
        // Every reference output was compared, per-atom ones included.
        let a = &r.attempts[0];
        for out in ["energy", "forces", "stress", "atomic_energies"] {
            assert!(a.passed_outputs.iter().any(|o| o == out), "{name}: {out}");
        }
        assert!(a.max_abs_diff.keys().all(|k| !k.starts_with('_')));
    }
}

#[test]
fn qeq_charges_are_compared() {
    let model = load_model("qeq-demo").unwrap();
    let r = run(model.as_ref(), 3, 2, None, true);
    assert!(r.attempts[0]
        .passed_outputs
        .contains(&"charges".to_string()));
}

#[test]
fn rule_a_rebuild_with_halo_correction_becomes_local() {
    let model = load_model("rebuild-demo").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::HaloCorrection;
    let r = wrong_prior_case(
        model.as_ref(),
        3,
        2,
        prior,
        &["neighbour list", "scatter: local"],
    );
    assert_eq!(r.spec.policy.scatter, ScatterMode::Local);
}

#[test]
fn schnet_with_scatter_local_is_fixed() {
    // With `gather: halo_read` a stale ghost is refreshed before it is read,
    // so scatter local alone is harmless on the runtime graph; with
    // `gather: local` too, layer 2 reads ghost features never computed.
    let model = load_model("schnet-demo").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::Local;
    prior.policy.gather = ddmlip_spec::GatherMode::Local;
    let off = run(model.as_ref(), 6, 2, Some(prior.clone()), false);
    // The op-by-op check points at the first interaction layer.
    let ld = off
        .diagnostics
        .layer_divergence
        .clone()
        .unwrap_or_else(|| panic!("{}", off.render()));
    assert!(ld.first_divergent, "{ld:?}");
    assert!(ld.scope.starts_with("interaction_"), "{ld:?}");
    assert!(
        off.next_action.contains("First divergent op"),
        "{}",
        off.next_action
    );
    // The runtime graph's edge counts are complete: the halo is not the cause.
    let halo = off.diagnostics.halo_completeness.clone().unwrap();
    assert!(halo.verified, "{halo:?}");
    let r = wrong_prior_case(model.as_ref(), 6, 2, prior, &["halo_correction"]);
    assert_eq!(r.spec.policy.scatter, ScatterMode::HaloCorrection);
}

#[test]
fn rule_b_stress_missing_from_all_reduce() {
    let model = load_model("lj").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.all_reduce_outputs.clear();
    let off = run(model.as_ref(), 3, 2, Some(prior.clone()), false);
    assert_eq!(off.attempts[0].failed_outputs, vec!["stress".to_string()]);
    let r = wrong_prior_case(
        model.as_ref(),
        3,
        2,
        prior,
        &["stress", "all_reduce_outputs"],
    );
    assert!(r.spec.all_reduce_outputs.contains(&"stress".to_string()));
}

#[test]
fn rule_c_world_size_blow_up() {
    let model = load_model("bp-demo").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.all_reduce_outputs.push("energy".into());
    let off = run(model.as_ref(), 3, 3, Some(prior.clone()), false);
    let ratio = off.attempts[0].ratio["energy"];
    assert!((ratio - 3.0).abs() < 1e-9, "energy ratio {ratio}");
    // Nothing diverges in the forward pass: the blow-up is post-model.
    let ld = off.diagnostics.layer_divergence.clone().unwrap();
    assert!(!ld.first_divergent, "{ld:?}");
    let r = wrong_prior_case(model.as_ref(), 3, 3, prior, &["world_size", "energy"]);
    assert!(!r.spec.all_reduce_outputs.contains(&"energy".to_string()));
}

#[test]
fn rule_d_undeclared_opaque_op_gets_adapter() {
    let model = OpaqueSumModel {
        lj: short_lj(),
        backward: true,
    };
    let off = run(&model, 3, 2, None, false);
    assert!(!off.ok);
    assert_eq!(
        off.diagnostics.preflight.undeclared_opaque_ops,
        vec!["system_sum".to_string()]
    );
    let delta = off.diagnostics.preflight.spec_delta.clone().unwrap();
    assert_eq!(delta["op_adapters"][0]["inputs"]["0"], "slice_owned");
    assert_eq!(delta["op_adapters"][0]["outputs"]["0"], "all_reduce_sum");
    assert!(
        off.next_action.contains("Pre-flight"),
        "{}",
        off.next_action
    );
    assert!(off.attempts[0]
        .handler_counts
        .contains_key("opaque:system_sum(undeclared)"));
    let on = run(&model, 3, 2, None, true);
    assert!(on.ok, "{}", on.render());
    assert!(on.fix_applied.as_deref().unwrap().contains("adapter"));
    assert!(on.spec.adapter("system_sum").is_some());
    // The pasted delta is exactly what made it pass.
    let pasted: ddmlip_spec::OpAdapter =
        serde_json::from_value(delta["op_adapters"][0].clone()).unwrap();
    assert_eq!(on.spec.adapter("system_sum"), Some(&pasted));
}

#[test]
fn rule_e_qeq_without_system_reductions() {
    let model = load_model("qeq-demo").unwrap();
    let mut prior = model.declared_spec().unwrap();
    prior.system_reductions = false;
    let off = run(model.as_ref(), 3, 2, Some(prior.clone()), false);
    assert!(off.attempts[0]
        .failed_outputs
        .contains(&"charges".to_string()));
    let ld = off.diagnostics.layer_divergence.clone().unwrap();
    assert_eq!(ld.op, "segment_sum", "{ld:?}");
    let r = wrong_prior_case(
        model.as_ref(),
        3,
        2,
        prior,
        &["system_reductions", "gathered back"],
    );
    assert!(r.spec.system_reductions);
}

/// A pair sum is an edge op and an Edge → Atom scatter at once: inference
/// counts it as the scatter it is, and the inferred spec passes.
#[test]
fn inference_reads_a_pair_sum_as_an_edge_scatter() {
    let report = run(&UndeclaredLj, 3, 2, None, false);
    assert!(report.ok, "{}", report.render());
    assert_eq!(report.prior_source, "inferred");
    let scatter = report
        .inferred
        .iter()
        .find(|i| i.field == "policy.scatter")
        .expect("an inferred scatter mode");
    assert_eq!(scatter.value, "halo_correction");
    assert!(
        scatter.evidence.starts_with("1 Edge → Atom scatter-add(s)"),
        "{}",
        scatter.evidence
    );
}

#[test]
fn rule_f_hidden_cutoff_raises_halo_depth() {
    let model = HiddenCutoffModel {
        declared_cutoff: 3.0,
        true_cutoff: 4.8,
    };
    let off = run(&model, 4, 2, None, false);
    assert!(!off.ok, "{}", off.render());
    let halo = off.diagnostics.halo_completeness.clone().unwrap();
    assert!(!halo.verified, "{halo:?}");
    assert!(halo.atoms_missing > 0);
    assert!(
        off.next_action.contains("INCOMPLETE"),
        "{}",
        off.next_action
    );
    let on = run(&model, 4, 2, None, true);
    assert!(on.ok, "{}", on.render());
    assert_eq!(on.spec.halo_depth, 2);
    let fix = on.fix_applied.clone().unwrap();
    assert!(fix.contains("halo_depth 1 → 2"), "{fix}");
    assert!(fix.contains("true radius"), "{fix}");
}

#[test]
fn severed_gradient_is_translated() {
    let model = OpaqueSumModel {
        lj: short_lj(),
        backward: false,
    };
    let r = run(&model, 2, 2, None, true);
    assert!(!r.ok);
    assert!(r.attempts.is_empty());
    assert_eq!(r.diagnostics.errors[0].kind, "severed_gradient");
    assert!(r.next_action.contains("severed"), "{}", r.next_action);
    assert!(
        r.next_action.contains("opaque:system_sum_nograd"),
        "{}",
        r.next_action
    );
}

#[test]
fn failing_rank_is_named_without_hanging() {
    let model = RankOnePanics { lj: short_lj() };
    let t0 = Instant::now();
    let r = run(&model, 3, 2, None, true);
    let elapsed = t0.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?} with a 30 s timeout"
    );
    assert!(!r.ok);
    let e = &r.diagnostics.errors[0];
    assert_eq!(e.rank, Some(1), "{:?}", r.diagnostics.errors);
    assert_eq!(e.kind, "rank_failed");
    assert!(r.next_action.contains("rank 1"), "{}", r.next_action);
    assert!(
        r.next_action.contains("species table lookup out of range"),
        "{}",
        r.next_action
    );
}

#[test]
fn pass_on_degenerate_partition_is_a_warning() {
    let model = load_model("bp-demo").unwrap();
    // 6³ cells = 864 atoms, 21.7 Å box: two 10.8 Å slabs > 2·5 Å.
    let healthy = run(model.as_ref(), 6, 2, None, true);
    assert!(healthy.ok);
    assert!(healthy
        .diagnostics
        .partition_health
        .iter()
        .all(|h| h.degenerate.is_empty()));
    assert!(
        healthy.next_action.starts_with("OK"),
        "{}",
        healthy.next_action
    );
    // 2³ cells, 7.2 Å box over 4 ranks: every rank sees everything.
    let degenerate = run(model.as_ref(), 2, 4, None, true);
    assert!(degenerate.ok);
    assert!(
        degenerate.next_action.starts_with("WARNING"),
        "{}",
        degenerate.next_action
    );
    assert!(degenerate.next_action.contains("not evidence"));
    assert!(degenerate
        .next_action
        .contains("box > 2·ghost_width·k/(k−1)"));
}

#[test]
fn inference_without_prior_records_evidence() {
    // A model with no declared spec: every field is inferred.
    struct NoSpec(ddmlip_models::RebuildDemo);
    impl ddmlip_engine::ModelInfo for NoSpec {
        fn name(&self) -> String {
            "nospec".into()
        }
        fn description(&self) -> String {
            String::new()
        }
        fn cutoff(&self) -> f64 {
            self.0.cutoff
        }
        fn species(&self) -> ddmlip_engine::SpeciesSupport {
            ddmlip_engine::SpeciesSupport::UpTo(94)
        }
        fn uses_runtime_graph(&self) -> bool {
            false
        }
    }
    impl ddmlip_engine::ModelForward for NoSpec {
        fn forward<T: ddmlip_engine::Scalar>(
            &self,
            g: &mut ddmlip_engine::Graph<T>,
            inputs: &ddmlip_engine::ModelInputs,
        ) -> Result<ddmlip_engine::ModelOutputs, ddmlip_engine::EngineError> {
            self.0.forward(g, inputs)
        }
    }
    let model = NoSpec(ddmlip_models::RebuildDemo::default());
    let r = run(&model, 3, 2, None, false);
    assert_eq!(r.prior_source, "inferred");
    assert!(r.ok, "{}", r.render());
    let field = |f: &str| r.inferred.iter().find(|i| i.field == f).unwrap();
    assert_eq!(field("policy.scatter").value, "local");
    assert!(field("policy.scatter").evidence.contains("neighbour list"));
    assert_eq!(field("halo_depth").value, 1);
    assert_eq!(field("output_kinds.stress").value, "per_system");
    assert!(r.spec.all_reduce_outputs.contains(&"stress".to_string()));
}

#[test]
fn report_serialises_to_json() {
    let model = load_model("lj").unwrap();
    let r = run(model.as_ref(), 2, 2, None, true);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    for key in [
        "ok",
        "spec",
        "attempts",
        "fix_applied",
        "inferred",
        "next_action",
        "diagnostics",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(v["diagnostics"]["partition_health"].is_array());
    assert_eq!(v["spec"]["version"], 1);
}

/// A fused message-passing op is a gather at the neighbour and a scatter
/// onto the centre: inference counts each as an Edge → Atom scatter and as
/// one hop of the receptive field.
#[test]
fn fused_message_passing_counts_as_scatters_and_hops() {
    let model = FusedMessageChain {
        cutoff: 4.0,
        layers: 3,
    };
    let r = run(&model, 4, 2, None, false);
    assert!(r.ok, "{}", r.render());
    let field = r.diagnostics.receptive_field.clone().unwrap();
    // x₀ reads atoms one cutoff away, each of the 3 layers one more.
    assert_eq!(field.hops, 4, "{field:?}");
    assert_eq!(field.edge_scatters, 4, "{field:?}");
    assert_eq!(field.scope, "interaction_2");
    let scatter = r
        .inferred
        .iter()
        .find(|i| i.field == "policy.scatter")
        .unwrap();
    assert_eq!(scatter.value, "halo_correction");
    assert!(
        scatter.evidence.starts_with("4 Edge → Atom scatter-add(s)"),
        "{}",
        scatter.evidence
    );
}

/// `scatter: local, gather: local` on the runtime graph leaves ghost rows of
/// every fused scatter unset; the rule that repairs it must see fused ops.
#[test]
fn fused_message_passing_with_local_prior_is_repaired() {
    let model = FusedMessageChain {
        cutoff: 4.0,
        layers: 3,
    };
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::Local;
    prior.policy.gather = ddmlip_spec::GatherMode::Local;
    let off = run(&model, 4, 2, Some(prior.clone()), false);
    assert!(!off.ok, "{}", off.render());
    // Auto-fix off still names the fix it would apply.
    assert_eq!(off.stop_reason, StopReason::AutofixOff);
    let untried = off.untried_fix.clone().unwrap_or_default();
    assert!(untried.contains("halo_correction"), "{untried}");
    assert!(
        off.next_action.contains("Next fix to try"),
        "{}",
        off.next_action
    );
    assert!(
        off.next_action.contains("halo_correction"),
        "{}",
        off.next_action
    );
    let r = wrong_prior_case(
        &model,
        4,
        2,
        prior,
        &["4 Edge → Atom scatter(s)", "halo_correction"],
    );
    assert_eq!(r.spec.policy.scatter, ScatterMode::HaloCorrection);
    assert_eq!(r.stop_reason, StopReason::Passed);
}

/// The attempt limit ends the search with fixes left: the report says so
/// (not "no further rule") and names the fix that was not tried.
#[test]
fn exhausted_attempt_limit_is_reported_as_such() {
    let model = load_model("rebuild-demo").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::HaloCorrection;
    let batch = vec![fcc_cu(3)];
    let options = ValidateOptions {
        max_attempts: 1,
        ..options(2, Some(prior), true)
    };
    let r = trace_and_validate(model.as_ref(), &batch, &options).unwrap();
    assert!(!r.ok);
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(r.stop_reason, StopReason::MaxAttempts);
    assert!(
        r.next_action.contains("limit of 1 attempt"),
        "{}",
        r.next_action
    );
    assert!(
        !r.next_action.contains("no further rule"),
        "{}",
        r.next_action
    );
    assert!(
        r.next_action.contains("--max-attempts"),
        "{}",
        r.next_action
    );
    assert!(r.untried_fix.unwrap().contains("scatter: local"));
}

/// Every attempt keeps its own verdict and diagnostics in the JSON.
#[test]
fn each_attempt_keeps_its_diagnostics_and_verdict() {
    let model = load_model("schnet-demo").unwrap();
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::Local;
    prior.policy.gather = ddmlip_spec::GatherMode::Local;
    let r = run(model.as_ref(), 6, 2, Some(prior), true);
    assert!(r.ok, "{}", r.render());
    assert_eq!(r.attempts.len(), 2);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let attempts = v["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["passed"], false);
    assert_eq!(attempts[1]["passed"], true);
    // The failed attempt's own first divergent op, not the winner's.
    let first = &attempts[0]["diagnostics"]["layer_divergence"];
    assert_eq!(first["first_divergent"], true, "{first}");
    assert!(first["scope"].as_str().unwrap().starts_with("interaction_"));
    assert!(attempts[1]["diagnostics"]["layer_divergence"].is_null());
    for a in attempts {
        assert_eq!(
            a["diagnostics"]["partition_health"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(a["diagnostics"]["halo_completeness"]["verified"], true);
    }
    assert_eq!(v["stop_reason"], "passed");
}

/// With zero tolerances a correct split fails by rounding alone; the advice
/// says so and suggests a tolerance instead of blaming the spec.
#[test]
fn rounding_differences_are_called_rounding() {
    let model = load_model("lj").unwrap();
    let batch = vec![fcc_cu(3)];
    let options = ValidateOptions {
        atol: 0.0,
        rtol: 0.0,
        ..options(2, None, true)
    };
    let r = trace_and_validate(model.as_ref(), &batch, &options).unwrap();
    // Summation order differs across ranks, so some output differs in the
    // last bits; if none did, there would be nothing to explain.
    assert!(!r.ok, "{}", r.render());
    let worst = r.attempts[0]
        .max_rel_diff
        .values()
        .copied()
        .fold(0.0, f64::max);
    assert!(worst > 0.0 && worst < 1e-12, "{worst}");
    assert!(r.next_action.contains("rounding"), "{}", r.next_action);
    assert!(r.next_action.contains("--rtol"), "{}", r.next_action);
    assert!(
        !r.next_action.contains("consolidation"),
        "{}",
        r.next_action
    );
    assert!(r.attempts[0].diagnostics.layer_divergence.is_none());
}

/// A saved spec records what it was validated for, and the record tells a
/// later run whether the spec is evidence for its model.
#[test]
fn saved_spec_records_its_validation() {
    // 6³ cells, 21.7 Å: two slabs wider than 2 × the 5 Å cutoff (healthy).
    let lj: Box<dyn Model> = Box::new(short_lj());
    let r = run(lj.as_ref(), 6, 2, None, true);
    assert!(r.ok);
    // The advice names no flag of one front end (`demo` has no --spec-out).
    assert!(!r.next_action.contains("--spec-out"), "{}", r.next_action);
    let v = r.spec.validated.clone().expect("a validation record");
    assert_eq!(v.model, "lj");
    assert_eq!(v.model_description, lj.description());
    assert!(v.partition_healthy);
    assert_eq!((v.ranks, v.frames, v.atoms), (2, 1, 864));
    assert_eq!((v.atol, v.rtol), (1e-8, 1e-10));
    assert!(v.passed);
    assert!(v.max_rel_diff.unwrap() < 1e-12);
    // Round trip through the file format.
    let saved = MLIPSpec::from_json(&r.spec.to_json()).unwrap();
    use ddmlip_validate::spec_provenance_warning as warning;
    assert_eq!(warning(&saved, lj.as_ref()), None);
    let other = load_model("rebuild-demo").unwrap();
    let w = warning(&saved, other.as_ref()).unwrap();
    assert!(w.contains("validated for model `lj`"), "{w}");
    let w = warning(&MLIPSpec::standard_energy_model(), lj.as_ref()).unwrap();
    assert!(w.contains("never validated"), "{w}");
    // A failed validation is recorded as failed.
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::HaloCorrection;
    let failed = run(other.as_ref(), 3, 2, Some(prior), false);
    assert!(!failed.ok);
    assert!(!failed.spec.validated.as_ref().unwrap().passed);
    let w = warning(&failed.spec, other.as_ref()).unwrap();
    assert!(w.contains("FAILED"), "{w}");
    // A prior's old record is not carried into a new validation.
    let again = run(other.as_ref(), 3, 2, Some(saved), false);
    assert_eq!(again.spec.validated.clone().unwrap().model, "rebuild-demo");
    // A pass on a degenerate split (3³ cells over 4 ranks) is no evidence.
    let tiny = run(lj.as_ref(), 3, 4, None, true);
    assert!(tiny.ok);
    let w = warning(&tiny.spec, lj.as_ref()).unwrap();
    assert!(w.contains("degenerate"), "{w}");
}
