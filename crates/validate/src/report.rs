//! What a validation returns: the [`TraceReport`] with every attempt, the
//! inferred spec fields, and diagnostics in causal order.

use crate::render;
use ddmlip_domain::PartitionHealth;
use ddmlip_engine::DType;
use ddmlip_spec::MLIPSpec;
use serde::Serialize;
use std::collections::BTreeMap;

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
