//! The CUDA backend of ddmlip: a [`CudaDevice`] (context, stream, cuBLAS
//! handle), kernels in CUDA C compiled by NVRTC for the device's own
//! architecture and cached on disk ([`kernels`]), the neighbour list built
//! on the GPU ([`GpuNeighborList`]) and the first model on the GPU, the
//! Lennard-Jones pair potential ([`evaluate_lj`]), SchNet ([`GpuSchNet`],
//! the `schnet-demo` model) and SevenNet ([`GpuSevenNet`]): energy, forces
//! and stress with the whole forward and backward on the device.
//!
//! The CUDA libraries are loaded at run time (`cudarc` with dynamic
//! loading): this crate builds and its CPU-side tests pass on machines
//! without CUDA, where [`CudaDevice::open`] returns
//! [`CudaError::LibraryNotFound`].
//!
//! Every kernel is deterministic: no floating-point atomics; per-atom sums
//! run over CSR rows in a fixed order and totals come from fixed-order
//! block reductions, so a run gives the same bits every time.

/// Launches kernel `$func` on `$stream` with `$cfg` and the arguments in
/// order; a launch failure becomes [`CudaError::driver`] naming `$what`.
macro_rules! launch {
    ($stream:expr, $func:expr, $cfg:expr, $what:expr; $($arg:expr),* $(,)?) => {{
        let mut b = $stream.launch_builder($func);
        $( b.arg($arg); )*
        // SAFETY: argument types, order and buffer lengths match the
        // kernel's signature in its `.cu` file.
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::driver($what, e))
    }};
}

mod decomposed;
mod device;
mod engine_backend;
mod error;
pub mod kernels;
mod lj;
mod model;
mod neighbors;
mod schnet;
pub mod sevennet;

pub use decomposed::{
    evaluate_decomposed, evaluate_on_communicator, evaluate_on_gpus, DecomposedOutput,
    GpuPlacement, GpuRankReport,
};
pub use device::{arch_name, check_libraries, device_count, CudaDevice};
pub use engine_backend::{CudaEngineDevice, CudaEngineSource};
pub use error::CudaError;
pub use lj::{evaluate_lj, evaluate_lj_rank, LjParameters, Precision};
pub use model::{GpuModel, GpuOutput};
pub use neighbors::{GpuNeighborList, GpuTimings};
pub use schnet::GpuSchNet;
pub use sevennet::{GpuSevenNet, RankRows};

/// `bytes` as GiB with two decimals (for messages).
pub(crate) fn format_gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
