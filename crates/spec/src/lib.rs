//! `MLIPSpec`: a small, versioned JSON document that says what each model
//! output means and which distributed mode each op pattern uses
//! (docs/design.md §2). Pure data: the engine reads it, `validate` infers it.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// The only spec version this build reads and writes.
pub const SPEC_VERSION: u32 = 1;

/// Errors reading or checking a spec.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Text that is not JSON, or JSON that does not fit the spec's schema.
    #[error("spec is not valid JSON for MLIPSpec: {0}")]
    Json(#[from] serde_json::Error),
    #[error("spec version {found} is not supported (this build reads version {SPEC_VERSION})")]
    /// A `version` other than [`SPEC_VERSION`].
    Version {
        /// The version the spec states.
        found: u64,
    },
    #[error("spec has no \"version\" field; add \"version\": {SPEC_VERSION}")]
    /// No `version` field.
    MissingVersion,
    /// A spec file that cannot be read.
    #[error("cannot read spec file {path}: {source}")]
    Io {
        /// The file as given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A spec that parses but has an impossible value (a non-integer
    /// version, a zero halo depth, a bad adapter position), in words.
    #[error("invalid spec: {0}")]
    Invalid(String),
    /// An error of the spec file at `path`.
    #[error("spec file {path}: {source}")]
    /// Any other error, in the named file.
    InFile {
        /// The file as given.
        path: String,
        /// The error in it.
        #[source]
        source: Box<SpecError>,
    },
}

/// Storage policy of the decomposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Each rank holds owned atoms plus ghost copies within the halo.
    #[default]
    Halo,
}

/// What an Edge → Atom scatter-add means across ranks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum ScatterMode {
    /// Partial sums may land on ghost rows: reverse-sum them to owners, then refresh ghosts.
    #[default]
    HaloCorrection,
    /// Owner rows are complete: refresh ghost rows from owners only.
    Refresh,
    /// No exchange: the model's own graph already covers everything it needs.
    Local,
}

/// What an Atom → Edge gather means across ranks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum GatherMode {
    /// Read ghost rows locally, refreshing them first when they may be stale.
    #[default]
    HaloRead,
    /// Read whatever the local rows hold.
    Local,
}

/// The decomposition policy block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// How atoms are split over ranks.
    #[serde(default)]
    pub kind: PolicyKind,
    /// How scatters (sums onto centres) combine across ranks.
    #[serde(default)]
    pub scatter: ScatterMode,
    /// How gathers (reads of neighbour rows) see ghost rows.
    #[serde(default)]
    pub gather: GatherMode,
}

/// What an output's rows mean, which decides how ranks' pieces are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// One row per atom: owned rows are gathered by global atom id.
    PerAtom,
    /// One row per system.
    PerSystem,
    /// A single global value.
    Global,
}

/// Transform applied to an opaque op's input before the kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum InputTransform {
    /// Pass only the owned rows.
    SliceOwned,
    /// Refresh ghost rows from their owners, then pass all local rows.
    GatherHalo,
}

/// Transform applied to an opaque op's output after the kernel ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum OutputTransform {
    /// Output rows are partial sums over local rows: reverse-sum ghosts to owners, refresh.
    ScatterOutputs,
    /// Output is a per-rank partial of a replicated value: all-reduce (sum).
    AllReduceSum,
    /// Output was computed for owned rows only: pad ghost rows by a refresh.
    SliceOutputsOwned,
}

/// How the runtime wraps one opaque op, by op name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpAdapter {
    /// The opaque op's name (`OpaqueKernel::name`).
    pub op: String,
    /// Input position (as a string, JSON-object style) → transform.
    #[serde(default)]
    pub inputs: BTreeMap<String, InputTransform>,
    /// Output position → transform.
    #[serde(default)]
    pub outputs: BTreeMap<String, OutputTransform>,
}

/// What a spec was validated for: written by `ddmlip validate --spec-out`
/// beside the spec fields, read by `ddmlip eval --spec` to warn when a spec
/// is used for a model it was never validated with. It records evidence and
/// changes nothing about how the spec is applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validation {
    /// Model name (`ddmlip models`, or the name a model file declares).
    pub model: String,
    /// The model's one-line description (kind, parameters, layers, cutoff):
    /// with the name, what identifies the model.
    pub model_description: String,
    /// Ranks of the decomposed run that was compared.
    pub ranks: usize,
    /// Precision of the runs (`f64` or `f32`).
    pub dtype: String,
    /// Absolute tolerance per output (output units).
    pub atol: f64,
    /// Relative tolerance per output.
    pub rtol: f64,
    /// True when every output matched the single-process run within tolerance.
    pub passed: bool,
    /// Largest relative difference over all outputs of the validated run
    /// (`null` when that run did not complete).
    pub max_rel_diff: Option<f64>,
    /// Frames and atoms of the validated batch.
    pub frames: usize,
    /// Atoms over all frames of the validated batch.
    pub atoms: usize,
    /// False when the split was degenerate (a rank without remote atoms), so
    /// that a pass is no evidence that the spec is right.
    pub partition_healthy: bool,
}

/// The distribution spec of a model (docs/design.md §2, version 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MLIPSpec {
    /// Schema version; [`SPEC_VERSION`] is the one this build reads.
    pub version: u32,
    /// How atoms are split and how scatters and gathers cross ranks.
    #[serde(default)]
    pub policy: Policy,
    /// Atom → System reductions sum owned rows only, then all-reduce.
    #[serde(default = "default_true")]
    pub system_reductions: bool,
    /// Output name → what its rows mean (decides how ranks' pieces combine);
    /// `validate` fills in the outputs a spec leaves out from a run.
    #[serde(default)]
    pub output_kinds: BTreeMap<String, OutputKind>,
    /// Outputs whose ghost rows are dropped (only owned rows are reported).
    #[serde(default)]
    pub owned_only_outputs: Vec<String>,
    /// Outputs that are per-rank partials and must be summed over ranks.
    #[serde(default)]
    pub all_reduce_outputs: Vec<String>,
    /// How each opaque op is fed and how its output is combined.
    #[serde(default)]
    pub op_adapters: Vec<OpAdapter>,
    /// Ghost region width in units of the cutoff (1 = one cutoff of ghosts).
    #[serde(default = "default_depth")]
    pub halo_depth: u32,
    /// What the spec was validated for, when `validate` saved it. Absent in
    /// hand-written specs; not part of the spec's meaning ([`MLIPSpec::signature`]
    /// ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated: Option<Validation>,
}

fn default_true() -> bool {
    true
}

fn default_depth() -> u32 {
    1
}

impl Default for MLIPSpec {
    fn default() -> Self {
        Self {
            version: SPEC_VERSION,
            policy: Policy::default(),
            system_reductions: true,
            output_kinds: BTreeMap::new(),
            owned_only_outputs: Vec::new(),
            all_reduce_outputs: Vec::new(),
            op_adapters: Vec::new(),
            halo_depth: 1,
            validated: None,
        }
    }
}

impl MLIPSpec {
    /// The spec that is right for an energy model whose graph is built by the
    /// runtime: halo correction, system reductions, forces per atom, stress all-reduced.
    pub fn standard_energy_model() -> Self {
        let mut s = Self::default();
        s.output_kinds
            .insert("energy".into(), OutputKind::PerSystem);
        s.output_kinds
            .insert("atomic_energies".into(), OutputKind::PerAtom);
        s.output_kinds.insert("forces".into(), OutputKind::PerAtom);
        s.output_kinds
            .insert("stress".into(), OutputKind::PerSystem);
        s.all_reduce_outputs.push("stress".into());
        s
    }

    /// Parses a spec from JSON, rejecting unknown fields and versions.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        let raw: serde_json::Value = serde_json::from_str(text)?;
        match raw.get("version") {
            None => return Err(SpecError::MissingVersion),
            Some(v) => match v.as_u64() {
                Some(n) if n == SPEC_VERSION as u64 => {}
                Some(n) => return Err(SpecError::Version { found: n }),
                None => {
                    return Err(SpecError::Invalid(format!(
                        "\"version\" must be an integer, found {v}"
                    )))
                }
            },
        }
        let spec: MLIPSpec = serde_json::from_value(raw)?;
        spec.check()?;
        Ok(spec)
    }

    /// Reads a spec file.
    pub fn load(path: &std::path::Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text).map_err(|e| SpecError::InFile {
            path: path.display().to_string(),
            source: Box::new(e),
        })
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// Checks internal consistency.
    pub fn check(&self) -> Result<(), SpecError> {
        if self.halo_depth == 0 {
            return Err(SpecError::Invalid("halo_depth must be at least 1".into()));
        }
        for a in &self.op_adapters {
            for k in a.inputs.keys().chain(a.outputs.keys()) {
                if k.parse::<usize>().is_err() {
                    return Err(SpecError::Invalid(format!(
                        "op adapter for \"{}\": position \"{k}\" is not a non-negative integer",
                        a.op
                    )));
                }
            }
        }
        Ok(())
    }

    /// The adapter declared for an opaque op, if any.
    pub fn adapter(&self, op: &str) -> Option<&OpAdapter> {
        self.op_adapters.iter().find(|a| a.op == op)
    }

    /// A canonical string identifying the spec (for de-duplicating attempts).
    pub fn signature(&self) -> String {
        let mut s = self.clone();
        s.validated = None;
        s.owned_only_outputs.sort();
        s.owned_only_outputs.dedup();
        s.all_reduce_outputs.sort();
        s.all_reduce_outputs.dedup();
        s.op_adapters.sort_by(|a, b| a.op.cmp(&b.op));
        serde_json::to_string(&s).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_json() {
        let mut s = MLIPSpec::standard_energy_model();
        s.op_adapters.push(OpAdapter {
            op: "k".into(),
            inputs: [("0".to_string(), InputTransform::SliceOwned)].into(),
            outputs: [("0".to_string(), OutputTransform::AllReduceSum)].into(),
        });
        let back = MLIPSpec::from_json(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn documented_shape_parses() {
        let text = r#"{"version": 1, "policy": {"kind": "halo", "scatter": "refresh", "gather": "halo_read"},
          "system_reductions": true, "output_kinds": {"energy": "per_system", "forces": "per_atom"},
          "owned_only_outputs": [], "all_reduce_outputs": ["stress"],
          "op_adapters": [{"op": "NAME", "inputs": {"0": "gather_halo"}, "outputs": {"0": "scatter_outputs"}}],
          "halo_depth": 1}"#;
        let s = MLIPSpec::from_json(text).unwrap();
        assert_eq!(s.policy.scatter, ScatterMode::Refresh);
        assert_eq!(
            s.op_adapters[0].outputs["0"],
            OutputTransform::ScatterOutputs
        );
    }

    #[test]
    fn unknown_field_and_version_are_errors() {
        let e = MLIPSpec::from_json(r#"{"version": 1, "bogus": 3}"#).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = MLIPSpec::from_json(r#"{"version": 7}"#).unwrap_err();
        assert!(e.to_string().contains("version 7"), "{e}");
        let e = MLIPSpec::from_json(r#"{"policy": {}}"#).unwrap_err();
        assert!(matches!(e, SpecError::MissingVersion));
        let e = MLIPSpec::from_json(r#"{"version": 1, "policy": {"scatter": "sideways"}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("sideways"), "{e}");
    }

    #[test]
    fn validation_record_round_trips_and_is_not_part_of_the_meaning() {
        let plain = MLIPSpec::standard_energy_model();
        // A hand-written spec has no record, and writing one adds no field.
        assert!(!plain.to_json().contains("validated"));
        let mut recorded = plain.clone();
        recorded.validated = Some(Validation {
            model: "lj".into(),
            model_description: "Lennard-Jones".into(),
            ranks: 4,
            dtype: "f64".into(),
            atol: 1e-8,
            rtol: 1e-10,
            passed: true,
            max_rel_diff: Some(3e-15),
            frames: 1,
            atoms: 864,
            partition_healthy: true,
        });
        let back = MLIPSpec::from_json(&recorded.to_json()).unwrap();
        assert_eq!(back, recorded);
        assert_eq!(back.signature(), plain.signature());
        let mut text: serde_json::Value = serde_json::from_str(&recorded.to_json()).unwrap();
        text["validated"]["bogus"] = serde_json::json!(1);
        let e = MLIPSpec::from_json(&text.to_string()).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn signature_ignores_list_order() {
        let a = MLIPSpec {
            all_reduce_outputs: vec!["x".into(), "y".into()],
            ..Default::default()
        };
        let b = MLIPSpec {
            all_reduce_outputs: vec!["y".into(), "x".into()],
            ..Default::default()
        };
        assert_eq!(a.signature(), b.signature());
    }
}
