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

use ddmlip_atoms::System;
use ddmlip_domain::{partition_health, partition_system, Partition, PartitionHealth};
use ddmlip_engine::{DType, Model};
use ddmlip_runtime::{evaluate, ghost_width, EvalError, EvalOptions, EvalResult};
use ddmlip_spec::{MLIPSpec, ScatterMode, Validation};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use thiserror::Error;

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

/// One spec field that was inferred rather than taken from the prior.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inferred {
    /// Dotted field path, e.g. `policy.scatter`, `op_adapters.NAME`.
    pub field: String,
    /// The inferred value (JSON).
    pub value: serde_json::Value,
    /// The trace evidence behind it.
    pub evidence: String,
}

/// One validated spec.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// The spec this attempt ran the decomposed evaluation with.
    pub spec: MLIPSpec,
    /// Why this spec was tried.
    pub rationale: String,
    /// Largest |decomposed − reference| per output (output units).
    pub max_abs_diff: BTreeMap<String, f64>,
    /// `max_abs_diff / max |reference|` per output.
    pub max_rel_diff: BTreeMap<String, f64>,
    /// Least-squares scale of decomposed onto reference values per output
    /// (≈ 1 right, ≈ ranks for an extra all-reduce, ≈ 2 for a double count).
    pub ratio: BTreeMap<String, f64>,
    /// Outputs within `atol + rtol·max|reference|`.
    pub passed_outputs: Vec<String>,
    /// Outputs beyond that tolerance.
    pub failed_outputs: Vec<String>,
    /// Distributed handler firings summed over ranks (empty when the run failed).
    pub handler_counts: BTreeMap<String, usize>,
    /// The run's error, when it did not complete.
    pub error: Option<String>,
    /// Wall time of the decomposed run (s).
    pub seconds: f64,
    /// True when the run completed and every output passed.
    pub passed: bool,
    /// What this attempt's run showed: its split, its halo, where it first
    /// diverged, its translated error.
    pub diagnostics: AttemptDiagnostics,
}

impl Attempt {
    /// True when the run completed and every output passed.
    pub fn passed(&self) -> bool {
        self.passed
    }
}

/// The diagnostics of one attempt (its spec's ghost width and handlers).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AttemptDiagnostics {
    /// Health of every system's split under this attempt's spec.
    pub partition_health: Vec<PartitionHealth>,
    /// Whether every owned atom saw its single-process neighbourhood (`None` when not checked).
    pub halo_completeness: Option<HaloCompleteness>,
    /// The first op whose sum over ranks departs from the reference (failed
    /// attempts that completed).
    pub layer_divergence: Option<LayerDivergence>,
    /// The run's error, translated (attempts that did not complete).
    pub error: Option<TranslatedError>,
}

/// Why the search over specs ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An attempt passed.
    Passed,
    /// Auto-fix was off: only the starting spec was run.
    AutofixOff,
    /// `max_attempts` specs were tried; a rule had more to try.
    MaxAttempts,
    /// No rule proposed a spec that had not been tried.
    NoFurtherRule,
    /// The single-process reference failed, so nothing was split.
    ReferenceFailed,
}

/// One owned atom whose neighbour count differs from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct MissingNeighbors {
    /// Global atom id (batch order).
    pub atom: usize,
    /// System (frame) index.
    pub system: usize,
    /// Owning rank.
    pub rank: usize,
    /// Neighbours in one process.
    pub expected: usize,
    /// Neighbours seen on the rank (`None` when not reported).
    pub seen: Option<usize>,
}

/// Does every owned atom see its single-process neighbourhood?
#[derive(Debug, Clone, Serialize)]
pub struct HaloCompleteness {
    /// True when no checked atom misses a neighbour.
    pub verified: bool,
    /// Radius checked (Å): the runtime cutoff, or the model's own graph radius.
    pub radius: f64,
    /// Ghost width of the run (Å).
    pub ghost_width: f64,
    /// Where the counts come from.
    pub source: String,
    /// Owned atoms whose counts were compared.
    pub atoms_checked: usize,
    /// Of those, atoms with fewer neighbours than in one process.
    pub atoms_missing: usize,
    /// Up to 10 atoms that miss neighbours.
    pub examples: Vec<MissingNeighbors>,
    /// What the result means for the spec, in one sentence.
    pub interpretation: String,
}

/// The first forward op whose sum over ranks departs from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct LayerDivergence {
    /// False when every compared op agreed.
    pub first_divergent: bool,
    /// Name of the op (the last compared one when none diverged).
    pub op: String,
    /// The model's scope labels at that op, `/`-joined.
    pub scope: String,
    /// Position of the op in the reference trace.
    pub seq: usize,
    /// Sum of the op's output in the single-process run.
    pub reference_sum: f64,
    /// Sum over ranks of the op's owned output (NaN when a rank lacks the op).
    pub ranks_sum: f64,
    /// |ranks_sum − reference_sum| relative to |reference_sum| (∞ when missing).
    pub rel_diff: f64,
    /// Ops compared up to (and including) the verdict.
    pub checked: usize,
    /// Largest relative difference over the ops compared.
    pub max_rel_diff: f64,
    /// What the divergence points to, in one sentence.
    pub note: String,
}

/// An error, translated into its cause.
#[derive(Debug, Clone, Serialize)]
pub struct TranslatedError {
    /// `reference` or `attempt N`.
    pub stage: String,
    /// `severed_gradient`, `non_finite`, `rank_failed`, `communication`, `error`.
    pub kind: String,
    /// The failed rank, when one failed.
    pub rank: Option<usize>,
    /// The op at fault, when known.
    pub op: Option<String>,
    /// The raw error text.
    pub message: String,
    /// What it means and what to do.
    pub advice: String,
}

/// Opaque ops the starting spec does not declare, with a paste-able delta.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Preflight {
    /// Opaque ops in the reference trace without an adapter in the starting spec.
    pub undeclared_opaque_ops: Vec<String>,
    /// `{"op_adapters": [...]}` to merge into the spec, when any.
    pub spec_delta: Option<serde_json::Value>,
}

/// How far the model reaches, read from the reference trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReceptiveField {
    /// Message-passing depth: hops along the model's edges (each up to one
    /// graph radius) between an atom's deepest feature and the farthest
    /// position it reads. Fused ops count as what they do: a message-passing
    /// op reads its node inputs one edge away.
    pub hops: u32,
    /// Scope of the op where `hops` is attained.
    pub scope: String,
    /// Edge → Atom scatter-adds in the forward pass, fused ones (pair sums,
    /// message passing) included.
    pub edge_scatters: usize,
}

/// Diagnostics in causal order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Diagnostics {
    /// The model's receptive field (`None` when the reference run failed).
    pub receptive_field: Option<ReceptiveField>,
    /// Health of every system's split under the reported spec.
    pub partition_health: Vec<PartitionHealth>,
    /// Halo completeness under the reported spec (`None` when not checked).
    pub halo_completeness: Option<HaloCompleteness>,
    /// Where the reported spec's run first departs from the reference (failed runs).
    pub layer_divergence: Option<LayerDivergence>,
    /// Every run error met, translated, in the order met.
    pub errors: Vec<TranslatedError>,
    /// Opaque ops the starting spec does not declare.
    pub preflight: Preflight,
}

/// The verdict.
#[derive(Debug, Clone, Serialize)]
pub struct TraceReport {
    /// True when a spec made every output match within tolerance.
    pub ok: bool,
    /// The model's name.
    pub model: String,
    /// Ranks of the decomposed runs.
    pub ranks: usize,
    /// Absolute tolerance per output (output units).
    pub atol: f64,
    /// Relative tolerance per output (relative to max |reference|).
    pub rtol: f64,
    /// Precision of both runs.
    pub dtype: DType,
    /// Where the starting spec came from: `--spec`, `model`, or `inferred`.
    pub prior_source: String,
    /// The working spec, or the best failing one.
    pub spec: MLIPSpec,
    /// Every spec tried, in order.
    pub attempts: Vec<Attempt>,
    /// Rationale of the fix that made it pass (null when the first spec passed or none did).
    pub fix_applied: Option<String>,
    /// Why the search ended.
    pub stop_reason: StopReason,
    /// The fix a rule would try next, when the search ended before trying
    /// it (auto-fix off, or `max_attempts` reached).
    pub untried_fix: Option<String>,
    /// Spec fields inferred from the reference run, with their evidence.
    pub inferred: Vec<Inferred>,
    /// One actionable instruction.
    pub next_action: String,
    /// Evidence in causal order: receptive field, partition health, halo, divergence, errors.
    pub diagnostics: Diagnostics,
    /// Wall time of the whole validation (s).
    pub seconds: f64,
}

impl TraceReport {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// Multi-line text for humans.
    pub fn render(&self) -> String {
        render::render(self)
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
