//! The error type of an evaluation.

use ddmlip_engine::EngineError;
use thiserror::Error;

/// Errors of a model evaluation.
#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum EvalError {
    /// The input cannot be evaluated (empty system, unsupported element, …).
    #[error("{0}")]
    Input(String),
    /// The model or an op failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A rank failed; every other rank was released.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank that failed.
        rank: usize,
        /// Its error, in words.
        message: String,
    },
}
