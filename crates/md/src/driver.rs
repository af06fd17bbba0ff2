//! The MD loop one rank runs: integrators, the rebuild decision, per-step
//! global reductions, and the output hand-off to rank 0's sink.

use crate::checkpoint::{Checkpoint, CHECKPOINT_FORMAT, CHECKPOINT_VERSION};
use crate::mat3::invert3;
use crate::progress::{StepObserver, StepProgress};
use crate::rank_eval::{RankEvaluator, RankForces};
use crate::rng::{gaussian3, INIT_COUNTER};
use crate::state::{BuildOptions, RankState, Topology};
use crate::{units, MdError};
use ddmlip_atoms::{Cell, Column, InfoValue, System};
use ddmlip_comm::Communicator;
use ddmlip_engine::{DType, Model};
use ddmlip_spec::MLIPSpec;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
        temperature: f64,
        friction_per_ps: f64,
    },
    /// Nosé–Hoover chain (Martyna–Tuckerman–Klein) of `chain` thermostats at
    /// `temperature` (K) with time constant `tdamp_fs`: Q₁ = N_f·kT·τ²,
    /// Qⱼ = kT·τ²; the chain is advanced for half a step (Trotter splitting)
    /// around a velocity Verlet step. Conserved: E_total + Σ pⱼ²/2Qⱼ +
    /// N_f·kT·η₁ + kT·Σⱼ₍≥₂₎ ηⱼ.
    NoseHoover {
        temperature: f64,
        tdamp_fs: f64,
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
        temperature: f64,
        tdamp_fs: f64,
        pressure_gpa: f64,
        pdamp_fs: f64,
        compressibility_per_gpa: f64,
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
    pub chain_momenta: Vec<f64>,
}

/// Settings of a run.
#[derive(Clone)]
pub struct MdConfig {
    pub ensemble: Ensemble,
    /// Time step (fs).
    pub dt_fs: f64,
    /// Steps to run in this call.
    pub steps: u64,
    /// Seed of the random forces.
    pub seed: u64,
    /// Verlet skin (Å).
    pub skin: f64,
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
}

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
    pub cell: Cell,
    /// Positions (Å) by global id.
    pub positions: Vec<[f64; 3]>,
    /// Momenta (ASE units) by global id.
    pub momenta: Vec<[f64; 3]>,
    /// Positions the first neighbour-list build starts from: `positions` for
    /// a fresh run, a checkpoint's `build_positions` for a restart.
    pub build_positions: Vec<[f64; 3]>,
    pub thermostat: ThermostatState,
    /// Continuing from a checkpoint: `positions` are the rows of the build
    /// from `build_positions`, and nothing at the start step is re-emitted.
    pub restarted: bool,
    pub rebuilds: u64,
    pub migrated: u64,
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

/// One line of the thermo log.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThermoRow {
    pub step: u64,
    /// Simulated time (ps).
    pub time_ps: f64,
    /// Instantaneous temperature (K) with 3N degrees of freedom (ASE's).
    pub temperature: f64,
    /// Potential, kinetic and total energy (eV).
    pub potential: f64,
    pub kinetic: f64,
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
    pub migrated: u64,
    /// Simulated ns per wall-clock day since the run (this call) began.
    pub ns_per_day: f64,
}

/// A snapshot of the whole system, by global id.
#[derive(Debug, Clone)]
pub struct Frame {
    pub step: u64,
    pub cell: Cell,
    pub positions: Vec<[f64; 3]>,
    pub momenta: Vec<[f64; 3]>,
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
    fn thermo(&mut self, row: &ThermoRow) -> Result<(), MdError>;
    /// A trajectory frame, or (`is_final`) the last state.
    fn frame(&mut self, frame: &Frame, is_final: bool) -> Result<(), MdError>;
    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), MdError>;
}

/// The end of a run, as rank 0 reports it.
#[derive(Debug, Clone, Serialize)]
pub struct MdSummary {
    pub ensemble: String,
    pub n_atoms: usize,
    pub ranks: usize,
    /// Steps run in this call, and the step count reached.
    pub steps: u64,
    pub last_step: u64,
    pub potential_energy: f64,
    pub kinetic_energy: f64,
    pub total_energy: f64,
    pub conserved: f64,
    /// Mean temperature over the steps of this call (K).
    pub mean_temperature: f64,
    pub wall_s: f64,
    pub ns_per_day: f64,
    pub atom_steps_per_s: f64,
    pub rebuilds: u64,
    pub migrated: u64,
    /// Seconds spent in model evaluations (this rank: rank 0).
    pub eval_s: f64,
}

/// Per-step global sums and maxima, reduced in rank order.
struct Reduced {
    kinetic: f64,
    nonfinite_forces: f64,
    stop: bool,
    heat_removed: f64,
    migrated: f64,
}

/// Sums of `sums` and maxima of `maxes` over ranks, folded in rank order
/// (the same bits on every rank).
pub(crate) fn reduce(
    comm: &dyn Communicator,
    sums: &[f64],
    maxes: &[f64],
) -> Result<(Vec<f64>, Vec<f64>), MdError> {
    let mut mine = sums.to_vec();
    mine.extend_from_slice(maxes);
    let all = comm
        .all_gather_f64(&mine)
        .map_err(|e| MdError::Comm(format!("step reduction: {e}")))?;
    let mut s = vec![0.0; sums.len()];
    let mut m = vec![f64::NEG_INFINITY; maxes.len()];
    for part in &all {
        if part.len() != mine.len() {
            return Err(MdError::Comm(
                "step reduction: ranks disagree on its length".into(),
            ));
        }
        for (acc, v) in s.iter_mut().zip(part) {
            *acc += v;
        }
        for (acc, v) in m.iter_mut().zip(&part[sums.len()..]) {
            *acc = acc.max(*v);
        }
    }
    Ok((s, m))
}

/// The arrays of every rank's owned rows, by global id (complete on every rank).
pub(crate) fn gather_rows(
    comm: &dyn Communicator,
    n_atoms: usize,
    gids: &[u64],
    arrays: &[&[[f64; 3]]],
) -> Result<Vec<Vec<[f64; 3]>>, MdError> {
    let err = |e: ddmlip_comm::CommError| MdError::Comm(format!("gather frame: {e}"));
    let ids = comm.all_gather_u64(gids).map_err(err)?;
    let mut out = Vec::with_capacity(arrays.len());
    for a in arrays {
        let flat: Vec<f64> = a.iter().flatten().copied().collect();
        let parts = comm.all_gather_f64(&flat).map_err(err)?;
        let mut rows = vec![[f64::NAN; 3]; n_atoms];
        for (ids, p) in ids.iter().zip(&parts) {
            for (k, &id) in ids.iter().enumerate() {
                rows[id as usize] = [p[3 * k], p[3 * k + 1], p[3 * k + 2]];
            }
        }
        out.push(rows);
    }
    Ok(out)
}

pub(crate) fn periodic_volume(cell: &Cell, pbc: [bool; 3]) -> Option<f64> {
    (pbc == [true; 3] && cell.volume() > 1e-12).then(|| cell.volume())
}

pub(crate) fn stress_voigt(geps: &[f64; 9], volume: f64) -> [f64; 6] {
    let sym = |a: usize, b: usize| 0.5 * (geps[a * 3 + b] + geps[b * 3 + a]) / volume;
    [
        sym(0, 0),
        sym(1, 1),
        sym(2, 2),
        sym(1, 2),
        sym(0, 2),
        sym(0, 1),
    ]
}

/// Everything the loop needs besides the rank state.
struct Run<'a> {
    topology: &'a Topology,
    config: &'a MdConfig,
    opts: BuildOptions,
    /// Time step in ASE time units.
    dt: f64,
    thermostat: ThermostatState,
    started: Instant,
    first_step: u64,
    eval_s: f64,
}

impl Run<'_> {
    fn evaluate(
        &mut self,
        state: &mut RankState,
        evaluator: &mut RankEvaluator<'_>,
    ) -> Result<RankForces, MdError> {
        let clock = Instant::now();
        let out = evaluator.evaluate_state(state)?;
        self.eval_s += clock.elapsed().as_secs_f64();
        Ok(out)
    }

    fn kinetic(state: &RankState) -> f64 {
        state
            .momenta
            .iter()
            .zip(&state.masses)
            .map(|(p, &m)| (p[0] * p[0] + p[1] * p[1] + p[2] * p[2]) / (2.0 * m))
            .sum()
    }

    fn thermo_row(
        &self,
        step: u64,
        state: &RankState,
        forces: &RankForces,
        red: &Reduced,
    ) -> ThermoRow {
        let n = self.topology.len() as f64;
        let temperature = 2.0 * red.kinetic / (3.0 * n * units::boltzmann());
        let volume = periodic_volume(&state.cell, self.topology.pbc);
        let g = &forces.strain_gradient;
        let pressure_gpa =
            volume.map(|v| (2.0 * red.kinetic - (g[0] + g[4] + g[8])) / (3.0 * v) / units::gpa());
        let total = forces.energy + red.kinetic;
        let elapsed = self.started.elapsed().as_secs_f64();
        let done = (step - self.first_step) as f64;
        ThermoRow {
            step,
            time_ps: step as f64 * self.config.dt_fs * 1e-3,
            temperature,
            potential: forces.energy,
            kinetic: red.kinetic,
            total,
            conserved: total
                + red.heat_removed
                + self.chain_energy()
                + self.pv_energy(volume.unwrap_or(0.0)),
            pressure_gpa,
            volume,
            rebuilds: state.rebuilds,
            migrated: red.migrated as u64,
            ns_per_day: if elapsed > 0.0 {
                done * self.config.dt_fs * 1e-6 / (elapsed / 86400.0)
            } else {
                0.0
            },
        }
    }

    /// The per-step reduction: kinetic energy, non-finite forces, the stop
    /// request, thermostat heat, migrations.
    fn reduce_step(&self, state: &RankState) -> Result<Reduced, MdError> {
        let bad = state
            .forces
            .iter()
            .filter(|f| !f.iter().all(|x| x.is_finite()))
            .count() as f64;
        let stop = self
            .config
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::SeqCst));
        // Each rank's share of the heat (rank 0's includes the restart's).
        let heat = self.thermostat.heat_removed;
        let (s, m) = reduce(
            state.comm()?,
            &[Self::kinetic(state), bad, heat, state.migrated as f64],
            &[if stop { 1.0 } else { 0.0 }],
        )?;
        Ok(Reduced {
            kinetic: s[0],
            nonfinite_forces: s[1],
            heat_removed: s[2],
            migrated: s[3],
            stop: m[0] > 0.0,
        })
    }

    fn check_finite(step: u64, forces: &RankForces, red: &Reduced) -> Result<(), MdError> {
        if !forces.energy.is_finite() {
            return Err(MdError::NonFinite {
                step,
                what: format!("the potential energy ({})", forces.energy),
            });
        }
        if red.nonfinite_forces > 0.0 {
            return Err(MdError::NonFinite {
                step,
                what: format!("the force on {} atom(s)", red.nonfinite_forces),
            });
        }
        if !red.kinetic.is_finite() {
            return Err(MdError::NonFinite {
                step,
                what: "the kinetic energy".into(),
            });
        }
        Ok(())
    }

    fn frame(&self, step: u64, state: &RankState, forces: &RankForces) -> Result<Frame, MdError> {
        let n = self.topology.len();
        let mut rows = gather_rows(
            state.comm()?,
            n,
            &state.gids,
            &[
                &state.positions[..state.n_owned()],
                &state.momenta,
                &state.forces,
            ],
        )?;
        let stress = periodic_volume(&state.cell, self.topology.pbc)
            .map(|v| stress_voigt(&forces.strain_gradient, v));
        let forces_rows = rows.pop().unwrap_or_default();
        let momenta = rows.pop().unwrap_or_default();
        let positions = rows.pop().unwrap_or_default();
        Ok(Frame {
            step,
            cell: state.cell,
            positions,
            momenta,
            forces: forces_rows,
            energy: forces.energy,
            stress,
        })
    }

    fn checkpoint(
        &self,
        step: u64,
        state: &RankState,
        red: &Reduced,
    ) -> Result<Checkpoint, MdError> {
        let n = self.topology.len();
        let mut rows = gather_rows(
            state.comm()?,
            n,
            &state.gids,
            &[
                &state.positions[..state.n_owned()],
                &state.momenta,
                &state.build_positions,
            ],
        )?;
        let build_positions = rows.pop().unwrap_or_default();
        let momenta = rows.pop().unwrap_or_default();
        let positions = rows.pop().unwrap_or_default();
        Ok(Checkpoint {
            format: CHECKPOINT_FORMAT.into(),
            version: CHECKPOINT_VERSION,
            step,
            ensemble: self.config.ensemble.name().into(),
            seed: self.config.seed,
            numbers: self.topology.numbers.clone(),
            masses: self.topology.masses.iter().map(|m| m.to_bits()).collect(),
            cell: state.cell.matrix.map(|r| r.map(f64::to_bits)),
            positions,
            momenta,
            build_positions,
            thermostat: ThermostatState {
                heat_removed: red.heat_removed,
                chain_positions: self.thermostat.chain_positions.clone(),
                chain_momenta: self.thermostat.chain_momenta.clone(),
            },
            ranks: state.size,
            rebuilds: state.rebuilds,
            migrated: red.migrated as u64,
        })
    }

    /// The chain's energy: Σ pⱼ²/2Qⱼ + N_f·kT·η₁ + kT·Σⱼ₍≥₂₎ ηⱼ (0 for
    /// other ensembles).
    fn chain_energy(&self) -> f64 {
        let Some((kt, q, dof)) = self.chain_constants() else {
            return 0.0;
        };
        let th = &self.thermostat;
        let mut e = 0.0;
        for (j, (&eta, &p)) in th.chain_positions.iter().zip(&th.chain_momenta).enumerate() {
            e += p * p / (2.0 * q[j]) + if j == 0 { dof * kt * eta } else { kt * eta };
        }
        e
    }

    /// P₀·V (eV) for `npt`, 0 otherwise.
    fn pv_energy(&self, volume: f64) -> f64 {
        match self.config.ensemble {
            Ensemble::Npt { pressure_gpa, .. } => pressure_gpa * units::gpa() * volume,
            _ => 0.0,
        }
    }

    /// The stochastic cell rescaling move of `npt`: reduces the kinetic
    /// tensor Σ pₐp_b/m over ranks (rank order), forms the pressure tensor
    /// with the virial of `forces`, draws the noise from the counter-based
    /// generator keyed by (seed, step) on reserved streams (the same numbers
    /// on every rank), and scales the cell and the owned positions by the
    /// deformation μ and the momenta by μ⁻¹. The caller rebuilds the
    /// decomposition. Collective.
    fn rescale_cell(
        &self,
        state: &mut RankState,
        forces: &RankForces,
        step: u64,
    ) -> Result<(), MdError> {
        let Ensemble::Npt {
            temperature,
            pressure_gpa,
            pdamp_fs,
            compressibility_per_gpa,
            cell_dof,
            ..
        } = self.config.ensemble
        else {
            return Ok(());
        };
        let volume = state.cell.volume();
        let mut kin = [0.0; 9];
        for (p, &m) in state.momenta.iter().zip(&state.masses) {
            for a in 0..3 {
                for b in 0..3 {
                    kin[3 * a + b] += p[a] * p[b] / m;
                }
            }
        }
        let (kin, _) = reduce(state.comm()?, &kin, &[])?;
        let g = &forces.strain_gradient;
        // Pressure tensor (eV/Å³): kinetic part minus the (symmetrised) stress.
        let pressure =
            |a: usize, b: usize| (kin[3 * a + b] - 0.5 * (g[3 * a + b] + g[3 * b + a])) / volume;
        let kt = units::boltzmann() * temperature;
        let p0 = pressure_gpa * units::gpa();
        let beta = compressibility_per_gpa / units::gpa();
        let tau = pdamp_fs * units::fs();
        let dt = self.dt;
        // Reserved noise streams: global ids are below the atom count.
        let z1 = gaussian3(self.config.seed, u64::MAX, step);
        let z2 = gaussian3(self.config.seed, u64::MAX - 1, step);
        // The deformation μ (row vectors: r' = r·μ, cell rows h' = h·μ).
        let mut mu = [[0.0; 3]; 3];
        match cell_dof {
            CellDof::Iso => {
                let p = (pressure(0, 0) + pressure(1, 1) + pressure(2, 2)) / 3.0;
                let deps = -(beta / tau) * (p0 - p - kt / volume) * dt
                    + (2.0 * kt * beta * dt / (volume * tau)).sqrt() * z1[0];
                let s = (deps / 3.0).exp();
                for (a, row) in mu.iter_mut().enumerate() {
                    row[a] = s;
                }
            }
            CellDof::Full => {
                // Each of the six strain components relaxes with β/3, so
                // that the volume (their trace) relaxes as in `Iso`; an
                // off-diagonal component enters the work twice, hence half
                // the mobility and half the noise variance.
                let b3 = beta / 3.0;
                let sd = (2.0 * kt * b3 * dt / (volume * tau)).sqrt();
                let mut eps = [[0.0; 3]; 3];
                for a in 0..3 {
                    eps[a][a] = -(b3 / tau) * (p0 - pressure(a, a) - kt / volume) * dt + sd * z1[a];
                }
                for (k, (a, b)) in [(1, 2), (0, 2), (0, 1)].into_iter().enumerate() {
                    let e = (b3 / tau) * pressure(a, b) * dt
                        + sd * std::f64::consts::FRAC_1_SQRT_2 * z2[k];
                    eps[a][b] = e;
                    eps[b][a] = e;
                }
                // μ = exp(ε) to second order (ε is O(√dt) small).
                for a in 0..3 {
                    for b in 0..3 {
                        let sq: f64 = (0..3).map(|c| eps[a][c] * eps[c][b]).sum();
                        mu[a][b] = f64::from(u8::from(a == b)) + eps[a][b] + 0.5 * sq;
                    }
                }
            }
        }
        let inv = invert3(&mu).ok_or_else(|| MdError::NonFinite {
            step,
            what: "the barostat's cell deformation".into(),
        })?;
        let apply = |v: &[f64; 3], m: &[[f64; 3]; 3]| -> [f64; 3] {
            [0, 1, 2].map(|b| v[0] * m[0][b] + v[1] * m[1][b] + v[2] * m[2][b])
        };
        let cell = state.cell.matrix.map(|row| apply(&row, &mu));
        if !cell.iter().flatten().all(|x| x.is_finite()) {
            return Err(MdError::NonFinite {
                step,
                what: "the cell".into(),
            });
        }
        state.cell = Cell::new(cell);
        let n = state.n_owned();
        for r in state.positions[..n].iter_mut() {
            *r = apply(r, &mu);
        }
        // Momenta are covectors: p' = p·μ⁻ᵀ (μ is symmetric here).
        for p in state.momenta.iter_mut() {
            *p = apply(p, &inv);
        }
        Ok(())
    }

    /// kT (eV), the chain masses Qⱼ and the degrees of freedom N_f = 3N.
    fn chain_constants(&self) -> Option<(f64, Vec<f64>, f64)> {
        let Ensemble::NoseHoover {
            temperature,
            tdamp_fs,
            chain,
        } = self.config.ensemble
        else {
            return None;
        };
        let kt = units::boltzmann() * temperature;
        let tau = tdamp_fs * units::fs();
        let dof = 3.0 * self.topology.len() as f64;
        let q = (0..chain)
            .map(|j| {
                if j == 0 {
                    dof * kt * tau * tau
                } else {
                    kt * tau * tau
                }
            })
            .collect();
        Some((kt, q, dof))
    }

    /// Advances the Nosé–Hoover chain by half a time step and scales the
    /// momenta (Martyna–Tuckerman–Klein, one Trotter sweep each way). The
    /// kinetic energy is reduced over ranks in rank order, so the chain
    /// variables stay the same bits on every rank. Collective.
    fn chain_half_step(&mut self, state: &mut RankState) -> Result<(), MdError> {
        let Some((kt, q, dof)) = self.chain_constants() else {
            return Ok(());
        };
        let m = q.len();
        let (s, _) = reduce(state.comm()?, &[Self::kinetic(state)], &[])?;
        let mut ke = s[0];
        let th = &mut self.thermostat;
        th.chain_positions.resize(m, 0.0);
        th.chain_momenta.resize(m, 0.0);
        let (eta, p) = (&mut th.chain_positions, &mut th.chain_momenta);
        let delta = 0.5 * self.dt;
        let force = |j: usize, p: &[f64], ke: f64| {
            if j == 0 {
                2.0 * ke - dof * kt
            } else {
                p[j - 1] * p[j - 1] / q[j - 1] - kt
            }
        };
        // Inward: from the end of the chain to the first thermostat.
        p[m - 1] += 0.5 * delta * force(m - 1, p, ke);
        for j in (0..m - 1).rev() {
            let aa = (-0.25 * delta * p[j + 1] / q[j + 1]).exp();
            p[j] *= aa;
            p[j] += 0.5 * delta * force(j, p, ke);
            p[j] *= aa;
        }
        let scale = (-delta * p[0] / q[0]).exp();
        for v in state.momenta.iter_mut() {
            for x in v.iter_mut() {
                *x *= scale;
            }
        }
        ke *= scale * scale;
        for j in 0..m {
            eta[j] += delta * p[j] / q[j];
        }
        // Outward again.
        for j in 0..m - 1 {
            let aa = (-0.25 * delta * p[j + 1] / q[j + 1]).exp();
            p[j] *= aa;
            p[j] += 0.5 * delta * force(j, p, ke);
            p[j] *= aa;
        }
        p[m - 1] += 0.5 * delta * force(m - 1, p, ke);
        Ok(())
    }

    fn half_kick(&self, state: &mut RankState) {
        let h = 0.5 * self.dt;
        for (p, f) in state.momenta.iter_mut().zip(&state.forces) {
            for k in 0..3 {
                p[k] += h * f[k];
            }
        }
    }

    /// Owned positions advance by `tau · p / m`, written as ASE writes it.
    fn drift(&self, state: &mut RankState, tau: f64) {
        let n = state.n_owned();
        for ((r, p), &m) in state.positions[..n]
            .iter_mut()
            .zip(&state.momenta)
            .zip(&state.masses)
        {
            for k in 0..3 {
                r[k] += tau * p[k] / m;
            }
        }
    }

    /// The exact Ornstein–Uhlenbeck update of BAOAB's O step, with the noise
    /// of (seed, global id, step); returns the kinetic energy it removed.
    fn ou_step(
        &self,
        state: &mut RankState,
        step: u64,
        temperature: f64,
        friction_per_ps: f64,
    ) -> f64 {
        let gamma = friction_per_ps / (1000.0 * units::fs());
        let c1 = (-gamma * self.dt).exp();
        let c2 = (1.0 - c1 * c1).sqrt();
        let kt = units::boltzmann() * temperature;
        let before = Self::kinetic(state);
        for ((p, &m), &gid) in state.momenta.iter_mut().zip(&state.masses).zip(&state.gids) {
            let z = gaussian3(self.config.seed, gid, step);
            let s = c2 * (m * kt).sqrt();
            for k in 0..3 {
                p[k] = c1 * p[k] + s * z[k];
            }
        }
        before - Self::kinetic(state)
    }
}

/// Runs `config.steps` MD steps as this rank of `comm`'s world. Every rank
/// passes the same model, topology, start and config; rank 0 passes the sink
/// and gets the summary. On any failure the communicator is aborted so that
/// no peer waits.
pub fn run_rank(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    comm: Box<dyn Communicator>,
    mut sink: Option<&mut dyn MdSink>,
) -> Result<Option<MdSummary>, MdError> {
    config.check()?;
    let n_atoms = topology.len();
    if n_atoms == 0 {
        return Err(MdError::Input("the structure has no atoms".into()));
    }
    for (name, len) in [
        ("positions", start.positions.len()),
        ("momenta", start.momenta.len()),
        ("build positions", start.build_positions.len()),
        ("masses", topology.masses.len()),
    ] {
        if len != n_atoms {
            return Err(MdError::Input(format!("{len} {name} for {n_atoms} atoms")));
        }
    }
    if let Some((i, m)) = topology
        .masses
        .iter()
        .enumerate()
        .find(|(_, m)| !(m.is_finite() && **m > 0.0))
    {
        return Err(MdError::Input(format!(
            "atom {i} has mass {m}; masses must be positive"
        )));
    }
    if matches!(config.ensemble, Ensemble::Npt { .. })
        && periodic_volume(&start.cell, topology.pbc).is_none()
    {
        return Err(MdError::Input(
            "--ensemble npt needs a structure with a full periodic cell (pbc on all three axes \
             and a non-zero volume)"
                .into(),
        ));
    }
    let (mut state, opts, mut evaluator) = crate::state::decompose(
        model,
        config.spec.clone(),
        config.skin,
        config.even_counts,
        config.dtype,
        topology,
        start.cell,
        &start.build_positions,
        &start.momenta,
        comm,
    )?;
    let (rank, size) = (state.rank, state.size);
    if start.restarted {
        // The build reproduced the rows and pairs of the checkpointed run's
        // last build; now its positions since then.
        let n = state.n_owned();
        for k in 0..n {
            state.positions[k] = start.positions[state.gids[k] as usize];
        }
        state.refresh_ghosts()?;
        state.rebuilds = start.rebuilds;
        state.migrated = if rank == 0 { start.migrated } else { 0 };
    }
    let mut run = Run {
        topology,
        config,
        opts,
        dt: config.dt_fs * units::fs(),
        thermostat: ThermostatState {
            // The heat is summed over ranks: rank 0 carries the restart's.
            heat_removed: if rank == 0 {
                start.thermostat.heat_removed
            } else {
                0.0
            },
            ..start.thermostat.clone()
        },
        started: Instant::now(),
        first_step: start.step,
        eval_s: 0.0,
    };
    let mut forces = run.evaluate(&mut state, &mut evaluator)?;
    let mut red = run.reduce_step(&state)?;
    Run::check_finite(start.step, &forces, &red)?;
    if !start.restarted {
        if config.thermo_every > 0 {
            let row = run.thermo_row(start.step, &state, &forces, &red);
            emit(&state, &mut sink, |s| s.thermo(&row))?;
        }
        if config.frame_every > 0 {
            let frame = run.frame(start.step, &state, &forces)?;
            emit(&state, &mut sink, |s| s.frame(&frame, false))?;
        }
    }
    let mut temperature_sum = 0.0;
    let skin_half2 = 0.25 * config.skin * config.skin;
    let mut step = start.step;
    for _ in 0..config.steps {
        step += 1;
        match config.ensemble {
            Ensemble::Nve => {
                run.half_kick(&mut state);
                run.drift(&mut state, run.dt);
            }
            Ensemble::NoseHoover { .. } => {
                run.chain_half_step(&mut state)?;
                run.half_kick(&mut state);
                run.drift(&mut state, run.dt);
            }
            Ensemble::Langevin {
                temperature,
                friction_per_ps,
            } => {
                run.half_kick(&mut state);
                run.drift(&mut state, 0.5 * run.dt);
                let removed = run.ou_step(&mut state, step, temperature, friction_per_ps);
                run.thermostat.heat_removed += removed;
                run.drift(&mut state, 0.5 * run.dt);
            }
            Ensemble::Npt {
                temperature,
                tdamp_fs,
                ..
            } => {
                run.half_kick(&mut state);
                run.drift(&mut state, 0.5 * run.dt);
                let removed = run.ou_step(&mut state, step, temperature, 1000.0 / tdamp_fs);
                run.thermostat.heat_removed += removed;
                run.drift(&mut state, 0.5 * run.dt);
                run.rescale_cell(&mut state, &forces, step)?;
            }
        }
        // Rebuild when any atom anywhere moved more than skin/2, and after
        // every cell change (the ghost images and domains depend on the cell).
        let (_, m) = reduce(state.comm()?, &[], &[state.max_displacement2()])?;
        if m[0] > skin_half2 || matches!(config.ensemble, Ensemble::Npt { .. }) {
            state = state.rebuild(topology, &run.opts)?;
        } else {
            state.refresh_ghosts()?;
        }
        forces = run.evaluate(&mut state, &mut evaluator)?;
        run.half_kick(&mut state);
        if let Ensemble::NoseHoover { .. } = config.ensemble {
            run.chain_half_step(&mut state)?;
        }
        red = run.reduce_step(&state)?;
        Run::check_finite(step, &forces, &red)?;
        let row = run.thermo_row(step, &state, &forces, &red);
        temperature_sum += row.temperature;
        if let (Some(obs), 0) = (&config.on_step, rank) {
            obs.report(&StepProgress {
                done: step - start.step,
                total: config.steps,
                ns_per_day: Some(row.ns_per_day),
                temperature: Some(row.temperature),
                fmax: None,
            });
        }
        let last = step == start.step + config.steps;
        if config.thermo_every > 0 && (step % config.thermo_every == 0 || last) {
            emit(&state, &mut sink, |s| s.thermo(&row))?;
        }
        if config.frame_every > 0 && step % config.frame_every == 0 {
            let frame = run.frame(step, &state, &forces)?;
            emit(&state, &mut sink, |s| s.frame(&frame, false))?;
        }
        let periodic = config.checkpoint_every > 0 && step % config.checkpoint_every == 0;
        if periodic || red.stop || (last && config.final_checkpoint) {
            let ck = run.checkpoint(step, &state, &red)?;
            emit(&state, &mut sink, |s| s.checkpoint(&ck))?;
        }
        if red.stop {
            if config.final_frame {
                let frame = run.frame(step, &state, &forces)?;
                emit(&state, &mut sink, |s| s.frame(&frame, true))?;
            }
            return Err(MdError::Interrupted { step });
        }
    }
    if config.final_frame {
        let frame = run.frame(step, &state, &forces)?;
        emit(&state, &mut sink, |s| s.frame(&frame, true))?;
    }
    let row = run.thermo_row(step, &state, &forces, &red);
    let wall_s = run.started.elapsed().as_secs_f64();
    Ok((rank == 0).then(|| MdSummary {
        ensemble: config.ensemble.name().into(),
        n_atoms,
        ranks: size,
        steps: config.steps,
        last_step: step,
        potential_energy: row.potential,
        kinetic_energy: row.kinetic,
        total_energy: row.total,
        conserved: row.conserved,
        mean_temperature: temperature_sum / config.steps as f64,
        wall_s,
        ns_per_day: row.ns_per_day,
        atom_steps_per_s: if wall_s > 0.0 {
            (n_atoms as f64) * config.steps as f64 / wall_s
        } else {
            0.0
        },
        rebuilds: state.rebuilds,
        migrated: row.migrated,
        eval_s: run.eval_s,
    }))
}

/// Hands something to rank 0's sink; a sink failure (a full disk, say) is
/// announced to every peer, which would otherwise wait in the next step.
fn emit(
    state: &RankState,
    sink: &mut Option<&mut dyn MdSink>,
    f: impl FnOnce(&mut dyn MdSink) -> Result<(), MdError>,
) -> Result<(), MdError> {
    if let Some(s) = sink.as_deref_mut() {
        if let Err(e) = f(s) {
            if let Ok(c) = state.comm() {
                c.abort(&e.to_string());
            }
            return Err(e);
        }
    }
    Ok(())
}
