//! One entry point for every model with a GPU path, so that the command
//! line, the MD force field and the Python calculator drive them alike.

use crate::{evaluate_lj, CudaDevice, CudaError, GpuSevenNet, GpuTimings, LjParameters, Precision};
use ddmlip_atoms::System;
use std::path::Path;

/// A model loaded on a GPU.
pub enum GpuModel {
    /// The Lennard-Jones pair potential.
    Lj(LjParameters),
    /// A SevenNet checkpoint, its weights on the device.
    SevenNet(Box<GpuSevenNet>),
}

/// What one GPU evaluation gives, whatever the model (ASE units and signs).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuOutput {
    /// Total energy (eV).
    pub energy: f64,
    /// Forces (eV/Å), one per atom in the system's order.
    pub forces: Vec<[f64; 3]>,
    /// Stress (eV/Å³, ASE sign, Voigt xx yy zz yz xz xy) for periodic
    /// systems with a cell of positive volume; `None` otherwise.
    pub stress: Option<[f64; 6]>,
    /// Per-atom energies (eV).
    pub atomic_energies: Vec<f64>,
    /// Directed pairs of the neighbour list.
    pub n_pairs: usize,
    /// Where the time went.
    pub timings: GpuTimings,
    /// Device memory the evaluation held at its fullest (bytes), where the
    /// model measures it (SevenNet).
    pub peak_bytes: Option<u64>,
}

impl GpuModel {
    /// A SevenNet checkpoint (`.pth`) on `device` in `precision`, with the
    /// fidelity `modal` of a multi-fidelity one.
    pub fn sevennet(
        device: &CudaDevice,
        checkpoint: &Path,
        modal: Option<&str>,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        GpuSevenNet::from_checkpoint(device, checkpoint, modal, precision)
            .map(|m| Self::SevenNet(Box::new(m)))
    }

    /// The interaction cutoff (Å).
    pub fn cutoff(&self) -> f64 {
        match self {
            Self::Lj(p) => p.cutoff,
            Self::SevenNet(m) => m.cutoff(),
        }
    }

    /// Energy, forces, stress and per-atom energies of `system` on
    /// `device` in `precision` (SevenNet runs in the precision it was
    /// loaded in). Errors: [`CudaError::Input`] and
    /// [`CudaError::OutOfMemory`] for what the user can change, driver
    /// errors otherwise.
    pub fn evaluate(
        &self,
        device: &CudaDevice,
        system: &System,
        precision: Precision,
    ) -> Result<GpuOutput, CudaError> {
        match self {
            Self::Lj(params) => {
                let r = evaluate_lj(device, system, params, precision)?;
                Ok(GpuOutput {
                    energy: r.energy,
                    forces: r.forces,
                    stress: r.stress,
                    atomic_energies: r.atomic_energies,
                    n_pairs: r.n_pairs,
                    timings: r.timings,
                    peak_bytes: None,
                })
            }
            Self::SevenNet(m) => {
                let r = m.evaluate(device, system)?;
                Ok(GpuOutput {
                    energy: r.energy,
                    forces: r.forces,
                    stress: r.stress,
                    atomic_energies: r.atomic_energies,
                    n_pairs: r.n_pairs,
                    timings: r.timings,
                    peak_bytes: Some(r.peak_bytes),
                })
            }
        }
    }
}
