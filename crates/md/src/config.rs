//! What a run is given: the ensemble and its parameters, the run's
//! settings (with their checks), the start state, and Maxwell–Boltzmann
//! momenta.

use crate::checkpoint::Checkpoint;
use crate::progress::StepObserver;
use crate::rng::{gaussian3, INIT_COUNTER};
use crate::state::Topology;
use crate::{units, MdError};
use ddmlip_atoms::Cell;
use ddmlip_domain::DomainMap;
use ddmlip_engine::DType;
use ddmlip_spec::MLIPSpec;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The ensemble and its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ensemble {
    /// Velocity Verlet (ASE's `VelocityVerlet` step).
    Nve,
    /// Langevin dynamics with the BAOAB splitting: half kick, half drift,
    /// exact Ornstein–Uhlenbeck update of the momenta, half drift, forces,
    /// half kick. Samples the canonical ensemble at `temperature` (K) with
    /// friction `friction_per_ps` (1/ps).
    Langevin {
        /// Target temperature (K).
        temperature: f64,
        /// Friction γ (1/ps).
        friction_per_ps: f64,
    },
    /// Nosé–Hoover chain (Martyna–Tuckerman–Klein) of `chain` thermostats at
    /// `temperature` (K) with time constant `tdamp_fs`: Q₁ = N_f·kT·τ²,
    /// Qⱼ = kT·τ²; the chain is advanced for half a step (Trotter splitting)
    /// around a velocity Verlet step. Conserved: E_total + Σ pⱼ²/2Qⱼ +
    /// N_f·kT·η₁ + kT·Σⱼ₍≥₂₎ ηⱼ.
    NoseHoover {
        /// Target temperature (K).
        temperature: f64,
        /// Time constant τ of the chain (fs).
        tdamp_fs: f64,
        /// Number of thermostats in the chain (≥ 1).
        chain: usize,
    },
    /// Constant pressure and temperature: BAOAB Langevin at `temperature`
    /// (K, friction 1/`tdamp_fs`) with stochastic cell rescaling (Bernetti &
    /// Bussi 2020) towards `pressure_gpa` (GPa) with time constant `pdamp_fs`
    /// and compressibility `compressibility_per_gpa` (1/GPa, which only sets
    /// how fast the volume relaxes). After the second drift of each step the
    /// strain increment dε = −(β/τ)(P₀ − P − kT/V)dt + √(2kTβdt/(Vτ))·ξ
    /// (per diagonal component with β/3 for `CellDof::Full`) scales cell,
    /// positions and (inversely) momenta; the decomposition is then rebuilt.
    /// P is the pressure from the last force evaluation's virial plus the
    /// current kinetic term.
    Npt {
        /// Target temperature (K).
        temperature: f64,
        /// Time constant of the Langevin thermostat (fs): friction 1/`tdamp_fs`.
        tdamp_fs: f64,
        /// Target pressure (GPa).
        pressure_gpa: f64,
        /// Time constant τ of the barostat (fs).
        pdamp_fs: f64,
        /// Compressibility β (1/GPa): sets how fast the volume relaxes, not where to.
        compressibility_per_gpa: f64,
        /// Isotropic or full-cell rescaling.
        cell_dof: CellDof,
    },
}

/// Which cell degrees of freedom the barostat moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellDof {
    /// The volume only: the cell keeps its shape.
    Iso,
    /// All six components of a symmetric strain: lengths and angles
    /// fluctuate, each driven by its own component of the pressure tensor.
    Full,
}

impl Ensemble {
    /// The CLI name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nve => "nve",
            Self::Langevin { .. } => "langevin",
            Self::NoseHoover { .. } => "nose-hoover",
            Self::Npt { .. } => "npt",
        }
    }
}

/// Thermostat variables carried across steps and checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThermostatState {
    /// Energy the thermostat has taken out of the system so far (eV); the
    /// ensemble's conserved quantity is the total energy plus this.
    #[serde(with = "crate::checkpoint::scalar_bits")]
    pub heat_removed: f64,
    /// Nosé–Hoover chain positions ηⱼ and momenta pⱼ (the same on every rank).
    #[serde(default, with = "crate::checkpoint::vec_bits")]
    pub chain_positions: Vec<f64>,
    #[serde(default, with = "crate::checkpoint::vec_bits")]
    /// Nosé–Hoover chain momenta pⱼ (the same on every rank).
    pub chain_momenta: Vec<f64>,
}

/// Settings of a run.
#[derive(Clone)]
pub struct MdConfig {
    /// The integrator and its parameters.
    pub ensemble: Ensemble,
    /// Time step (fs).
    pub dt_fs: f64,
    /// Steps to run in this call.
    pub steps: u64,
    /// Seed of the random forces.
    pub seed: u64,
    /// Verlet skin (Å).
    pub skin: f64,
    /// Working precision of the model evaluation (positions and momenta stay f64).
    pub dtype: DType,
    /// Domains with even atom counts instead of a regular grid.
    pub even_counts: bool,
    /// Hand a frame to the sink every this many steps (0: never).
    pub frame_every: u64,
    /// Hand a thermo row to the sink every this many steps (0: never).
    pub thermo_every: u64,
    /// Hand a checkpoint to the sink every this many steps (0: only at the
    /// end when `final_checkpoint`, and on interruption).
    pub checkpoint_every: u64,
    /// Hand the last state to the sink as the final frame.
    pub final_frame: bool,
    /// Hand a checkpoint of the last state to the sink.
    pub final_checkpoint: bool,
    /// Set (by a signal handler) to stop after the current step with a checkpoint.
    pub stop: Option<Arc<AtomicBool>>,
    /// The decomposition spec; `None` uses the model's declared one.
    pub spec: Option<MLIPSpec>,
    /// Called by rank 0 after every step (a progress bar).
    pub on_step: Option<StepObserver>,
    /// Rebuilds between full (collective) repartitions that re-place the
    /// domain boundaries for load balance; 0 never schedules one. Between
    /// them atoms migrate point to point. Ignored where the boundaries
    /// cannot move (a regular grid over a fully periodic cell).
    pub repartition_every: u64,
    /// A rebuild whose most loaded rank owns more than this multiple of the
    /// mean atom count repartitions (collective); at least 1. Ignored where
    /// the boundaries cannot move.
    pub max_imbalance: f64,
    /// Rebuilds between repartitions migrate atoms point to point and find
    /// ghosts among neighbour ranks (the default). `false` gathers every
    /// position at every rebuild and partitions with the same domains: the
    /// reference the point-to-point path reproduces bit for bit.
    pub point_to_point: bool,
    /// Where the op engine's device-eligible ops run (see
    /// `ddmlip_engine::device`); `None`: the host.
    pub device: Option<ddmlip_engine::device::EngineDevice>,
}

/// Default of [`MdConfig::repartition_every`].
pub const DEFAULT_REPARTITION_EVERY: u64 = 100;
/// Default of [`MdConfig::max_imbalance`].
pub const DEFAULT_MAX_IMBALANCE: f64 = 1.25;

impl MdConfig {
    /// A configuration with defaults for everything but the essentials.
    pub fn new(ensemble: Ensemble, dt_fs: f64, steps: u64) -> Self {
        Self {
            ensemble,
            dt_fs,
            steps,
            seed: 0,
            skin: 1.0,
            dtype: DType::F64,
            even_counts: false,
            frame_every: 0,
            thermo_every: 0,
            checkpoint_every: 0,
            final_frame: false,
            final_checkpoint: false,
            stop: None,
            spec: None,
            on_step: None,
            repartition_every: DEFAULT_REPARTITION_EVERY,
            max_imbalance: DEFAULT_MAX_IMBALANCE,
            point_to_point: true,
            device: None,
        }
    }

    /// Rejects impossible settings, naming the flag.
    pub fn check(&self) -> Result<(), MdError> {
        if !(self.dt_fs.is_finite() && self.dt_fs > 0.0) {
            return Err(MdError::Input(format!(
                "--dt must be a positive time step in fs, got {}",
                self.dt_fs
            )));
        }
        if self.steps == 0 {
            return Err(MdError::Input("--steps must be at least 1".into()));
        }
        if !(self.skin.is_finite() && self.skin >= 0.0) {
            return Err(MdError::Input(format!(
                "--skin must be a non-negative distance in Å, got {}",
                self.skin
            )));
        }
        if !(self.max_imbalance.is_finite() && self.max_imbalance >= 1.0) {
            return Err(MdError::Input(format!(
                "--max-imbalance must be a finite ratio of at least 1, got {}",
                self.max_imbalance
            )));
        }
        if let Ensemble::NoseHoover {
            temperature,
            tdamp_fs,
            chain,
        } = self.ensemble
        {
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(MdError::Input(format!(
                    "--temperature must be a positive temperature in K for nose-hoover, got {temperature}"
                )));
            }
            if !(tdamp_fs.is_finite() && tdamp_fs > 0.0) {
                return Err(MdError::Input(format!(
                    "--tdamp must be a positive time in fs, got {tdamp_fs}"
                )));
            }
            if chain == 0 {
                return Err(MdError::Input(
                    "the chain needs at least one thermostat".into(),
                ));
            }
        }
        if let Ensemble::Npt {
            temperature,
            tdamp_fs,
            pressure_gpa,
            pdamp_fs,
            compressibility_per_gpa,
            ..
        } = self.ensemble
        {
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(MdError::Input(format!(
                    "--temperature must be a positive temperature in K for npt, got {temperature}"
                )));
            }
            for (flag, v) in [
                ("--tdamp", tdamp_fs),
                ("--pdamp", pdamp_fs),
                ("--compressibility", compressibility_per_gpa),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(MdError::Input(format!("{flag} must be positive, got {v}")));
                }
            }
            if !pressure_gpa.is_finite() {
                return Err(MdError::Input(format!(
                    "--pressure must be a finite pressure in GPa, got {pressure_gpa}"
                )));
            }
        }
        if let Ensemble::Langevin {
            temperature,
            friction_per_ps,
        } = self.ensemble
        {
            if !(temperature.is_finite() && temperature >= 0.0) {
                return Err(MdError::Input(format!(
                    "--temperature must be a non-negative temperature in K, got {temperature}"
                )));
            }
            if !(friction_per_ps.is_finite() && friction_per_ps >= 0.0) {
                return Err(MdError::Input(format!(
                    "--friction must be a non-negative rate in 1/ps, got {friction_per_ps}"
                )));
            }
        }
        Ok(())
    }
}

/// Where a run starts: every rank passes the same.
#[derive(Debug, Clone)]
pub struct StartState {
    /// Steps already done.
    pub step: u64,
    /// The cell at `step` (lattice vectors as rows, Å).
    pub cell: Cell,
    /// Positions (Å) by global id.
    pub positions: Vec<[f64; 3]>,
    /// Momenta (ASE units) by global id.
    pub momenta: Vec<[f64; 3]>,
    /// Positions the first neighbour-list build starts from: `positions` for
    /// a fresh run, a checkpoint's `build_positions` for a restart.
    pub build_positions: Vec<[f64; 3]>,
    /// Thermostat and barostat variables at `step` (heat removed, chain).
    pub thermostat: ThermostatState,
    /// Continuing from a checkpoint: `positions` are the rows of the build
    /// from `build_positions`, and nothing at the start step is re-emitted.
    pub restarted: bool,
    /// Neighbour-list rebuilds so far.
    pub rebuilds: u64,
    /// Atoms that changed owner so far.
    pub migrated: u64,
    /// The domains the checkpointed run was using (a restart on the same
    /// rank count keeps them, so that it owns the same atoms).
    pub domains: Option<DomainMap>,
}

impl StartState {
    /// A fresh start.
    pub fn fresh(cell: Cell, positions: Vec<[f64; 3]>, momenta: Vec<[f64; 3]>) -> Self {
        Self {
            step: 0,
            cell,
            build_positions: positions.clone(),
            positions,
            momenta,
            thermostat: ThermostatState::default(),
            restarted: false,
            rebuilds: 0,
            migrated: 0,
            domains: None,
        }
    }

    /// The state a checkpoint holds, after checking that it belongs to
    /// `topology` (same atoms, same masses).
    pub fn from_checkpoint(ck: &Checkpoint, topology: &Topology) -> Result<Self, MdError> {
        if ck.numbers != topology.numbers {
            return Err(MdError::Input(format!(
                "--restart: field `numbers` ({} atoms) does not match --structure ({} atoms){}",
                ck.numbers.len(),
                topology.len(),
                if ck.numbers.len() == topology.len() {
                    ": the elements differ"
                } else {
                    ""
                }
            )));
        }
        if ck.mass_values() != topology.masses {
            return Err(MdError::Input(
                "--restart: field `masses` does not match the structure's masses".into(),
            ));
        }
        Ok(Self {
            step: ck.step,
            cell: Cell::new(ck.cell_matrix()),
            positions: ck.positions.clone(),
            momenta: ck.momenta.clone(),
            build_positions: ck.build_positions.clone(),
            thermostat: ck.thermostat.clone(),
            restarted: true,
            rebuilds: ck.rebuilds,
            migrated: ck.migrated,
            domains: ck.domains.clone(),
        })
    }
}

/// Maxwell–Boltzmann momenta at `temperature` (K) for every atom, by global
/// id, from the counter-based generator (so any rank computes the same),
/// with the total momentum removed as ASE's `Stationary` does.
pub fn maxwell_boltzmann(masses: &[f64], temperature: f64, seed: u64) -> Vec<[f64; 3]> {
    let kt = units::boltzmann() * temperature;
    let mut p: Vec<[f64; 3]> = masses
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let z = gaussian3(seed, i as u64, INIT_COUNTER);
            let s = (m * kt).sqrt();
            [s * z[0], s * z[1], s * z[2]]
        })
        .collect();
    let total_mass: f64 = masses.iter().sum();
    let mut total = [0.0; 3];
    for q in &p {
        for k in 0..3 {
            total[k] += q[k];
        }
    }
    let v = total.map(|t| t / total_mass);
    for (q, &m) in p.iter_mut().zip(masses) {
        for k in 0..3 {
            q[k] -= m * v[k];
        }
    }
    p
}
