use std::sync::Arc;
use thiserror::Error;

/// Errors raised while building or differentiating a graph.
#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum EngineError {
    /// Inputs of an op do not fit together (a bug in model code or a bad model file).
    #[error("op `{op}`: {message}")]
    Shape {
        /// The op being recorded (its trace name).
        op: String,
        /// What does not fit, in words.
        message: String,
    },
    /// A communication step of a distributed op failed (a peer failed, a timeout…).
    #[error("communication failed in `{op}`: {message}")]
    Comm {
        /// The distributed op or handler that communicated.
        op: String,
        /// The communicator's error, in words.
        message: String,
    },
    /// A user kernel (opaque, row-wise or message) reported an error.
    #[error("opaque op `{op}` failed: {source}")]
    Kernel {
        /// The kernel's name (`OpaqueKernel::name`).
        op: String,
        /// What the kernel reported.
        #[source]
        source: KernelError,
    },
    /// Gradient requested through an op that has no backward.
    #[error("op `{op}` has no backward pass, so the gradient path from the inputs to the output is severed there")]
    NoBackward {
        /// The op without a backward.
        op: String,
    },
    /// The output does not depend on the requested input through differentiable ops.
    #[error(
        "the output does not depend on `{what}` through differentiable ops (severed gradient path)"
    )]
    SeveredGradient {
        /// The input the gradient was asked for (`positions`, `strain`…).
        what: String,
    },
    /// A value became NaN or infinite.
    #[error("op `{op}` produced a non-finite value ({what})")]
    NonFinite {
        /// The op whose output is not finite.
        op: String,
        /// Which value (the output, a gradient…), in words.
        what: String,
    },
    /// An op was recorded on the output of a deferred all-reduce, which
    /// holds only this rank's partial (see `Graph::defer_all_reduces`): the
    /// caller repeats the evaluation with all-reduces completed eagerly.
    #[error("op `{op}` reads a deferred all-reduce; evaluate again without deferral")]
    DeferredSumRead {
        /// The op that read the partial sum.
        op: String,
    },
    /// A tensor's value was read after the caller released it
    /// (`Graph::release`): a bug in the code that records the graph.
    #[error("the output of op `{op}` was read after its value was released")]
    Released {
        /// The op whose output was released.
        op: String,
    },
    /// The device an op ran on failed (allocation, launch, transfer).
    #[error("op `{op}` on the device: {message}")]
    Device {
        /// The op (or transfer) that failed.
        op: String,
        /// The device's error, in words.
        message: String,
    },
    /// Anything a model reports about its input (species, geometry…).
    #[error("{0}")]
    Input(String),
}

impl EngineError {
    pub(crate) fn device(op: &str, e: crate::device::DeviceError) -> Self {
        Self::Device {
            op: op.to_string(),
            message: e.0,
        }
    }

    pub(crate) fn shape(op: &str, message: impl Into<String>) -> Self {
        Self::Shape {
            op: op.to_string(),
            message: message.into(),
        }
    }
}

/// Why a user kernel ([`OpaqueKernel`](crate::OpaqueKernel) or
/// [`MessageKernel`](crate::MessageKernel)) could not run. The graph wraps it
/// in [`EngineError::Kernel`] with the op's name.
#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum KernelError {
    /// An input has `got` columns where the kernel was built for `expected`.
    #[error("expects {expected} columns, got {got}")]
    Columns {
        /// Columns the kernel takes.
        expected: usize,
        /// Columns of the input it was given.
        got: usize,
    },
    /// The inputs' count, row domains or shapes are not what the kernel
    /// takes; `expected` describes what it takes ("one Atom×1 input").
    #[error("expects {expected}")]
    Inputs {
        /// What the kernel takes, in words.
        expected: String,
    },
    /// The computation inside the kernel failed; the wrapped error says why
    /// (its message is shown as is).
    #[error(transparent)]
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

impl KernelError {
    /// Wraps the error of a computation the kernel delegates to.
    pub fn failed(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Failed(Arc::new(error))
    }
}
