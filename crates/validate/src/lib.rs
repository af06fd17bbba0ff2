//! `validate`: does a model give the single-process answer when split over
//! ranks? If not, why, and which spec fixes it (docs/design.md §3).
//!
//! [`trace_and_validate`] runs the model once in one process with tracing
//! (the ground truth), infers a distribution spec from the trace (the
//! prior spec is kept verbatim; missing fields are inferred, each with its
//! evidence), runs the model split over ranks with that spec, compares every
//! output per global atom id, and on failure tries spec mutations from a
//! rule engine until one passes. The [`TraceReport`] carries every attempt,
//! one actionable `next_action`, and diagnostics in causal order.

#![forbid(unsafe_code)]

mod autofix;
mod compare;
mod diagnose;
mod infer;
mod render;
mod report;

use ddmlip_atoms::System;
use ddmlip_domain::{partition_health, partition_system, Partition};
use ddmlip_engine::{DType, Model};
use ddmlip_runtime::{evaluate, ghost_width, EvalError, EvalOptions, EvalResult};
use ddmlip_spec::{MLIPSpec, ScatterMode, Validation};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use thiserror::Error;

pub use compare::{deviation, Deviation};
pub use report::{
    Attempt, AttemptDiagnostics, Diagnostics, HaloCompleteness, Inferred, LayerDivergence,
    MissingNeighbors, Preflight, ReceptiveField, StopReason, TraceReport, TranslatedError,
};

/// Errors that stop validation before any verdict: the input cannot be run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ValidateError {
    /// Bad options (zero ranks, non-positive tolerances, …).
    #[error("invalid validate options: {0}")]
    Options(String),
    /// The batch cannot be evaluated by this model (empty frame, unsupported
    /// element, overlapping atoms, a model that needs something the input lacks).
    #[error("{0}")]
    Input(String),
}

/// How to validate.
#[derive(Debug, Clone)]
pub struct ValidateOptions {
    /// Ranks of the decomposed run (threads backend). Default 4.
    pub ranks: usize,
    /// Absolute tolerance per output (output units). Default `1e-8`, suited to f64.
    pub atol: f64,
    /// Relative tolerance per output, relative to the output's largest
    /// |reference| entry. Default `1e-10`, suited to f64 (decomposed runs
    /// with the right spec agree to ~1e-14).
    pub rtol: f64,
    /// Prior spec (a `--spec` file). `None` uses the model's declared spec;
    /// a model without one gets a fully inferred spec. Kept verbatim.
    pub prior: Option<MLIPSpec>,
    /// Try rule-based spec mutations when the candidate fails. Default true.
    pub autofix: bool,
    /// Most specs tried in total (the first attempt included). Default 8.
    pub max_attempts: usize,
    /// Deadline of every blocking communication call of a decomposed run.
    pub timeout: Duration,
    /// Precision of both runs. Default f64.
    pub dtype: DType,
    /// Where both runs' device-eligible ops run (see
    /// [`EvalOptions::device`]); `None`: the host.
    pub device: Option<ddmlip_runtime::EngineDevice>,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        Self {
            ranks: 4,
            atol: 1e-8,
            rtol: 1e-10,
            prior: None,
            autofix: true,
            max_attempts: 8,
            timeout: Duration::from_secs(120),
            dtype: DType::F64,
            device: None,
        }
    }
}

impl ValidateOptions {
    /// Defaults with tolerances suited to `dtype` (f32: atol 1e-4, rtol 1e-5,
    /// which cover single-precision reordering of sums over ranks).
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F64 => Self::default(),
            DType::F32 => Self {
                atol: 1e-4,
                rtol: 1e-5,
                dtype,
                ..Self::default()
            },
        }
    }
}

/// What one attempt left behind for the auto-fix rules.
struct RunData {
    comparison: Option<compare::Comparison>,
}

/// Runs the reference, infers a spec, validates it on `options.ranks`
/// ranks, and auto-fixes it when asked. Errors only for input that cannot
/// be run at all; a model that fails (in one process or split) yields a
/// report with `ok == false` and the translated error.
pub fn trace_and_validate(
    model: &dyn Model,
    batch: &[System],
    options: &ValidateOptions,
) -> Result<TraceReport, ValidateError> {
    trace_and_validate_with(model, batch, options, &mut |opts| {
        evaluate(model, batch, opts)
    })
}

/// A backend that runs one decomposed attempt of a validation: given the
/// attempt's options (`ranks == ValidateOptions::ranks`, `spec` set, traces
/// and finite checks on), it returns the consolidated result with one trace
/// per rank (rank order) and handler firings summed over ranks, like
/// [`evaluate`] does for the threads backend.
pub type DecomposedRunner<'a> = dyn FnMut(&EvalOptions) -> Result<EvalResult, EvalError> + 'a;

/// [`trace_and_validate`] with the decomposed runs delegated to `runner`
/// (for instance one MPI process per rank). The single-process reference
/// still runs here, in this process, with [`evaluate`]; `runner` is called
/// once per attempt, in order, and never for the reference.
pub fn trace_and_validate_with(
    model: &dyn Model,
    batch: &[System],
    options: &ValidateOptions,
    runner: &mut DecomposedRunner<'_>,
) -> Result<TraceReport, ValidateError> {
    let started = Instant::now();
    check_options(options)?;
    let (mut prior, prior_source) = match (&options.prior, model.declared_spec()) {
        (Some(p), _) => (Some(p.clone()), "--spec"),
        (None, Some(d)) => (Some(d), "model"),
        (None, None) => (None, "inferred"),
    };
    // A record of an earlier validation is evidence about that run, not
    // part of the spec: this run writes its own.
    if let Some(p) = prior.as_mut() {
        p.validated = None;
    }
    let reference = evaluate(
        model,
        batch,
        &EvalOptions {
            dtype: options.dtype,
            ranks: 1,
            spec: None,
            trace: true,
            check_finite: true,
            timeout: options.timeout,
            device: options.device.clone(),
            ..Default::default()
        },
    );
    let reference = match reference {
        Ok(r) => r,
        Err(EvalError::Input(m)) | Err(EvalError::Engine(ddmlip_engine::EngineError::Input(m))) => {
            return Err(ValidateError::Input(m))
        }
        Err(e) => {
            return Ok(reference_failed_report(
                model,
                options,
                prior,
                prior_source,
                &e,
                started,
            ))
        }
    };
    let trace = reference
        .diagnostics
        .traces
        .first()
        .cloned()
        .unwrap_or_default();
    let facts = infer::trace_facts(&trace);
    let cutoff = model.cutoff();
    let graph_radius = facts
        .model_graph_edges
        .and_then(|n| infer::effective_radius(batch, n, cutoff));
    let (spec0, inferred) = infer::infer_spec(&infer::InferInput {
        model,
        prior: prior.clone(),
        facts: &facts,
        reference: &reference,
        graph_radius,
    });
    let radius_upper = graph_upper(graph_radius, cutoff);
    let required_depth = infer::required_halo_depth(&facts, radius_upper, cutoff);
    let depth_reason = match graph_radius {
        Some((lo, hi)) if lo > cutoff => format!(
            "the model's own graph has {} edges, which puts its true radius between {lo:.3} and \
             {hi:.3} Å although cutoff() says {cutoff} Å; {} hop(s) of it need {required_depth} \
             cutoff(s) of ghosts",
            facts.model_graph_edges.unwrap_or(0),
            facts.reach.max(1)
        ),
        _ => format!(
            "{} message-passing hop(s) of {cutoff} Å (deepest in `{}`) need {required_depth} cutoff(s) of ghosts",
            facts.reach.max(1),
            facts.reach_scope
        ),
    };
    let evidence = autofix::Evidence {
        facts: &facts,
        uses_runtime_graph: model.uses_runtime_graph(),
        ranks: options.ranks,
        required_depth,
        depth_reason,
    };
    let preflight = preflight(&spec0, &facts);
    // The halo check's radius: the runtime graph's cutoff, or the model's
    // own graph radius (the largest distance it includes).
    let halo_radius = match graph_radius {
        Some((lo, _)) => lo.max(cutoff * 1e-6) * (1.0 + 1e-9),
        None => cutoff,
    };

    let mut attempts: Vec<Attempt> = Vec::new();
    let mut runs: Vec<RunData> = Vec::new();
    let mut tried: HashSet<String> = HashSet::new();
    let mut spec = spec0.clone();
    let mut rationale = match prior_source {
        "--spec" => "prior spec from --spec, kept verbatim (output kinds completed)".to_string(),
        "model" => "the model's declared spec, kept verbatim (output kinds completed)".to_string(),
        _ => "spec inferred from the single-process trace".to_string(),
    };
    let layers = LayerCheck {
        trace: &trace,
        compare_edges: model.uses_runtime_graph() && facts.model_graph_edges.is_none(),
        tolerance: layer_tolerance(options.dtype),
    };
    let (stop_reason, untried_fix) = loop {
        tried.insert(spec.signature());
        let (attempt, run) = run_attempt(
            model,
            batch,
            options,
            &mut *runner,
            &spec,
            rationale,
            &reference,
            halo_radius,
            &layers,
            attempts.len() + 1,
        );
        attempts.push(attempt);
        runs.push(run);
        if attempts[attempts.len() - 1].passed {
            break (StopReason::Passed, None);
        }
        // Mutate the best attempt so far; a rule that made things worse is
        // not built upon.
        let mut order: Vec<usize> = (0..attempts.len()).collect();
        order.sort_by(|&a, &b| score(&attempts[a]).total_cmp(&score(&attempts[b])));
        let mut next = None;
        'search: for &k in &order {
            let outcome = autofix::Outcome {
                spec: &attempts[k].spec,
                comparison: runs[k].comparison.as_ref(),
                handler_counts: &attempts[k].handler_counts,
                halo_incomplete: attempts[k]
                    .diagnostics
                    .halo_completeness
                    .as_ref()
                    .is_some_and(|h| !h.verified),
            };
            for (s, why) in autofix::candidates(&outcome, &evidence) {
                if !tried.contains(&s.signature()) {
                    next = Some((s, why));
                    break 'search;
                }
            }
        }
        match next {
            None => break (StopReason::NoFurtherRule, None),
            Some((_, why)) if !options.autofix => break (StopReason::AutofixOff, Some(why)),
            Some((_, why)) if attempts.len() >= options.max_attempts => {
                break (StopReason::MaxAttempts, Some(why))
            }
            Some((s, why)) => {
                spec = s;
                rationale = why;
            }
        }
    };
    // Auto-fix off with no rule to propose is still "off" to the user.
    let stop_reason = if stop_reason == StopReason::NoFurtherRule && !options.autofix {
        StopReason::AutofixOff
    } else {
        stop_reason
    };

    let winner = attempts.iter().position(Attempt::passed);
    let ok = winner.is_some();
    let pick = winner.unwrap_or_else(|| {
        let mut order: Vec<usize> = (0..attempts.len()).collect();
        order.sort_by(|&a, &b| score(&attempts[a]).total_cmp(&score(&attempts[b])));
        order[0]
    });
    let fix_applied = winner
        .filter(|&w| w > 0)
        .map(|w| attempts[w].rationale.clone());
    let mut final_spec = attempts[pick].spec.clone();
    // The top-level diagnostics describe the last attempt on failure (the
    // end of the search) and the winner on success; every attempt keeps
    // its own.
    let diag_k = if ok { pick } else { attempts.len() - 1 };
    let shown = &attempts[diag_k].diagnostics;
    let diagnostics = Diagnostics {
        receptive_field: Some(ReceptiveField {
            hops: facts.reach,
            scope: facts.reach_scope.clone(),
            edge_scatters: facts.edge_scatters,
        }),
        partition_health: shown.partition_health.clone(),
        halo_completeness: shown.halo_completeness.clone(),
        layer_divergence: if ok {
            None
        } else {
            shown.layer_divergence.clone()
        },
        errors: attempts
            .iter()
            .filter_map(|a| a.diagnostics.error.clone())
            .collect(),
        preflight,
    };
    let picked = &attempts[pick];
    final_spec.validated = Some(Validation {
        model: model.name(),
        model_description: model.description(),
        ranks: options.ranks,
        dtype: options.dtype.to_string(),
        atol: options.atol,
        rtol: options.rtol,
        passed: ok,
        max_rel_diff: picked
            .error
            .is_none()
            .then(|| picked.max_rel_diff.values().copied().fold(0.0f64, f64::max)),
        frames: batch.len(),
        atoms: batch.iter().map(System::len).sum(),
        partition_healthy: picked
            .diagnostics
            .partition_health
            .iter()
            .all(|h| h.degenerate.is_empty()),
    });
    let mut report = TraceReport {
        ok,
        model: model.name(),
        ranks: options.ranks,
        atol: options.atol,
        rtol: options.rtol,
        dtype: options.dtype,
        prior_source: prior_source.to_string(),
        spec: final_spec,
        attempts,
        fix_applied,
        stop_reason,
        untried_fix,
        inferred,
        next_action: String::new(),
        diagnostics,
        seconds: 0.0,
    };
    report.next_action = render::next_action(&report, winner);
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn check_options(o: &ValidateOptions) -> Result<(), ValidateError> {
    if o.ranks == 0 {
        return Err(ValidateError::Options("ranks must be at least 1".into()));
    }
    if !(o.atol.is_finite() && o.atol >= 0.0 && o.rtol.is_finite() && o.rtol >= 0.0) {
        return Err(ValidateError::Options(format!(
            "atol and rtol must be finite and non-negative (got {} and {})",
            o.atol, o.rtol
        )));
    }
    if o.max_attempts == 0 {
        return Err(ValidateError::Options(
            "max_attempts must be at least 1".into(),
        ));
    }
    if let Some(p) = &o.prior {
        p.check()
            .map_err(|e| ValidateError::Options(format!("prior spec: {e}")))?;
    }
    Ok(())
}

/// Relative difference below which a decomposed output differs from the
/// reference by rounding alone: sums taken in another order across ranks
/// agree to a few hundred ulps.
pub(crate) fn rounding_level(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e3 * f64::EPSILON,
        DType::F32 => 1e3 * f32::EPSILON as f64,
    }
}

/// The largest relative difference among `a`'s failed outputs (NaN when one
/// is NaN or unknown).
pub(crate) fn worst_failed_rel(a: &Attempt) -> f64 {
    a.failed_outputs
        .iter()
        .map(|o| a.max_rel_diff.get(o).copied().unwrap_or(f64::NAN))
        .fold(0.0f64, |m, x| if x.is_nan() { f64::NAN } else { m.max(x) })
}

/// True when every failed output of `a` is off by rounding alone (a NaN or
/// unknown difference is not rounding).
pub(crate) fn within_rounding(a: &Attempt, dtype: DType) -> bool {
    let worst = worst_failed_rel(a);
    worst.is_finite() && worst <= rounding_level(dtype)
}

/// Relative tolerance of the op-by-op comparison (sums reorder across ranks).
fn layer_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-8,
        DType::F32 => 1e-3,
    }
}

/// Lower is better: failed outputs first, then how far off the worst is.
fn score(a: &Attempt) -> f64 {
    if a.error.is_some() {
        return f64::MAX;
    }
    let worst = a
        .max_rel_diff
        .values()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(0.0f64, f64::max)
        .min(1e6);
    a.failed_outputs.len() as f64 * 1e7 + worst
}

/// What the op-by-op comparison of a failed attempt needs.
struct LayerCheck<'a> {
    /// The reference trace.
    trace: &'a ddmlip_engine::Trace,
    /// Compare Edge rows too (runtime graph: owned-centred edges only).
    compare_edges: bool,
    /// Relative tolerance of an op's sum over ranks.
    tolerance: f64,
}

#[allow(clippy::too_many_arguments)]
fn run_attempt(
    model: &dyn Model,
    batch: &[System],
    options: &ValidateOptions,
    runner: &mut DecomposedRunner<'_>,
    spec: &MLIPSpec,
    rationale: String,
    reference: &EvalResult,
    halo_radius: f64,
    layers: &LayerCheck<'_>,
    number: usize,
) -> (Attempt, RunData) {
    let t0 = Instant::now();
    let result = runner(&EvalOptions {
        dtype: options.dtype,
        ranks: options.ranks,
        spec: Some(spec.clone()),
        trace: true,
        check_finite: true,
        timeout: options.timeout,
        device: options.device.clone(),
        ..Default::default()
    });
    let seconds = t0.elapsed().as_secs_f64();
    let mut attempt = Attempt {
        spec: spec.clone(),
        rationale,
        max_abs_diff: BTreeMap::new(),
        max_rel_diff: BTreeMap::new(),
        ratio: BTreeMap::new(),
        passed_outputs: Vec::new(),
        failed_outputs: Vec::new(),
        handler_counts: BTreeMap::new(),
        error: None,
        seconds,
        passed: false,
        diagnostics: AttemptDiagnostics::default(),
    };
    let partitions = partitions_for(model, batch, options.ranks, spec);
    attempt.diagnostics.partition_health = partitions
        .as_ref()
        .map(|parts| {
            parts
                .iter()
                .zip(batch)
                .map(|(p, s)| partition_health(p, s))
                .collect()
        })
        .unwrap_or_default();
    match result {
        Ok(res) => {
            let c = compare::compare(reference, &res, options.atol, options.rtol);
            attempt.max_abs_diff = c.max_abs.clone();
            attempt.max_rel_diff = c.max_rel.clone();
            attempt.ratio = c.ratio.clone();
            attempt.passed_outputs = c.passed.clone();
            attempt.failed_outputs = c.failed.clone();
            attempt.handler_counts = res.diagnostics.handler_counts.clone();
            attempt.passed =
                attempt.failed_outputs.is_empty() && !attempt.passed_outputs.is_empty();
            attempt.diagnostics.halo_completeness = diagnose::halo_completeness(
                batch,
                &res.diagnostics.partitions,
                Some(&res),
                halo_radius,
                model.uses_runtime_graph(),
            );
            // A failure by rounding alone (tolerances tighter than the
            // arithmetic) has no divergent op to look for.
            let beyond_rounding = !within_rounding(&attempt, options.dtype);
            if !attempt.passed && beyond_rounding {
                attempt.diagnostics.layer_divergence = diagnose::layer_divergence(
                    layers.trace,
                    &res.diagnostics.traces,
                    layers.compare_edges,
                    layers.tolerance,
                );
            }
            (
                attempt,
                RunData {
                    comparison: Some(c),
                },
            )
        }
        Err(e) => {
            attempt.error = Some(e.to_string());
            attempt.diagnostics.error =
                Some(diagnose::translate_error(&e, &format!("attempt {number}")));
            attempt.diagnostics.halo_completeness = partitions
                .and_then(|p| diagnose::halo_completeness(batch, &p, None, halo_radius, false));
            (attempt, RunData { comparison: None })
        }
    }
}

fn partitions_for(
    model: &dyn Model,
    batch: &[System],
    ranks: usize,
    spec: &MLIPSpec,
) -> Option<Vec<Partition>> {
    let width = ghost_width(model, spec, 0.0);
    batch
        .iter()
        .map(|s| partition_system(s, ranks, width).ok())
        .collect()
}

fn preflight(spec: &MLIPSpec, facts: &infer::TraceFacts) -> Preflight {
    let missing: Vec<_> = facts
        .opaque
        .iter()
        .filter(|op| spec.adapter(&op.name).is_none())
        .collect();
    if missing.is_empty() {
        return Preflight::default();
    }
    let adapters: Vec<_> = missing.iter().map(|op| infer::adapter_for(op).0).collect();
    Preflight {
        undeclared_opaque_ops: missing.iter().map(|op| op.name.clone()).collect(),
        spec_delta: Some(serde_json::json!({ "op_adapters": adapters })),
    }
}

fn reference_failed_report(
    model: &dyn Model,
    options: &ValidateOptions,
    prior: Option<MLIPSpec>,
    prior_source: &str,
    error: &EvalError,
    started: Instant,
) -> TraceReport {
    let t = diagnose::translate_error(error, "reference");
    let next_action = format!(
        "FAIL — the single-process reference run itself failed, so nothing was split: {}",
        t.advice
    );
    TraceReport {
        ok: false,
        model: model.name(),
        ranks: options.ranks,
        atol: options.atol,
        rtol: options.rtol,
        dtype: options.dtype,
        prior_source: prior_source.to_string(),
        spec: prior.unwrap_or_default(),
        attempts: Vec::new(),
        fix_applied: None,
        stop_reason: StopReason::ReferenceFailed,
        untried_fix: None,
        inferred: Vec::new(),
        next_action,
        diagnostics: Diagnostics {
            errors: vec![t],
            ..Default::default()
        },
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Upper bound of the model's graph radius: the cutoff when the model's own
/// graph fits inside it, else the first pair distance the graph excludes.
pub(crate) fn graph_upper(radius: Option<(f64, f64)>, cutoff: f64) -> f64 {
    match radius {
        Some((included, excluded)) if included > cutoff => excluded,
        _ => cutoff,
    }
}

/// Whether `spec` leaves scatters unexchanged (used by rendering).
pub(crate) fn is_local(spec: &MLIPSpec) -> bool {
    spec.policy.scatter == ScatterMode::Local
}

/// Why `spec` is no evidence for running `model` split over ranks, if it is
/// not: it was never validated (no `validated` record, as in a hand-written
/// spec), it was validated for another model (name or description differ),
/// its validation failed, or it passed on a degenerate split. `None` when
/// the spec passed validation for this model on a healthy split. The text
/// says what the record says; the caller adds how to validate.
pub fn spec_provenance_warning(spec: &MLIPSpec, model: &dyn Model) -> Option<String> {
    let Some(v) = &spec.validated else {
        return Some(
            "was never validated (it has no \"validated\" record): a wrong spec gives wrong \
             energies and forces without any error"
                .to_string(),
        );
    };
    let (name, description) = (model.name(), model.description());
    if v.model != name || v.model_description != description {
        return Some(format!(
            "was validated for model `{}` ({}), not for `{name}` ({description})",
            v.model, v.model_description
        ));
    }
    if !v.passed {
        return Some(format!(
            "FAILED validation for `{name}` on {} rank(s){}: the split run did not match the \
             single-process run",
            v.ranks,
            v.max_rel_diff
                .map(|d| format!(" (max relative difference {d:.2e})"))
                .unwrap_or_default()
        ));
    }
    if !v.partition_healthy {
        return Some(format!(
            "passed validation for `{name}` only on a degenerate split ({} atoms on {} rank(s), \
             some rank without remote atoms), which is no evidence that it is right",
            v.atoms, v.ranks
        ));
    }
    None
}
