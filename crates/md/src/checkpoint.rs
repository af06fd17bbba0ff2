//! The versioned checkpoint of an MD run: everything a restart needs to
//! continue the same trajectory bit for bit on the same rank count.
//!
//! JSON, with every floating-point number stored as its IEEE-754 bit
//! pattern (`u64`), so that nothing is rounded on the way through text.

use crate::config::ThermostatState;
use crate::MdError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The `format` field of every checkpoint.
pub const CHECKPOINT_FORMAT: &str = "ddmlip-md-checkpoint";
/// The layout version this build reads and writes.
pub const CHECKPOINT_VERSION: u32 = 1;

mod bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[[f64; 3]], s: S) -> Result<S::Ok, S::Error> {
        let b: Vec<[u64; 3]> = v
            .iter()
            .map(|r| [r[0].to_bits(), r[1].to_bits(), r[2].to_bits()])
            .collect();
        b.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[f64; 3]>, D::Error> {
        let b: Vec<[u64; 3]> = Vec::deserialize(d)?;
        Ok(b.iter()
            .map(|r| {
                [
                    f64::from_bits(r[0]),
                    f64::from_bits(r[1]),
                    f64::from_bits(r[2]),
                ]
            })
            .collect())
    }
}

/// The whole state of a run at one step. Per-atom arrays are indexed by
/// global atom id (the atom's row in the input structure).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Always [`CHECKPOINT_FORMAT`].
    pub format: String,
    /// [`CHECKPOINT_VERSION`] of the writer.
    pub version: u32,
    /// Steps done since the run began (restarts included).
    pub step: u64,
    /// Ensemble name (`nve`, `langevin`, …).
    pub ensemble: String,
    /// Seed of the random forces.
    pub seed: u64,
    /// Atomic numbers: a restart must use the same structure.
    pub numbers: Vec<u32>,
    /// Masses (u) as bit patterns.
    pub masses: Vec<u64>,
    /// Cell rows as bit patterns.
    pub cell: [[u64; 3]; 3],
    /// Current positions (Å).
    #[serde(with = "bits")]
    pub positions: Vec<[f64; 3]>,
    /// Current momenta (ASE units).
    #[serde(with = "bits")]
    pub momenta: Vec<[f64; 3]>,
    /// Unwrapped positions the last neighbour-list build started from (the
    /// skin reference is their wrapped image).
    #[serde(with = "bits")]
    pub build_positions: Vec<[f64; 3]>,
    /// Thermostat / barostat variables.
    pub thermostat: ThermostatState,
    /// Rank count of the writer (a restart on another count agrees to rounding).
    pub ranks: usize,
    /// Rebuilds and migrated atoms so far.
    pub rebuilds: u64,
    /// Atoms that changed owner so far (summed over ranks).
    pub migrated: u64,
    /// The domain boundaries in use (kept between load-balancing
    /// repartitions); a restart on the same rank count reuses them.
    /// Optional: without it a restart places fresh domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<ddmlip_domain::DomainMap>,
}

impl Checkpoint {
    /// Writes the checkpoint atomically: to a temporary file next to `path`,
    /// then renamed over it, so that a failure never leaves a truncated file
    /// in place of the last good one.
    pub fn write(&self, path: &Path) -> Result<(), MdError> {
        let text =
            serde_json::to_string(self).map_err(|e| MdError::Output(format!("checkpoint: {e}")))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        std::fs::write(&tmp, text)
            .map_err(|e| MdError::Output(format!("{}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(|e| MdError::Output(format!("{}: {e}", path.display())))
    }

    /// Reads a checkpoint, checking its format and version.
    pub fn read(path: &Path) -> Result<Self, MdError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| MdError::Input(format!("--restart {}: {e}", path.display())))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            MdError::Input(format!(
                "--restart {}: not a checkpoint: {e}",
                path.display()
            ))
        })?;
        if value.get("format").and_then(|v| v.as_str()) != Some(CHECKPOINT_FORMAT) {
            return Err(MdError::Input(format!(
                "--restart {}: field `format` is not \"{CHECKPOINT_FORMAT}\"",
                path.display()
            )));
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(CHECKPOINT_VERSION) => {}
            other => {
                return Err(MdError::Input(format!(
                    "--restart {}: field `version` is {}, this ddmlip reads version {CHECKPOINT_VERSION}",
                    path.display(),
                    other.map_or("missing".to_string(), |v| v.to_string())
                )))
            }
        }
        let ck: Checkpoint = serde_json::from_value(value)
            .map_err(|e| MdError::Input(format!("--restart {}: {e}", path.display())))?;
        let n = ck.numbers.len();
        for (name, len) in [
            ("masses", ck.masses.len()),
            ("positions", ck.positions.len()),
            ("momenta", ck.momenta.len()),
            ("build_positions", ck.build_positions.len()),
        ] {
            if len != n {
                return Err(MdError::Input(format!(
                    "--restart {}: field `{name}` has {len} rows for {n} atoms",
                    path.display()
                )));
            }
        }
        Ok(ck)
    }

    /// The cell as numbers.
    pub fn cell_matrix(&self) -> [[f64; 3]; 3] {
        self.cell.map(|r| r.map(f64::from_bits))
    }

    /// The masses as numbers.
    pub fn mass_values(&self) -> Vec<f64> {
        self.masses.iter().map(|&b| f64::from_bits(b)).collect()
    }
}

pub(crate) use ddmlip_domain::serde_bits::{scalar_bits, vec_bits};
