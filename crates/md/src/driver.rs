//! The MD loop one rank runs: integrators, the rebuild decision, per-step
//! global reductions, and the output hand-off to rank 0's sink.

use crate::checkpoint::{Checkpoint, CHECKPOINT_FORMAT, CHECKPOINT_VERSION};
use crate::collective::{gather_rows, periodic_volume, reduce, stress_voigt};
use crate::config::{CellDof, Ensemble, MdConfig, StartState, ThermostatState};
use crate::force_field::{ExternalForces, RankForceSource, SystemForceField};
use crate::mat3::invert3;
use crate::phases::{lap, DriverPhases, StepPhases};
use crate::process::Counters;
use crate::progress::StepProgress;
use crate::rank_eval::RankForces;
use crate::rng::gaussian3;
use crate::sink::{Frame, MdSink, MdSummary, RankSpread, StepTraffic, ThermoRow};
use crate::state::{BuildOptions, RankState, Topology};
use crate::{units, MdError};
use ddmlip_atoms::Cell;
use ddmlip_comm::Communicator;
use ddmlip_engine::Model;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Per-step global sums and maxima, reduced in rank order.
struct Reduced {
    kinetic: f64,
    nonfinite_forces: f64,
    stop: bool,
    heat_removed: f64,
    migrated: f64,
    /// Largest squared displacement since the last build that the next
    /// step's force call will see (its positions were advanced ahead of the
    /// reduction); `None` when the ensemble cannot advance ahead.
    next_displacement2: Option<f64>,
}

/// The next step's first half (kick and drift, and the O step of
/// Langevin), done ahead of this step's reduction so that the reduction can
/// carry the displacement criterion: one collective per step. The rank
/// state keeps this step's values for output; the advanced ones wait here.
#[derive(Default)]
struct Ahead {
    positions: Vec<[f64; 3]>,
    momenta: Vec<[f64; 3]>,
    /// Kinetic energy the O step removed (Langevin), `None` when nothing is
    /// waiting.
    heat: Option<f64>,
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
    ahead: Ahead,
    /// Sums of the driver's phases since the steady window began.
    phases: DriverPhases,
}

impl Run<'_> {
    fn evaluate(
        &mut self,
        state: &mut RankState,
        source: &mut RankForceSource<'_, '_>,
    ) -> Result<RankForces, MdError> {
        let clock = Instant::now();
        let out = source.evaluate(state)?;
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

    /// The per-step reduction, the step's one collective: kinetic energy,
    /// non-finite forces, the stop request, thermostat heat, migrations,
    /// the energy and strain-gradient shares the evaluation left unsummed
    /// (completed in `forces`), and — unless `last` — the displacement the
    /// next force call will see, from the next step's first half advanced
    /// ahead (`Run::look_ahead`).
    fn reduce_step(
        &mut self,
        state: &mut RankState,
        forces: &mut RankForces,
        step: u64,
        last: bool,
    ) -> Result<Reduced, MdError> {
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
        let mut sums = vec![Self::kinetic(state), bad, heat, state.migrated as f64];
        if forces.energy_partial {
            sums.push(forces.energy);
        }
        if forces.strain_partial {
            sums.extend_from_slice(&forces.strain_gradient);
        }
        let look = !last && Self::advances_ahead(&self.config.ensemble);
        let mut clock = Instant::now();
        let displacement2 = if look {
            self.look_ahead(state, step + 1)
        } else {
            0.0
        };
        // The look-ahead is the next step's integration.
        self.phases.integrate += lap(&mut clock);
        let (s, m) = reduce(
            state.comm()?,
            &sums,
            &[if stop { 1.0 } else { 0.0 }, displacement2],
        )?;
        self.phases.reduce += lap(&mut clock);
        let mut k = 4;
        if forces.energy_partial {
            forces.energy = s[k];
            forces.energy_partial = false;
            k += 1;
        }
        if forces.strain_partial {
            forces.strain_gradient.copy_from_slice(&s[k..k + 9]);
            forces.strain_partial = false;
        }
        Ok(Reduced {
            kinetic: s[0],
            nonfinite_forces: s[1],
            heat_removed: s[2],
            migrated: s[3],
            stop: m[0] > 0.0,
            next_displacement2: look.then_some(m[1]),
        })
    }

    /// Ensembles whose next positions depend only on this rank's data
    /// (and the counter-based noise), so they can be advanced ahead.
    fn advances_ahead(ensemble: &Ensemble) -> bool {
        matches!(ensemble, Ensemble::Nve | Ensemble::Langevin { .. })
    }

    /// The part of `step` before its force call for `nve` and `langevin`:
    /// returns the kinetic energy the O step removed.
    fn first_half(&self, state: &mut RankState, step: u64) -> f64 {
        match self.config.ensemble {
            Ensemble::Langevin {
                temperature,
                friction_per_ps,
            } => {
                self.half_kick(state);
                self.drift(state, 0.5 * self.dt);
                let removed = self.ou_step(state, step, temperature, friction_per_ps);
                self.drift(state, 0.5 * self.dt);
                removed
            }
            _ => {
                self.half_kick(state);
                self.drift(state, self.dt);
                0.0
            }
        }
    }

    /// Runs `next_step`'s first half now and parks its result in `ahead`,
    /// leaving the state at this step; returns the largest squared
    /// displacement since the last build of the advanced positions (the
    /// very numbers the next step's rebuild test would compute).
    fn look_ahead(&mut self, state: &mut RankState, next_step: u64) -> f64 {
        let n = state.n_owned();
        let mut ahead = std::mem::take(&mut self.ahead);
        ahead.positions.clear();
        ahead.positions.extend_from_slice(&state.positions[..n]);
        ahead.momenta.clear();
        ahead.momenta.extend_from_slice(&state.momenta);
        let heat = self.first_half(state, next_step);
        let displacement2 = state.max_displacement2();
        state.positions[..n].swap_with_slice(&mut ahead.positions);
        state.momenta.swap_with_slice(&mut ahead.momenta);
        ahead.heat = Some(heat);
        self.ahead = ahead;
        displacement2
    }

    /// Moves the state to the positions and momenta `look_ahead` parked;
    /// false when nothing was waiting.
    fn take_ahead(&mut self, state: &mut RankState) -> bool {
        let Some(heat) = self.ahead.heat.take() else {
            return false;
        };
        let n = state.n_owned();
        state.positions[..n].swap_with_slice(&mut self.ahead.positions);
        state.momenta.swap_with_slice(&mut self.ahead.momenta);
        self.thermostat.heat_removed += heat;
        true
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
            domains: Some(state.domains.clone()),
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
    /// `kinetic`, when given, is the reduced kinetic energy of the current
    /// momenta (the step reduction's, the same bits), which saves the
    /// collective.
    fn chain_half_step(
        &mut self,
        state: &mut RankState,
        kinetic: Option<f64>,
    ) -> Result<(), MdError> {
        let Some((kt, q, dof)) = self.chain_constants() else {
            return Ok(());
        };
        let m = q.len();
        let mut ke = match kinetic {
            Some(ke) => ke,
            None => reduce(state.comm()?, &[Self::kinetic(state)], &[])?.0[0],
        };
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
    sink: Option<&mut dyn MdSink>,
) -> Result<Option<MdSummary>, MdError> {
    // On a pool worker, so that each step's parallel loops run in place
    // (MPI is started `Serialized`: any one thread may call it).
    ddmlip_engine::on_pool_worker(|| {
        run_rank_with(model, topology, start, config, comm, sink, None)
    })
}

/// Runs `config.steps` MD steps on one rank with the forces of `field`
/// (the whole system per call, e.g. a GPU model) in place of the engine's.
/// `model` still gives the cutoff of the rank's skin list and is never
/// evaluated. Everything else is [`run_rank`]'s: ensembles, checkpoints
/// and restarts, the sink and the summary.
pub fn run_with_force_field(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    field: &mut dyn SystemForceField,
    sink: &mut dyn MdSink,
) -> Result<MdSummary, MdError> {
    config.check()?;
    let comm = crate::threads::single_rank_comm()?;
    run_rank_with(
        model,
        topology,
        start,
        config,
        comm,
        Some(sink),
        Some(ExternalForces::System(field)),
    )?
    .ok_or_else(|| MdError::Internal("the one rank returned no result".into()))
}

/// [`run_rank`] with the forces of `field`, this rank's rows per call (a
/// model with its own kernels, e.g. a GPU model whose ranks share the
/// device), in place of the engine's. `model` gives the cutoff and spec of
/// the rank's rows and is never evaluated.
pub fn run_rank_with_force_field(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    comm: Box<dyn Communicator>,
    sink: Option<&mut dyn MdSink>,
    field: &mut dyn crate::force_field::RankForceField,
) -> Result<Option<MdSummary>, MdError> {
    run_rank_with(
        model,
        topology,
        start,
        config,
        comm,
        sink,
        Some(ExternalForces::Rank(field)),
    )
}

fn run_rank_with(
    model: &dyn Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    comm: Box<dyn Communicator>,
    mut sink: Option<&mut dyn MdSink>,
    field: Option<ExternalForces<'_>>,
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
        start.domains.as_ref(),
        (
            config.repartition_every,
            config.max_imbalance,
            config.point_to_point,
        ),
        comm,
    )?;
    evaluator.set_device(config.device.clone());
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
        ahead: Ahead::default(),
        phases: DriverPhases::default(),
    };
    // The energy and virial sums over ranks ride on the step reduction.
    evaluator.defer_global_sums(true);
    let mut source = RankForceSource::new(evaluator, field, topology.pbc);
    let last_step = start.step + config.steps;
    let mut traffic = StepTraffic::default();
    let mut forces = run.evaluate(&mut state, &mut source)?;
    let mut red = run.reduce_step(&mut state, &mut forces, start.step, config.steps == 0)?;
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
    let setup_s = run.started.elapsed().as_secs_f64();
    // The steady window: from the end of the first step (which settles the
    // memory later steps reuse) to the end of the run; the whole loop for a
    // one-step run.
    let mut steady = (Instant::now(), Counters::now(), config.steps);
    run.phases = DriverPhases::default();
    source.reset_phases();
    let mut temperature_sum = 0.0;
    let skin_half2 = 0.25 * config.skin * config.skin;
    let mut step = start.step;
    for _ in 0..config.steps {
        step += 1;
        let before = state.comm()?.stats();
        let rebuilds_before = state.rebuilds;
        let mut clock = Instant::now();
        let advanced = run.take_ahead(&mut state);
        match config.ensemble {
            Ensemble::Nve | Ensemble::Langevin { .. } => {
                if !advanced {
                    let removed = run.first_half(&mut state, step);
                    run.thermostat.heat_removed += removed;
                }
            }
            Ensemble::NoseHoover { .. } => {
                // The last reduction's kinetic energy is that of these momenta.
                run.chain_half_step(&mut state, Some(red.kinetic))?;
                run.half_kick(&mut state);
                run.drift(&mut state, run.dt);
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
        // Rebuild when any atom anywhere moved more than skin/2 (known from
        // the last reduction when the step was advanced ahead), and after
        // every cell change (the ghost images and domains depend on the cell).
        run.phases.integrate += lap(&mut clock);
        let rebuild = match (advanced, red.next_displacement2) {
            _ if matches!(config.ensemble, Ensemble::Npt { .. }) => true,
            (true, Some(d2)) => d2 > skin_half2,
            _ => reduce(state.comm()?, &[], &[state.max_displacement2()])?.1[0] > skin_half2,
        };
        if rebuild {
            state = state.rebuild(topology, &run.opts)?;
            run.phases.rebuild += lap(&mut clock);
        } else {
            state.refresh_ghosts()?;
            run.phases.ghost_refresh += lap(&mut clock);
        }
        forces = run.evaluate(&mut state, &mut source)?;
        // The evaluator times its own phases.
        lap(&mut clock);
        run.half_kick(&mut state);
        if let Ensemble::NoseHoover { .. } = config.ensemble {
            run.chain_half_step(&mut state, None)?;
        }
        run.phases.integrate += lap(&mut clock);
        red = run.reduce_step(&mut state, &mut forces, step, step == last_step)?;
        traffic.add(
            &state.comm()?.stats().since(&before),
            state.rebuilds != rebuilds_before,
        );
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
        let last = step == last_step;
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
        if step == start.step + 1 && config.steps > 1 {
            steady = (Instant::now(), Counters::now(), config.steps - 1);
            run.phases = DriverPhases::default();
            source.reset_phases();
        }
        if red.stop {
            if config.final_frame {
                let frame = run.frame(step, &state, &forces)?;
                emit(&state, &mut sink, |s| s.frame(&frame, true))?;
            }
            return Err(MdError::Interrupted { step });
        }
    }
    let (steady_start, steady_counters, steady_steps) = steady;
    let step_s = steady_start.elapsed().as_secs_f64() / steady_steps.max(1) as f64;
    let (cpu_s_per_step, faults_per_step) =
        steady_counters.per_step(&Counters::now(), steady_steps);
    let phase_s = StepPhases::from_sums(&run.phases, &source.phases(), steady_steps, step_s);
    // Every rank's own compute, once: one all-gather after the last step.
    let busy = {
        let p = source.phases();
        (p.filter + p.forward + p.backward) / steady_steps.max(1) as f64
    };
    let (busy_sum, busy_max) = reduce(state.comm()?, &[busy], &[busy, -busy])?;
    let rank_busy_s = RankSpread {
        min: -busy_max[1],
        mean: busy_sum[0] / size as f64,
        max: busy_max[0],
    };
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
        setup_s,
        step_s,
        cpu_s_per_step,
        faults_per_step,
        phase_s,
        traffic,
        repartitions: state.repartitions,
        rank_busy_s,
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
