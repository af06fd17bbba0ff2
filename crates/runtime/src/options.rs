//! How to run an evaluation: [`EvalOptions`] and [`BalancePolicy`].

use ddmlip_domain::Balance;
pub use ddmlip_engine::device::EngineDevice;
use ddmlip_engine::DType;
use ddmlip_spec::MLIPSpec;
use std::time::Duration;

/// How to run an evaluation.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Precision of the whole evaluation (f64 by default).
    pub dtype: DType,
    /// 1 runs in this process without decomposition.
    pub ranks: usize,
    /// The spec for decomposed runs; `None` uses the model's declared one
    /// (or the standard energy-model spec).
    pub spec: Option<MLIPSpec>,
    /// Record traces of every rank.
    pub trace: bool,
    /// Fail on the first op that produces NaN/inf, naming it.
    pub check_finite: bool,
    /// Time every op of the forward and backward passes by op name
    /// ([`EvalDiagnostics::profiles`](crate::EvalDiagnostics::profiles));
    /// off by default (on, it costs a clock read per op).
    pub profile: bool,
    /// Extra ghost width beyond `halo_depth × cutoff` (Å).
    pub skin: f64,
    /// Deadline of every blocking communication call.
    pub timeout: Duration,
    /// Run even when atoms are closer than [`MIN_DISTANCE`] (tests only).
    pub allow_close_atoms: bool,
    /// Threads of each rank's own worker pool in a decomposed threads-backend
    /// run; 0 picks the available cores / ranks (at least 1). Private pools
    /// keep a rank's parallel work on its own cores, as separate processes
    /// would. Single-process runs use the caller's rayon pool.
    pub threads_per_rank: usize,
    /// How domain boundaries are placed in a decomposed run.
    pub balance: BalancePolicy,
    /// Threads backend: ranks waiting for a message run pieces of the ops
    /// of ranks still working (`ddmlip_engine::helpers`). Results are the
    /// same bits whoever runs a piece.
    pub work_sharing: bool,
    /// Where the ops that have a device kernel run; `None`: the host.
    /// Ranks given a device exchange their halos through the host.
    pub device: Option<EngineDevice>,
}

/// How a decomposed run places its domain boundaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BalancePolicy {
    /// A regular grid in fractional coordinates.
    #[default]
    Geometric,
    /// Staggered cuts giving every rank about the same number of atoms:
    /// slabs along the first split axis, columns within each slab, boxes
    /// within each column. Evens out slabs, clusters and other uneven
    /// systems; atoms that share a coordinate (a lattice plane) stay on one
    /// side of a cut, so counts are as even as the planes allow.
    Atoms,
}

impl BalancePolicy {
    /// The partitioner's setting for this policy.
    pub fn partition_balance(self) -> Balance<'static> {
        match self {
            Self::Geometric => Balance::Geometric,
            Self::Atoms => Balance::EvenCounts,
        }
    }
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F64,
            ranks: 1,
            spec: None,
            trace: false,
            check_finite: false,
            profile: false,
            skin: 0.0,
            timeout: Duration::from_secs(120),
            allow_close_atoms: false,
            threads_per_rank: 0,
            balance: BalancePolicy::Geometric,
            work_sharing: true,
            device: None,
        }
    }
}

/// Most ranks the threads backend starts (one OS thread each).
pub const MAX_THREAD_RANKS: usize = 1024;

/// Atoms closer than this (Å) are rejected: most potentials diverge there.
pub const MIN_DISTANCE: f64 = 1e-6;
