//! One CUDA device: its context, a stream, a cuBLAS handle and this
//! crate's kernels loaded for its architecture.

use crate::kernels::{self, KernelSource};
use crate::CudaError;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::sync::Arc;

/// Which CUDA libraries can be loaded on this machine, checked without
/// calling into any of them (a missing library is an error here, not a
/// panic later).
pub fn check_libraries() -> Result<(), CudaError> {
    // SAFETY: these only try to dlopen the library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::LibraryNotFound {
            library: "driver",
            hint: "libcuda.so not found by the dynamic loader",
        });
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::LibraryNotFound {
            library: "NVRTC",
            hint: "libnvrtc.so not found by the dynamic loader",
        });
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(CudaError::LibraryNotFound {
            library: "cuBLAS",
            hint: "libcublas.so not found by the dynamic loader",
        });
    }
    Ok(())
}

/// Number of CUDA devices; an error when the libraries or the driver are
/// missing.
pub fn device_count() -> Result<usize, CudaError> {
    check_libraries()?;
    let count =
        CudaContext::device_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// A CUDA device ready for work: context, one stream (every kernel of this
/// crate runs on it, in order), a cuBLAS handle bound to that stream, and
/// this crate's kernels compiled for the device's architecture.
pub struct CudaDevice {
    index: usize,
    name: String,
    capability: (i32, i32),
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    module: Arc<CudaModule>,
    kernel_source: KernelSource,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("capability", &self.capability)
            .finish()
    }
}

impl CudaDevice {
    /// Opens device `index` (0-based, as `cuda:N` names it): typed errors
    /// for missing libraries, no device, and an index beyond the devices
    /// present (naming how many exist).
    pub fn open(index: usize) -> Result<Self, CudaError> {
        let count = device_count()?;
        if count == 0 {
            return Err(CudaError::NoDevice);
        }
        if index >= count {
            return Err(CudaError::IndexOutOfRange { index, count });
        }
        let ctx =
            CudaContext::new(index).map_err(|e| CudaError::driver("creating a context", e))?;
        // SAFETY: every buffer of this crate is allocated, used and freed on
        // one stream (cuBLAS is bound to it too); the only data read from
        // other streams ([`CudaDevice::fork`]'s ranks) is model weights,
        // synchronised after upload and never written again. So cudarc's
        // cross-stream event tracking (two events recorded per argument of
        // every launch) has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx
            .name()
            .map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
        let capability = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("reading the compute capability", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating a stream", e))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| CudaError::driver("creating the cuBLAS handle", format!("{e:?}")))?;
        let arch = arch_name(capability);
        let (cubin, kernel_source) = kernels::cubin("ddmlip", kernels::DDMLIP_KERNELS, &arch)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(|e| CudaError::driver(format!("loading the {arch} kernels"), e))?;
        Ok(Self {
            index,
            name,
            capability,
            ctx,
            stream,
            blas,
            module,
            kernel_source,
        })
    }

    /// Another handle on the same device for a second rank: same context
    /// and kernels, its own stream and cuBLAS handle, so that its work
    /// queues independently of this handle's. Buffers are per stream;
    /// read-only data (model weights) uploaded through one handle may be
    /// read through another once the uploading stream was synchronised.
    pub fn fork(&self) -> Result<Self, CudaError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating a stream", e))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| CudaError::driver("creating the cuBLAS handle", format!("{e:?}")))?;
        Ok(Self {
            index: self.index,
            name: self.name.clone(),
            capability: self.capability,
            ctx: Arc::clone(&self.ctx),
            stream,
            blas,
            module: Arc::clone(&self.module),
            kernel_source: self.kernel_source,
        })
    }

    /// The device index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The device name (e.g. `NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The architecture the kernels were compiled for (`sm_90` for 9.0).
    pub fn arch(&self) -> String {
        arch_name(self.capability)
    }

    /// Whether the kernels came from the disk cache or were compiled now.
    pub fn kernel_source(&self) -> KernelSource {
        self.kernel_source
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(|e| CudaError::driver("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    /// The stream every kernel of this crate runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLAS handle, bound to [`CudaDevice::stream`].
    pub fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// Kernel `name` of this crate's module.
    pub(crate) fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module
            .load_function(name)
            .map_err(|e| CudaError::driver(format!("loading kernel {name}"), e))
    }

    /// Module `name` compiled from `source` for this device (from the disk
    /// cache when it holds it).
    pub(crate) fn load_module(
        &self,
        name: &str,
        source: &str,
    ) -> Result<Arc<CudaModule>, CudaError> {
        let arch = self.arch();
        let (cubin, _) = kernels::cubin(name, source, &arch)?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(|e| CudaError::driver(format!("loading the {name} kernels for {arch}"), e))
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("synchronizing the stream", e))
    }

    /// Refuses an allocation of `needed_bytes` that exceeds the free memory
    /// (less a 5 % reserve for the driver); `atoms_that_fit` scales the
    /// request's atom count to the memory available.
    pub(crate) fn check_fits(
        &self,
        what: &str,
        needed_bytes: u64,
        n_atoms: u64,
    ) -> Result<(), CudaError> {
        let (free, _) = self.memory()?;
        let usable = free - free / 20;
        if needed_bytes > usable {
            let fit = (n_atoms as f64 * usable as f64 / needed_bytes as f64).floor() as u64;
            return Err(CudaError::OutOfMemory {
                what: what.into(),
                device: self.index,
                needed_bytes,
                free_bytes: free,
                reserved_bytes: free - usable,
                atoms_that_fit: Some(fit),
            });
        }
        Ok(())
    }
}

/// `sm_XY` for compute capability `X.Y`.
pub fn arch_name(capability: (i32, i32)) -> String {
    format!("sm_{}{}", capability.0, capability.1)
}
