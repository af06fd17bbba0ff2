//! Forces from outside the engine: a [`SystemForceField`] evaluates the
//! whole system in one call (a model with its own kernels, such as the GPU
//! models), and the MD driver and FIRE use it in place of the engine on one
//! rank.
//!
//! The driver keeps everything else as it is: the state, the integrators,
//! thermostats and barostats, checkpoints, sinks. The rank's skin list is
//! still built (it decides nothing the force field sees), so a run with a
//! force field restarts from, and writes, the same checkpoints as an engine
//! run of the same structure.

use crate::phases::EvalPhases;
use crate::rank_eval::{RankEvaluator, RankForces};
use crate::state::RankState;
use crate::MdError;
use ddmlip_atoms::Cell;

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

/// What evaluates a rank's forces in a run: the engine on the rank's rows,
/// or a whole-system force field (one rank only).
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
}

impl<'a, 'm> RankForceSource<'a, 'm> {
    /// The rank's engine evaluator, or `field` in its place when given
    /// (`pbc`: the system's periodic axes).
    pub(crate) fn new(
        evaluator: RankEvaluator<'m>,
        field: Option<&'a mut dyn SystemForceField>,
        pbc: [bool; 3],
    ) -> Self {
        match field {
            Some(field) => Self::System {
                field,
                pbc,
                phases: EvalPhases::default(),
            },
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
        }
    }
}

impl RankForceSource<'_, '_> {
    /// The evaluation's phase sums since the last [`Self::reset_phases`].
    pub(crate) fn phases(&self) -> EvalPhases {
        match self {
            Self::Engine(evaluator) => evaluator.phases(),
            Self::System { phases, .. } => *phases,
        }
    }

    /// Starts the phase sums afresh.
    pub(crate) fn reset_phases(&mut self) {
        match self {
            Self::Engine(evaluator) => evaluator.reset_phases(),
            Self::System { phases, .. } => *phases = EvalPhases::default(),
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
