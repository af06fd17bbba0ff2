//! Forces from outside the engine: a [`SystemForceField`] evaluates the
//! whole system in one call (a model with its own kernels, such as the GPU
//! models), and the MD driver and FIRE use it in place of the engine on one
//! rank; a [`RankForceField`] evaluates one rank's rows of a decomposed
//! system and is used on every rank.
//!
//! The driver keeps everything else as it is: the state, the integrators,
//! thermostats and barostats, checkpoints, sinks. The rank's skin list is
//! still built (it decides nothing the force field sees), so a run with a
//! force field restarts from, and writes, the same checkpoints as an engine
//! run of the same structure.

use crate::phases::EvalPhases;
use crate::rank_eval::{LocalRows, RankEvaluator, RankForces};
use crate::state::RankState;
use crate::MdError;
use ddmlip_atoms::Cell;
use ddmlip_engine::{DataMut, Distributor};

/// What one whole-system evaluation gives besides the forces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SystemEnergy {
    /// Potential energy of the system (eV).
    pub energy: f64,
    /// ∂E/∂ε (eV, row-major 3×3): the virial, the stress times the volume;
    /// zeros for a system without a periodic cell.
    pub strain_gradient: [f64; 9],
    /// Pairs the evaluation used (directed, within the cutoff).
    pub pairs: usize,
}

/// A force field that evaluates a whole system per call.
///
/// `positions` (Å) and `numbers` are every atom of the system, in the
/// order the caller keeps them (not the input file's order); `forces`
/// (eV/Å) has one row per atom and is overwritten. `cell` is zero for a
/// system without one; `pbc` says which axes are periodic. Positions on
/// periodic axes may lie outside the cell.
pub trait SystemForceField: Send {
    /// Energy, forces and ∂E/∂ε of the system. Errors: [`MdError::Input`]
    /// for what the user can change (an element the model lacks, a system
    /// too large for the device), [`MdError::ForceField`] for failures.
    fn evaluate(
        &mut self,
        positions: &[[f64; 3]],
        numbers: &[u32],
        cell: &Cell,
        pbc: [bool; 3],
        forces: &mut [[f64; 3]],
    ) -> Result<SystemEnergy, MdError>;
}

/// A force field that evaluates one rank's rows of a decomposed system (a
/// model with its own kernels that splits as the engine does, e.g. a GPU
/// model with ranks sharing the device).
///
/// `rows` are the rank's owned atoms then its ghost images (within the
/// cutoff plus the skin of its domain, at their image positions; the
/// candidate pairs may be ignored); `halo` is the rank's plan and
/// communicator for the exchanges the model needs between its layers;
/// `forces` (eV/Å) has one row per owned atom and is overwritten with
/// their complete forces. The returned energy and ∂E/∂ε are this rank's
/// shares (its owned atoms' energies and its edges' virial), summed over
/// ranks by the caller. Every rank is called once per evaluation.
pub trait RankForceField: Send {
    /// This rank's share of the energy and ∂E/∂ε, and its owned forces.
    /// Errors as [`SystemForceField::evaluate`]'s.
    fn evaluate(
        &mut self,
        rows: &LocalRows<'_>,
        halo: &mut dyn Distributor,
        forces: &mut [[f64; 3]],
    ) -> Result<SystemEnergy, MdError>;
}

/// Forces from outside the engine for a run.
pub enum ExternalForces<'a> {
    /// The whole system per call, on one rank.
    System(&'a mut dyn SystemForceField),
    /// This rank's rows per call, on every rank.
    Rank(&'a mut dyn RankForceField),
}

/// What evaluates a rank's forces in a run: the engine on the rank's rows,
/// a whole-system force field (one rank only), or a force field of the
/// rank's rows.
pub(crate) enum RankForceSource<'a, 'm> {
    /// The engine model, decomposed.
    Engine(Box<RankEvaluator<'m>>),
    /// A force field of the whole system; the rank owns every atom.
    System {
        /// The force field.
        field: &'a mut dyn SystemForceField,
        /// Periodic axes of the system.
        pbc: [bool; 3],
        /// The field's calls, all counted as `forward` (a force field has
        /// no phases the driver can see).
        phases: EvalPhases,
    },
    /// A force field of this rank's rows.
    Rank {
        /// The force field.
        field: &'a mut dyn RankForceField,
        /// Periodic axes of the system (∂E/∂ε is zero without any).
        pbc: [bool; 3],
        /// The field's calls, all counted as `forward`.
        phases: EvalPhases,
    },
}

impl<'a, 'm> RankForceSource<'a, 'm> {
    /// The rank's engine evaluator, or `field` in its place when given
    /// (`pbc`: the system's periodic axes).
    pub(crate) fn new(
        evaluator: RankEvaluator<'m>,
        field: Option<ExternalForces<'a>>,
        pbc: [bool; 3],
    ) -> Self {
        let phases = EvalPhases::default();
        match field {
            Some(ExternalForces::System(field)) => Self::System { field, pbc, phases },
            Some(ExternalForces::Rank(field)) => Self::Rank { field, pbc, phases },
            None => Self::Engine(Box::new(evaluator)),
        }
    }

    /// Evaluates `state` and leaves the owned forces in `state.forces` (the
    /// returned [`RankForces`] has an empty `forces`). Collective for the
    /// engine; a force field runs on the one rank alone.
    pub(crate) fn evaluate(&mut self, state: &mut RankState) -> Result<RankForces, MdError> {
        match self {
            Self::Engine(evaluator) => evaluator.evaluate_state(state),
            Self::System { field, pbc, phases } => {
                let started = std::time::Instant::now();
                if state.size != 1 {
                    return Err(MdError::Input(format!(
                        "a whole-system force field runs on one rank, not {}",
                        state.size
                    )));
                }
                let n = state.n_owned();
                state.forces.resize(n, [0.0; 3]);
                let out = field.evaluate(
                    &state.positions[..n],
                    &state.numbers[..n],
                    &state.cell,
                    *pbc,
                    &mut state.forces,
                )?;
                phases.forward += started.elapsed().as_secs_f64();
                Ok(RankForces {
                    energy: out.energy,
                    forces: Vec::new(),
                    strain_gradient: out.strain_gradient,
                    pairs: out.pairs,
                    energy_partial: false,
                    strain_partial: false,
                })
            }
            Self::Rank { field, pbc, phases } => {
                let started = std::time::Instant::now();
                let n = state.n_owned();
                state.forces.resize(n, [0.0; 3]);
                let rows = LocalRows {
                    positions: &state.positions,
                    numbers: &state.numbers,
                    n_owned: n,
                    centers: &state.centers,
                    neighbors: &state.neighbors,
                    cell: state.cell,
                };
                let halo = state
                    .halo
                    .as_mut()
                    .ok_or_else(|| MdError::Internal("the rank has no halo runtime".into()))?;
                let out = field.evaluate(&rows, halo, &mut state.forces)?;
                // The shares summed over ranks, in rank order.
                let mut sums = [0.0; 10];
                sums[0] = out.energy;
                if pbc.iter().any(|&p| p) {
                    sums[1..].copy_from_slice(&out.strain_gradient);
                }
                halo.all_reduce_sum(DataMut::F64(&mut sums))?;
                let mut strain_gradient = [0.0; 9];
                strain_gradient.copy_from_slice(&sums[1..]);
                phases.forward += started.elapsed().as_secs_f64();
                Ok(RankForces {
                    energy: sums[0],
                    forces: Vec::new(),
                    strain_gradient,
                    pairs: out.pairs,
                    energy_partial: false,
                    strain_partial: false,
                })
            }
        }
    }
}

impl RankForceSource<'_, '_> {
    /// The evaluation's phase sums since the last [`Self::reset_phases`].
    pub(crate) fn phases(&self) -> EvalPhases {
        match self {
            Self::Engine(evaluator) => evaluator.phases(),
            Self::System { phases, .. } | Self::Rank { phases, .. } => *phases,
        }
    }

    /// Starts the phase sums afresh.
    pub(crate) fn reset_phases(&mut self) {
        match self {
            Self::Engine(evaluator) => evaluator.reset_phases(),
            Self::System { phases, .. } | Self::Rank { phases, .. } => {
                *phases = EvalPhases::default()
            }
        }
    }
}

/// ∂E/∂ε (row-major 3×3) of an ASE-sign Voigt stress (xx yy zz yz xz xy,
/// eV/Å³) of a cell of `volume` Å³: the symmetric matrix times the volume.
pub fn strain_gradient_of_stress(stress: &[f64; 6], volume: f64) -> [f64; 9] {
    let [xx, yy, zz, yz, xz, xy] = stress.map(|s| s * volume);
    [xx, xy, xz, xy, yy, yz, xz, yz, zz]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voigt_order_maps_to_the_symmetric_matrix() {
        let g = strain_gradient_of_stress(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2.0);
        // Rows: (xx xy xz), (xy yy yz), (xz yz zz), each times the volume.
        assert_eq!(g, [2.0, 12.0, 10.0, 12.0, 4.0, 8.0, 10.0, 8.0, 6.0]);
    }
}
