//! What a run hands to rank 0's sink: thermo rows, frames, checkpoints,
//! and the closing summary.

use crate::checkpoint::Checkpoint;
use crate::phases::StepPhases;
use crate::MdError;
use ddmlip_atoms::{Cell, Column, InfoValue, System};
use serde::Serialize;

/// One line of the thermo log.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThermoRow {
    /// Step count reached.
    pub step: u64,
    /// Simulated time (ps).
    pub time_ps: f64,
    /// Instantaneous temperature (K) with 3N degrees of freedom (ASE's).
    pub temperature: f64,
    /// Potential energy (eV).
    pub potential: f64,
    /// Kinetic energy (eV).
    pub kinetic: f64,
    /// Total energy, potential + kinetic (eV).
    pub total: f64,
    /// The ensemble's conserved quantity (eV): the total energy for `nve`,
    /// plus the heat the thermostat removed for `langevin`.
    pub conserved: f64,
    /// Pressure (GPa) from the virial and the kinetic term; `None` without
    /// a 3-D periodic cell.
    pub pressure_gpa: Option<f64>,
    /// Cell volume (Å³); `None` without a 3-D periodic cell.
    pub volume: Option<f64>,
    /// Neighbour-list rebuilds and migrated atoms so far.
    pub rebuilds: u64,
    /// Atoms that changed owner so far.
    pub migrated: u64,
    /// Simulated ns per wall-clock day since the run (this call) began.
    pub ns_per_day: f64,
}

/// A snapshot of the whole system, by global id.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Step count reached.
    pub step: u64,
    /// The cell (lattice vectors as rows, Å; zero without one).
    pub cell: Cell,
    /// Positions (Å) by global id, wrapped into the cell at the last build.
    pub positions: Vec<[f64; 3]>,
    /// Momenta (ASE units, u·Å per ASE time unit) by global id.
    pub momenta: Vec<[f64; 3]>,
    /// Forces (eV/Å) by global id.
    pub forces: Vec<[f64; 3]>,
    /// Potential energy (eV).
    pub energy: f64,
    /// Potential stress (eV/Å³, Voigt xx yy zz yz xz xy, ASE's sign); `None`
    /// without a 3-D periodic cell.
    pub stress: Option<[f64; 6]>,
}

impl Frame {
    /// This frame as an extended XYZ frame of `template`'s atoms: positions,
    /// cell, `momenta` (ASE units), energy, forces, stress, `step` and
    /// `time_fs` (`dt_fs` per step); `template`'s `masses` column is kept
    /// when `keep_masses` (the input carried one).
    pub fn to_system(&self, template: &System, keep_masses: bool, dt_fs: f64) -> System {
        let mut s = System::new(
            self.positions.clone(),
            template.numbers.clone(),
            template.cell.map(|_| self.cell),
            template.pbc,
        );
        if keep_masses {
            if let Some(m) = template.properties.arrays.get("masses") {
                s.properties.arrays.insert("masses".into(), m.clone());
            }
        }
        s.properties.arrays.insert(
            "momenta".into(),
            Column::Float(self.momenta.iter().flatten().copied().collect(), 3),
        );
        s.set_energy(self.energy);
        s.set_forces(&self.forces);
        if let Some(st) = self.stress {
            s.set_stress_voigt(st);
        }
        s.properties
            .info
            .insert("step".into(), InfoValue::Int(self.step as i64));
        s.properties
            .info
            .insert("time_fs".into(), InfoValue::Float(self.step as f64 * dt_fs));
        s
    }
}

/// Where rank 0 puts what a run produces. A sink error stops every rank.
pub trait MdSink: Send {
    /// A thermo row, every `thermo_every` steps and at the last step.
    fn thermo(&mut self, row: &ThermoRow) -> Result<(), MdError>;
    /// A trajectory frame, or (`is_final`) the last state.
    fn frame(&mut self, frame: &Frame, is_final: bool) -> Result<(), MdError>;
    /// A checkpoint of the whole state (periodic, on SIGINT, or at the end).
    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), MdError>;
}

/// The end of a run, as rank 0 reports it.
#[derive(Debug, Clone, Serialize)]
pub struct MdSummary {
    /// The ensemble name (`nve`, `langevin`, `nose-hoover`, `npt`).
    pub ensemble: String,
    /// Number of atoms.
    pub n_atoms: usize,
    /// Ranks the system was split over.
    pub ranks: usize,
    /// Steps run in this call.
    pub steps: u64,
    /// The step count reached (a restart continues from its checkpoint's).
    pub last_step: u64,
    /// Final potential energy (eV).
    pub potential_energy: f64,
    /// Final kinetic energy (eV).
    pub kinetic_energy: f64,
    /// Final total energy (eV).
    pub total_energy: f64,
    /// Final value of the ensemble's conserved quantity (eV).
    pub conserved: f64,
    /// Mean temperature over the steps of this call (K).
    pub mean_temperature: f64,
    /// Wall-clock time of this call (s).
    pub wall_s: f64,
    /// Simulated ns per wall-clock day.
    pub ns_per_day: f64,
    /// Atoms × steps per wall-clock second.
    pub atom_steps_per_s: f64,
    /// Neighbour-list rebuilds so far.
    pub rebuilds: u64,
    /// Atoms that changed owner so far.
    pub migrated: u64,
    /// Seconds spent in model evaluations (this rank: rank 0).
    pub eval_s: f64,
    /// Wall-clock seconds before the first step (rank 0): the first build
    /// (partition, ghosts, pair list) and the first force evaluation.
    pub setup_s: f64,
    /// Mean wall-clock seconds of the steady steps (rank 0): every step
    /// after the first, rebuild steps included; the first step settles the
    /// memory the later ones reuse. A one-step run's one step.
    pub step_s: f64,
    /// CPU seconds per steady step (as `step_s`), every thread of the
    /// process counted (thread ranks: all ranks; MPI: rank 0's process);
    /// `None` where the kernel does not report it (not Linux).
    pub cpu_s_per_step: Option<f64>,
    /// Minor page faults per steady step (as `cpu_s_per_step`): pages the
    /// process mapped fresh. A step that reuses its pair list reuses its
    /// memory too, so this counts mostly the new lists of rebuild steps.
    pub faults_per_step: Option<f64>,
    /// Where rank 0's steady steps spent their time (mean seconds per
    /// step, the same steps as `step_s`).
    pub phase_s: StepPhases,
    /// Rank 0's communication per kind of step.
    pub traffic: StepTraffic,
    /// Full (collective) partitions in this call, the initial build
    /// included; every other rebuild migrated atoms point to point.
    pub repartitions: u64,
    /// How evenly the ranks' own work was spread: each rank's force-call
    /// compute (cutoff filter, forward and gradient pass, seconds per
    /// steady step, no waiting for peers), gathered once at the end. A
    /// `max` well above rank 0's is time the other ranks wait in the force
    /// return.
    pub rank_busy_s: RankSpread,
}

/// The least, mean and largest of one number over the ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RankSpread {
    /// The smallest rank's value.
    pub min: f64,
    /// The mean over ranks.
    pub mean: f64,
    /// The largest rank's value.
    pub max: f64,
}

/// Rank 0's communication in the steps of a run, from its communicator's
/// counters: from the start of a step to the end of its reduction, so the
/// gathers of frames and checkpoints are not counted. Collectives are
/// all-reduce, all-gather and barrier calls; bytes are payload bytes sent
/// point-to-point plus this rank's contribution to collectives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StepTraffic {
    /// Steps that reused the pair list (ghosts refreshed only).
    pub plain_steps: u64,
    /// Collective calls in those steps, all together.
    pub plain_collectives: u64,
    /// Payload bytes sent in those steps.
    pub plain_bytes: u64,
    /// Steps that rebuilt the decomposition (migration, ghosts, pairs).
    pub rebuild_steps: u64,
    /// Collective calls in those steps, all together.
    pub rebuild_collectives: u64,
    /// Payload bytes sent in those steps.
    pub rebuild_bytes: u64,
}

impl StepTraffic {
    /// Adds one step's counters (`delta`), a rebuild step or not.
    pub fn add(&mut self, delta: &ddmlip_comm::CommStats, rebuilt: bool) {
        let collectives = delta.all_reduces + delta.all_gathers + delta.barriers;
        let bytes = delta.bytes_sent + delta.collective_bytes;
        if rebuilt {
            self.rebuild_steps += 1;
            self.rebuild_collectives += collectives;
            self.rebuild_bytes += bytes;
        } else {
            self.plain_steps += 1;
            self.plain_collectives += collectives;
            self.plain_bytes += bytes;
        }
    }
}
