//! The ddmlip runtime: runs a model on a batch of systems, in one process or
//! split over ranks by spatial domain decomposition, and consolidates every
//! output per global atom id.
//!
//! - [`evaluate`] runs once; an [`Evaluator`] runs again and again and keeps
//!   every rank's memory between calls (MD steps, benchmarks).
//! - [`EvalOptions`] says how: precision, ranks, spec, tracing, balance.
//! - [`EvalResult`] holds energies, forces, stress and the model's other
//!   outputs, with per-rank sizes and timings.
//! - [`evaluate_on_communicator`] runs this process's rank when ranks are
//!   separate processes (MPI).
//!
//! Partitioning, halo plans and partition health live in `ddmlip-domain`;
//! this crate puts them to work.

#![forbid(unsafe_code)]

mod consolidate;
mod error;
mod evaluator;
mod inputs;
mod options;
mod rank;
mod results;
mod single;
mod split;
mod threads;

pub use error::EvalError;
pub use evaluator::{evaluate, Evaluator};
pub use inputs::check_batch;
pub use options::{BalancePolicy, EngineDevice, EvalOptions, MAX_THREAD_RANKS, MIN_DISTANCE};
pub use rank::{evaluate_on_communicator, RankResult};
pub use results::{EvalDiagnostics, EvalResult, OutputData, RankTimings, NEIGHBOR_COUNTS};
pub use split::{effective_spec, ghost_width};
