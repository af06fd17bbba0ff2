//! Molecular dynamics on a domain-decomposed system.
//!
//! Each rank keeps its share of the system across steps ([`RankState`]):
//! owned atoms with positions, momenta, masses and global ids, ghost images
//! refreshed from their owners every step through the halo plan, and a pair
//! list built with a skin. When some atom has moved more than half the skin
//! since the last build (decided over all ranks), atoms migrate to their new
//! owners and ghosts, plan and pairs are rebuilt. Integrators ([`Ensemble`])
//! work on owned atoms; global quantities are reduced once per step in rank
//! order. Random forces come from a counter-based generator keyed by (seed,
//! global atom id, step), so a trajectory does not depend on the rank count.
//!
//! Units are ASE's (see [`units`]): Å, eV, u, and momenta as `ase.io.write`
//! stores them.

mod checkpoint;
mod collective;
mod config;
mod driver;
mod force_field;
mod mat3;
mod phases;
pub mod process;
mod progress;
pub mod rank_eval;
mod relax;
pub mod rng;
mod sink;
mod state;
mod threads;
pub mod units;

pub use checkpoint::{Checkpoint, CHECKPOINT_FORMAT, CHECKPOINT_VERSION};
pub use config::{
    maxwell_boltzmann, CellDof, Ensemble, MdConfig, StartState, ThermostatState,
    DEFAULT_MAX_IMBALANCE, DEFAULT_REPARTITION_EVERY,
};
pub use driver::{run_rank, run_rank_with_force_field, run_with_force_field};
pub use force_field::{
    strain_gradient_of_stress, ExternalForces, RankForceField, SystemEnergy, SystemForceField,
};
pub use phases::{EvalPhases, StepPhases};
pub use progress::{StepObserver, StepProgress};
pub use rank_eval::{LocalRows, RankEvaluator, RankForces};
pub use relax::{
    relax_rank, relax_rank_with_force_field, relax_with_force_field, CellRelax, RelaxConfig,
    RelaxSummary,
};
pub use sink::{Frame, MdSink, MdSummary, RankSpread, StepTraffic, ThermoRow};
pub use state::{gather_by_gid, BuildOptions, RankState, Rows, Share, Topology};
pub use threads::{relax_threads, relax_threads_with_fields, run_threads, run_threads_with_fields};

use ddmlip_engine::EngineError;
use thiserror::Error;

/// Errors of an MD run.
#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum MdError {
    /// Bad input: an impossible setting, a structure the run cannot use, a
    /// checkpoint that does not fit.
    #[error("{0}")]
    Input(String),
    /// The model or an op failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Communication between ranks failed.
    #[error("communication: {0}")]
    Comm(String),
    /// An atom was lost or duplicated by a migration (a bug, never input).
    #[error("atom bookkeeping broken: {0}")]
    Ownership(String),
    /// The energy or a force became NaN or infinite.
    #[error(
        "step {step}: {what} is not finite; the run stopped (the last checkpoint written is kept)"
    )]
    NonFinite {
        /// The step whose evaluation was not finite.
        step: u64,
        /// What was not finite ("the energy", "a force").
        what: String,
    },
    /// Stopped on request (SIGINT) after writing a checkpoint.
    #[error("interrupted at step {step}; checkpoint written")]
    Interrupted {
        /// The step after which the run stopped.
        step: u64,
    },
    /// Writing output failed.
    #[error("{0}")]
    Output(String),
    /// A rank failed.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank that failed.
        rank: usize,
        /// Its error, as it reported it.
        message: String,
    },
    /// A whole-system force field (e.g. a GPU model) failed.
    #[error("force field: {0}")]
    ForceField(String),
    /// Broken internal invariant.
    #[error("internal error: {0}")]
    Internal(String),
}
