//! One entry point for every model with a GPU path, so that the command
//! line, the MD force field and the Python calculator drive them alike.

use crate::lj::evaluate_lj_rank;
use crate::sevennet::RankRows;
use crate::{
    evaluate_lj, CudaDevice, CudaError, GpuSchNet, GpuSevenNet, GpuTimings, LjParameters, Precision,
};
use ddmlip_atoms::System;
use ddmlip_engine::Distributor;
use ddmlip_models::SchNetWeights;
use std::path::Path;

/// A model loaded on a GPU.
pub enum GpuModel {
    /// The Lennard-Jones pair potential.
    Lj(LjParameters),
    /// A SevenNet checkpoint, its weights on the device.
    SevenNet(Box<GpuSevenNet>),
    /// SchNet (`schnet-demo`), its weights on the device.
    SchNet(Box<GpuSchNet>),
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
    /// Virial (eV, Voigt order; the stress times the volume), also for
    /// systems without a cell.
    pub virial: [f64; 6],
    /// Per-atom energies (eV).
    pub atomic_energies: Vec<f64>,
    /// Directed pairs of the neighbour list.
    pub n_pairs: usize,
    /// Where the time went.
    pub timings: GpuTimings,
    /// Device memory the evaluation held at its fullest (bytes), where the
    /// model measures it (SevenNet).
    pub peak_bytes: Option<u64>,
    /// The memory estimate checked before allocating (bytes), where the
    /// model makes one (SevenNet, SchNet).
    pub estimated_bytes: Option<u64>,
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

    /// SchNet with `weights` on `device` in `precision`.
    pub fn schnet(
        device: &CudaDevice,
        weights: &SchNetWeights,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        GpuSchNet::new(device, weights, precision).map(|m| Self::SchNet(Box::new(m)))
    }

    /// The interaction cutoff (Å).
    pub fn cutoff(&self) -> f64 {
        match self {
            Self::Lj(p) => p.cutoff,
            Self::SevenNet(m) => m.cutoff(),
            Self::SchNet(m) => m.cutoff(),
        }
    }

    /// Energy, forces, stress and per-atom energies of `system` on
    /// `device` in `precision` (SevenNet and SchNet run in the precision they were
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
            Self::Lj(params) => evaluate_lj(device, system, params, precision),
            Self::SevenNet(m) => m.evaluate(device, system),
            Self::SchNet(m) => m.evaluate(device, system),
        }
    }

    /// One rank's part of a decomposed evaluation (see
    /// [`crate::evaluate_decomposed`]): `local` holds the rank's `n_owned`
    /// owned atoms, then its ghosts at their image positions (no cell);
    /// `halo` is the rank's plan and communicator. Energy and virial are
    /// this rank's share (summed over its owned atoms), per-atom energies
    /// and forces are its owned atoms' (complete), `stress` is `None`.
    pub fn evaluate_rank(
        &self,
        device: &CudaDevice,
        local: &System,
        precision: Precision,
        n_owned: usize,
        halo: &mut dyn Distributor,
    ) -> Result<GpuOutput, CudaError> {
        match self {
            Self::Lj(params) => evaluate_lj_rank(device, local, params, precision, n_owned),
            Self::SevenNet(m) => m.evaluate_rank(device, local, RankRows { n_owned, halo }),
            Self::SchNet(m) => m.evaluate_rank(device, local, RankRows { n_owned, halo }),
        }
    }
}

/// The volume a stress divides the virial by: `Some` for a system periodic
/// in some direction with a cell of volume above 1e-12 Å³ (the CPU path's
/// rule), `None` otherwise.
pub(crate) fn stress_volume(system: &System) -> Option<f64> {
    let periodic = system.pbc.iter().any(|&p| p);
    let volume = system.cell.map(|c| c.volume())?;
    (periodic && volume > 1e-12).then_some(volume)
}
