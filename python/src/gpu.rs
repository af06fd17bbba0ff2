//! `device="cuda[:N]"`: models with CUDA kernels of their own evaluated
//! with them on an NVIDIA GPU, the others through the op engine with its
//! generic ops there (the CUDA libraries are loaded at run time; without
//! them the calculator raises `ValueError` saying so).

use ddmlip::{Device, System};
use ddmlip_cuda::{CudaDevice, CudaError, GpuModel, GpuOutput, LjParameters, Precision};
use ddmlip_models::ModelSource;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// `cpu`, `cuda` or `cuda:N` (see [`Device`]).
pub(crate) fn parse_device(device: &str) -> Result<Device, PyErr> {
    device
        .parse()
        .map_err(|e| PyValueError::new_err(format!("unknown device {e}")))
}

/// `ValueError` for what the user can change (no driver, a bad index, too
/// large a system, an element the model lacks), `RuntimeError` otherwise.
pub(crate) fn gpu_error(e: CudaError) -> PyErr {
    if e.is_input() {
        PyValueError::new_err(format!("{e}; use device=\"cpu\""))
    } else {
        PyRuntimeError::new_err(e.to_string())
    }
}

/// Whether `model` has CUDA kernels of its own (`lj`, `schnet-demo`,
/// SevenNet); the others run through the op engine on the GPU.
pub(crate) fn has_own_kernels(model: &str) -> Result<bool, PyErr> {
    ddmlip_models::model_source(model)
        .map(|s| s.is_some())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// CUDA device `index` for the op engine's generic ops.
pub(crate) fn engine_device(index: usize) -> Result<ddmlip::EngineDevice, PyErr> {
    let source = ddmlip_cuda::CudaEngineSource::open(index).map_err(gpu_error)?;
    Ok(ddmlip::EngineDevice(std::sync::Arc::new(source)))
}

/// A model on a GPU with its device.
pub(crate) struct GpuEngine {
    device: CudaDevice,
    model: GpuModel,
    precision: Precision,
    /// Ranks sharing the GPU (1: the whole system on one rank).
    ranks: usize,
    /// Deadline of every blocking exchange between ranks.
    timeout: std::time::Duration,
}

impl GpuEngine {
    /// Loads `model` (a name or path with a GPU path: `lj`, a Lennard-Jones
    /// model file, `schnet-demo`, a SevenNet name or checkpoint) on CUDA device `index`.
    pub(crate) fn new(
        model: &str,
        index: usize,
        precision: Precision,
        ranks: usize,
        timeout: std::time::Duration,
    ) -> Result<Self, PyErr> {
        let source = ddmlip_models::model_source(model)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "model `{model}` has no CUDA path yet; models with one: lj, Lennard-Jones \
                     model files, schnet-demo, the SevenNet checkpoints. Use device=\"cpu\" for it"
                ))
            })?;
        let device = CudaDevice::open(index).map_err(gpu_error)?;
        let model = match source {
            ModelSource::LennardJones(lj) => GpuModel::Lj(LjParameters {
                epsilon: lj.epsilon,
                sigma: lj.sigma,
                cutoff: lj.cutoff,
                shift: lj.shift,
            }),
            ModelSource::SevenNetCheckpoint(path) => {
                GpuModel::sevennet(&device, &path, None, precision).map_err(gpu_error)?
            }
            ModelSource::SchNet(weights) => {
                GpuModel::schnet(&device, &weights, precision).map_err(gpu_error)?
            }
        };
        Ok(Self {
            device,
            model,
            precision,
            ranks,
            timeout,
        })
    }

    /// Energy, forces, stress and per-atom energies of `system`.
    pub(crate) fn evaluate(&self, system: &System) -> Result<GpuOutput, PyErr> {
        if self.ranks > 1 {
            ddmlip_cuda::evaluate_decomposed(
                &self.model,
                &self.device,
                system,
                self.precision,
                self.ranks,
                self.timeout,
            )
            .map(|d| d.output)
            .map_err(gpu_error)
        } else {
            self.model
                .evaluate(&self.device, system, self.precision)
                .map_err(gpu_error)
        }
    }
}
