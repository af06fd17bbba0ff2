use thiserror::Error;

/// Errors raised while building or differentiating a graph.
#[derive(Debug, Error, Clone)]
pub enum EngineError {
    /// Inputs of an op do not fit together (a bug in model code or a bad model file).
    #[error("op `{op}`: {message}")]
    Shape { op: String, message: String },
    /// A communication step of a distributed op failed (a peer failed, a timeout…).
    #[error("communication failed in `{op}`: {message}")]
    Comm { op: String, message: String },
    /// An opaque kernel reported an error.
    #[error("opaque op `{op}` failed: {message}")]
    Kernel { op: String, message: String },
    /// Gradient requested through an op that has no backward.
    #[error("op `{op}` has no backward pass, so the gradient path from the inputs to the output is severed there")]
    NoBackward { op: String },
    /// The output does not depend on the requested input through differentiable ops.
    #[error(
        "the output does not depend on `{what}` through differentiable ops (severed gradient path)"
    )]
    SeveredGradient { what: String },
    /// A value became NaN or infinite.
    #[error("op `{op}` produced a non-finite value ({what})")]
    NonFinite { op: String, what: String },
    /// An op was recorded on the output of a deferred all-reduce, which
    /// holds only this rank's partial (see `Graph::defer_all_reduces`): the
    /// caller repeats the evaluation with all-reduces completed eagerly.
    #[error("op `{op}` reads a deferred all-reduce; evaluate again without deferral")]
    DeferredSumRead { op: String },
    /// Anything a model reports about its input (species, geometry…).
    #[error("{0}")]
    Input(String),
}

impl EngineError {
    pub(crate) fn shape(op: &str, message: impl Into<String>) -> Self {
        Self::Shape {
            op: op.to_string(),
            message: message.into(),
        }
    }
}
