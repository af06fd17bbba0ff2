//! Typed errors of the CUDA backend.

use thiserror::Error;

/// Why the CUDA backend could not do what was asked.
#[derive(Debug, Error)]
pub enum CudaError {
    /// A CUDA library could not be loaded (no driver or toolkit installed).
    #[error(
        "no CUDA {library} library found on this machine ({hint}); use --device cpu, or install \
         the NVIDIA driver and CUDA 13 libraries"
    )]
    LibraryNotFound {
        /// Which library: `driver (libcuda)`, `NVRTC (libnvrtc)` or `cuBLAS (libcublas)`.
        library: &'static str,
        /// What was looked for.
        hint: &'static str,
    },
    /// The driver loaded but reports no CUDA device.
    #[error("the CUDA driver reports no GPU on this machine; use --device cpu")]
    NoDevice,
    /// A device index beyond the devices that exist.
    #[error("CUDA device {index} does not exist: this machine has {count} (indices 0..{count})")]
    IndexOutOfRange {
        /// The requested index.
        index: usize,
        /// How many devices exist.
        count: usize,
    },
    /// The device has too little free memory for the request.
    #[error(
        "{what} needs {} of GPU memory but device {device} has {} free{}{}",
        crate::format_gib(*.needed_bytes),
        crate::format_gib(*.free_bytes),
        match .reserved_bytes {
            0 => String::new(),
            r => format!(
                ", of which {} stay in reserve for the allocator's pool",
                crate::format_gib(*r)
            ),
        },
        match .atoms_that_fit {
            Some(n) => format!("; about {n} atoms of this system would fit"),
            None => String::new(),
        }
    )]
    OutOfMemory {
        /// What was being allocated.
        what: String,
        /// The device index.
        device: usize,
        /// Bytes the request needs.
        needed_bytes: u64,
        /// Bytes free on the device.
        free_bytes: u64,
        /// Bytes of `free_bytes` kept back (freed blocks the allocator's pool
        /// holds until the next synchronisation); 0 when none.
        reserved_bytes: u64,
        /// How many atoms of the same density would fit, when the caller can say.
        atoms_that_fit: Option<u64>,
    },
    /// NVRTC rejected a kernel source; `log` is its compiler log.
    #[error("NVRTC could not compile the {name} kernels for {arch}:\n{log}")]
    Compile {
        /// Kernel module name.
        name: String,
        /// Target architecture (`sm_XY`).
        arch: String,
        /// The compiler log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error during {context}: {message}")]
    Driver {
        /// What was being done.
        context: String,
        /// The driver's error text.
        message: String,
    },
    /// The system cannot be searched (bad cell, non-finite positions, …).
    #[error(transparent)]
    Neighbors(#[from] ddmlip_neighbors::NeighborError),
    /// Bad input the CPU path would also reject.
    #[error("{0}")]
    Input(String),
    /// A halo exchange or reduction between the ranks of a decomposed run
    /// failed (a peer failed or timed out).
    #[error("rank {rank}: {message}")]
    Comm {
        /// The rank that saw the failure.
        rank: usize,
        /// What failed, from the communicator.
        message: String,
    },
}

impl CudaError {
    /// A driver error with what was being done.
    pub(crate) fn driver(context: impl Into<String>, e: impl std::fmt::Display) -> Self {
        Self::Driver {
            context: context.into(),
            message: e.to_string(),
        }
    }
}

impl CudaError {
    /// Whether the user can fix this by changing the input or the machine
    /// (no library or device, a bad index, too large a system, bad input):
    /// exit status 2 in the command line, `ValueError` in Python. Driver
    /// and kernel-compilation failures are not.
    pub fn is_input(&self) -> bool {
        !matches!(
            self,
            Self::Driver { .. } | Self::Compile { .. } | Self::Comm { .. }
        )
    }
}
