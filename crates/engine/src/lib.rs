//! The ddmlip op engine.
//!
//! Models are written once against [`Graph`]: every op records its inputs on a
//! tape (for reverse-mode autodiff), optionally into a [`Trace`], and — when a
//! [`Distributor`] is attached — applies the distributed meaning the spec
//! selects (halo refresh / reverse-sum / all-reduce, each with its adjoint).
//!
//! Tensors are row-major `rows × cols` blocks whose rows have a [`RowDomain`]:
//! `Atom` (local atoms: owned rows first, then ghosts), `Edge`, `System`, or none.

mod backward;
mod buffers;
pub mod device;
mod dist;
mod error;
mod graph;
pub mod helpers;
mod model;
pub mod ops;
mod profile;
mod scalar;
mod trace;

pub use dist::{DataMut, Distributor};
pub use error::{EngineError, KernelError};
pub use graph::{Buffers, Graph, Index, LiveStats, Tensor};
pub use model::{Edges, Model, ModelForward, ModelInfo, ModelInputs, ModelOutputs, SpeciesSupport};
pub use ops::message::{MessageEdges, MessageInputs, MessageKernel};
pub use ops::opaque::OpaqueKernel;
pub use profile::{OpProfile, OpTime};
pub use scalar::{DType, Scalar};
pub use trace::{Phase, Trace, TraceEvent, TraceShape};

/// What the rows of a tensor are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowDomain {
    /// Local atoms: owned rows first, then ghost rows.
    Atom,
    /// Edges of a neighbour graph.
    Edge,
    /// One row per system of the batch.
    System,
    /// Parameters and constants.
    None,
}

/// Runs `body` on a worker of the current rayon pool (the global one when
/// the caller is not a worker), blocking until it returns. Every parallel
/// loop of an evaluation started from outside the pool would otherwise hand
/// its work to the workers and put the caller to sleep until they finish:
/// one wake-up and one sleep per op, which on one thread is all overhead
/// (16 % of an imported NequIP evaluation). On a worker the loops run in
/// place, the worker itself taking part. Single-process evaluations, an MPI
/// rank's evaluation, MD run and relaxation go through it.
pub fn on_pool_worker<R: Send>(body: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        body()
    } else {
        rayon::scope(|_| body())
    }
}
