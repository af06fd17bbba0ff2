//! Structure relaxation with FIRE on a decomposed system, optionally with
//! the cell as degrees of freedom.
//!
//! The update is ASE's `FIRE` (Bitzek et al. 2006, ASE's defaults): mass-less
//! velocities mixed towards the force direction while the power `F·v` stays
//! positive, reset when it turns negative, and a step length capped at
//! `maxstep`. The dot products and norms it needs (`F·v`, `|F|²`, `|v|²`,
//! `|Δr|²`) and the largest force are reduced over ranks in rank order. The
//! FIRE velocities travel with their atoms when atoms migrate.
//!
//! With [`RelaxConfig::cell`] the cell relaxes too, with the semantics of
//! ASE's `UnitCellFilter` (Tadmor et al. 1999): the degrees of freedom are
//! the atoms' positions mapped back into the starting cell, `r·F⁻ᵀ`, plus
//! three rows `n·F`, where `F` is the deformation gradient of the current
//! cell against the starting one (`h = h₀·Fᵀ`, cell vectors as rows) and `n`
//! the atom count. Their forces are `f·F` on the atoms and
//! `−(V(σ + P·I))·F⁻ᵀ / n` on the cell rows (σ the stress, P the target
//! pressure), so a converged run has σ = −P·I within the force tolerance.
//! The cell rows are the same on every rank; every step that moves the cell
//! rebuilds the decomposition.

use crate::collective::{gather_rows, periodic_volume, reduce, stress_voigt};
use crate::force_field::{ExternalForces, RankForceSource, SystemForceField};
use crate::mat3::{invert3, mul3, row_times, transpose3, Mat3, IDENTITY};
use crate::progress::{StepObserver, StepProgress};
use crate::rank_eval::RankForces;
use crate::sink::Frame;
use crate::state::{RankState, Topology};
use crate::{units, MdError};
use ddmlip_atoms::Cell;
use ddmlip_comm::Communicator;
use ddmlip_engine::{DType, Model};
use ddmlip_spec::MLIPSpec;
use serde::Serialize;

/// Relaxing the cell along with the atoms (ASE's `UnitCellFilter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellRelax {
    /// External hydrostatic pressure (GPa): the run drives the stress
    /// towards −`pressure_gpa`·I (ASE's `scalar_pressure`, in GPa).
    pub pressure_gpa: f64,
}

/// FIRE settings (ASE's defaults; times in ASE units).
#[derive(Debug, Clone)]
pub struct RelaxConfig {
    /// Stop when the largest force on any atom (and, with `cell`, on any
    /// generalized cell row) is below this (eV/Å).
    pub fmax: f64,
    /// Stop after this many steps even if not converged.
    pub max_steps: u64,
    /// Largest displacement of the whole step (Å): the step vector's norm
    /// is capped at it, as ASE does.
    pub maxstep: f64,
    /// Initial FIRE time step (ASE time units).
    pub dt: f64,
    /// Largest FIRE time step (ASE time units).
    pub dt_max: f64,
    /// Verlet skin (Å) of the pair list.
    pub skin: f64,
    /// Precision of the model evaluations.
    pub dtype: DType,
    /// Domains with even atom counts instead of a regular grid.
    pub even_counts: bool,
    /// The decomposition spec; `None` uses the model's declared one.
    pub spec: Option<MLIPSpec>,
    /// Relax the cell too (needs a 3-D periodic structure); `None` keeps it.
    pub cell: Option<CellRelax>,
    /// Called by rank 0 after every step (a progress bar).
    pub on_step: Option<StepObserver>,
    /// Where the op engine's device-eligible ops run (see
    /// `ddmlip_engine::device`); `None`: the host.
    pub device: Option<ddmlip_engine::device::EngineDevice>,
}

impl Default for RelaxConfig {
    fn default() -> Self {
        Self {
            fmax: 0.05,
            max_steps: 1000,
            maxstep: 0.2,
            dt: 0.1,
            dt_max: 1.0,
            skin: 1.0,
            dtype: DType::F64,
            even_counts: false,
            spec: None,
            cell: None,
            on_step: None,
            device: None,
        }
    }
}

impl RelaxConfig {
    /// Rejects impossible settings, naming the flag.
    pub fn check(&self) -> Result<(), MdError> {
        if !(self.fmax.is_finite() && self.fmax > 0.0) {
            return Err(MdError::Input(format!(
                "--fmax must be a positive force in eV/Å, got {}",
                self.fmax
            )));
        }
        if self.max_steps == 0 {
            return Err(MdError::Input("--max-steps must be at least 1".into()));
        }
        if !(self.skin.is_finite() && self.skin >= 0.0) {
            return Err(MdError::Input(format!(
                "--skin must be a non-negative distance in Å, got {}",
                self.skin
            )));
        }
        if let Some(c) = self.cell {
            if !c.pressure_gpa.is_finite() {
                return Err(MdError::Input(format!(
                    "--pressure must be a finite pressure in GPa, got {}",
                    c.pressure_gpa
                )));
            }
        }
        Ok(())
    }
}

/// The outcome of a relaxation (rank 0).
#[derive(Debug, Clone, Serialize)]
pub struct RelaxSummary {
    /// Whether the largest (generalized) force fell below `fmax`.
    pub converged: bool,
    /// FIRE steps taken (force evaluations − 1).
    pub steps: u64,
    /// Potential energy at the start (eV).
    pub initial_energy: f64,
    /// Potential energy at the end (eV).
    pub energy: f64,
    /// Largest force at the end (eV/Å): over the atoms, and with the cell
    /// relaxed also over the three generalized cell rows (the quantity
    /// compared with `fmax`).
    pub fmax: f64,
    /// Number of atoms.
    pub n_atoms: usize,
    /// Ranks the system was split over.
    pub ranks: usize,
    /// Neighbour-list rebuilds (the initial build counts) and atoms that
    /// changed owner.
    pub rebuilds: u64,
    /// Atoms that changed owner.
    pub migrated: u64,
    /// Wall-clock time (s).
    pub wall_s: f64,
    /// Final cell vectors (Å, rows); `None` without a cell.
    pub cell: Option<[[f64; 3]; 3]>,
    /// Final volume (Å³) and pressure −tr(σ)/3 (GPa) of the potential
    /// stress; `None` without a 3-D periodic cell.
    pub volume: Option<f64>,
    /// Final pressure (GPa); see `volume`.
    pub pressure_gpa: Option<f64>,
    /// The final state (positions, forces; momenta are zero).
    #[serde(skip)]
    pub last: Option<Frame>,
}

fn dot(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x[0] * y[0] + x[1] * y[1] + x[2] * y[2])
        .sum()
}

fn max_norm2(rows: &[[f64; 3]]) -> f64 {
    rows.iter()
        .map(|f| f[0] * f[0] + f[1] * f[1] + f[2] * f[2])
        .fold(0.0, f64::max)
}

/// The cell rows of ASE's `UnitCellFilter`, replicated on every rank: the
/// starting cell, the deformation gradient of the current one, the
/// generalized cell forces and the cell rows' FIRE velocity.
struct CellDofs {
    orig: Mat3,
    orig_inv: Mat3,
    /// Target pressure (eV/Å³).
    pressure: f64,
    /// ASE's `cell_factor`: the atom count.
    factor: f64,
    /// Deformation gradient F of the current cell and its inverse.
    deform: Mat3,
    deform_inv: Mat3,
    /// Generalized forces on the three cell rows (eV/Å).
    forces: Mat3,
    /// FIRE velocity of the three cell rows.
    velocity: Mat3,
}

impl CellDofs {
    fn new(cell: &Cell, pressure_gpa: f64, n_atoms: usize) -> Result<Self, MdError> {
        let orig_inv = invert3(&cell.matrix)
            .ok_or_else(|| MdError::Input("--cell: the cell is singular".into()))?;
        Ok(Self {
            orig: cell.matrix,
            orig_inv,
            pressure: pressure_gpa * units::gpa(),
            factor: n_atoms as f64,
            deform: IDENTITY,
            deform_inv: IDENTITY,
            forces: [[0.0; 3]; 3],
            velocity: [[0.0; 3]; 3],
        })
    }

    /// Sets F from `cell` and the generalized cell forces from the strain
    /// gradient ∂E/∂ε (eV): virial = −(sym ∂E/∂ε + P·V·I), forces =
    /// virial·F⁻ᵀ / n, as `UnitCellFilter.get_forces`.
    fn update(&mut self, cell: &Cell, geps: &[f64; 9], step: u64) -> Result<(), MdError> {
        // F = (h₀⁻¹·h)ᵀ, ASE's `deform_grad`.
        self.deform = transpose3(&mul3(&self.orig_inv, &cell.matrix));
        self.deform_inv = invert3(&self.deform).ok_or_else(|| MdError::NonFinite {
            step,
            what: "the cell's deformation gradient".into(),
        })?;
        let pv = self.pressure * cell.volume();
        let virial: Mat3 = [0, 1, 2].map(|a| {
            [0, 1, 2].map(|b| {
                let sym = 0.5 * (geps[3 * a + b] + geps[3 * b + a]);
                -(sym + if a == b { pv } else { 0.0 })
            })
        });
        let reduced = mul3(&virial, &transpose3(&self.deform_inv));
        self.forces = reduced.map(|row| row.map(|x| x / self.factor));
        Ok(())
    }

    /// The atoms' generalized forces f·F.
    fn atom_forces(&self, forces: &[[f64; 3]], out: &mut Vec<[f64; 3]>) {
        out.clear();
        out.extend(forces.iter().map(|f| row_times(f, &self.deform)));
    }

    /// Applies the step: the cell rows move by `scale·Δ` (Δ = dt·velocity),
    /// the atoms' generalized positions `r·F⁻ᵀ` by `scale·dr`; the new cell
    /// is h₀·(I + (F' − I)ᵀ) and the new positions (r·F⁻ᵀ + scale·dr)·(I +
    /// (F' − I)ᵀ), written as `UnitCellFilter.set_positions` writes them.
    fn step(
        &self,
        dt: f64,
        scale: f64,
        positions: &mut [[f64; 3]],
        dr: &[[f64; 3]],
        step: u64,
    ) -> Result<Cell, MdError> {
        let new_deform: Mat3 = [0, 1, 2].map(|a| {
            [0, 1, 2].map(|b| {
                (self.factor * self.deform[a][b] + scale * dt * self.velocity[a][b]) / self.factor
            })
        });
        let map: Mat3 = [0, 1, 2]
            .map(|a| [0, 1, 2].map(|b| IDENTITY[a][b] + (new_deform[b][a] - IDENTITY[b][a])));
        let cell = mul3(&self.orig, &map);
        if !cell.iter().flatten().all(|x| x.is_finite()) {
            return Err(MdError::NonFinite {
                step,
                what: "the cell".into(),
            });
        }
        let to_reference = transpose3(&self.deform_inv);
        for (r, d) in positions.iter_mut().zip(dr) {
            let x = row_times(r, &to_reference);
            *r = row_times(&[0, 1, 2].map(|k| x[k] + scale * d[k]), &map);
        }
        Ok(Cell::new(cell))
    }
}

/// ASE's FIRE state: time step, mixing factor and the count of steps with
/// positive power.
struct Fire {
    dt: f64,
    alpha: f64,
    n_positive: u64,
    first: bool,
}

/// How a FIRE step changes the velocities before the kick.
enum Mix {
    /// Keep them (the first step).
    Keep,
    /// v ← keep·v + toward·F.
    Blend { keep: f64, toward: f64 },
    /// Set them to zero (the power turned negative).
    Reset,
}

impl Fire {
    const N_MIN: u64 = 5;
    const F_INC: f64 = 1.1;
    const F_DEC: f64 = 0.5;
    const ALPHA_START: f64 = 0.1;
    const F_ALPHA: f64 = 0.99;

    fn new(dt: f64) -> Self {
        Self {
            dt,
            alpha: Self::ALPHA_START,
            n_positive: 0,
            first: true,
        }
    }

    /// Adapts dt and α from the global F·v, |F|², |v|² as ASE's `FIRE.step`.
    fn mix(&mut self, vf: f64, ff: f64, vv: f64, dt_max: f64) -> Mix {
        if std::mem::take(&mut self.first) {
            return Mix::Keep;
        }
        if vf > 0.0 {
            let mix = Mix::Blend {
                keep: 1.0 - self.alpha,
                toward: self.alpha * vv.sqrt() / ff.sqrt(),
            };
            if self.n_positive > Self::N_MIN {
                self.dt = (self.dt * Self::F_INC).min(dt_max);
                self.alpha *= Self::F_ALPHA;
            }
            self.n_positive += 1;
            mix
        } else {
            self.alpha = Self::ALPHA_START;
            self.dt *= Self::F_DEC;
            self.n_positive = 0;
            Mix::Reset
        }
    }
}

impl Mix {
    fn apply(&self, velocity: &mut [[f64; 3]], forces: &[[f64; 3]]) {
        match *self {
            Mix::Keep => {}
            Mix::Blend { keep, toward } => {
                for (v, f) in velocity.iter_mut().zip(forces) {
                    for k in 0..3 {
                        v[k] = keep * v[k] + toward * f[k];
                    }
                }
            }
            Mix::Reset => velocity.iter_mut().for_each(|v| *v = [0.0; 3]),
        }
    }
}

/// Relaxes the positions (and with `config.cell` the cell) as this rank of
/// `comm`'s world; every rank passes the same input, rank 0 gets the
/// summary with the final frame.
pub fn relax_rank(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    comm: Box<dyn Communicator>,
) -> Result<Option<RelaxSummary>, MdError> {
    // On a pool worker, as `run_rank` (MPI is started `Serialized`).
    ddmlip_engine::on_pool_worker(|| {
        relax_rank_with(model, topology, cell, positions, config, comm, None)
    })
}

/// Relaxes on one rank with the forces of `field` (the whole system per
/// call, e.g. a GPU model) in place of the engine's; `model` gives the
/// cutoff of the rank's skin list and is never evaluated. Otherwise as
/// [`relax_rank`].
pub fn relax_with_force_field(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    field: &mut dyn SystemForceField,
) -> Result<RelaxSummary, MdError> {
    config.check()?;
    let comm = crate::threads::single_rank_comm()?;
    relax_rank_with(
        model,
        topology,
        cell,
        positions,
        config,
        comm,
        Some(ExternalForces::System(field)),
    )?
    .ok_or_else(|| MdError::Internal("the one rank returned no result".into()))
}

/// [`relax_rank`] with the forces of `field`, this rank's rows per call,
/// in place of the engine's; `model` gives the cutoff and spec of the
/// rank's rows and is never evaluated.
pub fn relax_rank_with_force_field(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    comm: Box<dyn Communicator>,
    field: &mut dyn crate::force_field::RankForceField,
) -> Result<Option<RelaxSummary>, MdError> {
    relax_rank_with(
        model,
        topology,
        cell,
        positions,
        config,
        comm,
        Some(ExternalForces::Rank(field)),
    )
}

fn relax_rank_with(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    comm: Box<dyn Communicator>,
    field: Option<ExternalForces<'_>>,
) -> Result<Option<RelaxSummary>, MdError> {
    config.check()?;
    let started = std::time::Instant::now();
    let n = topology.len();
    if n == 0 || positions.len() != n {
        return Err(MdError::Input(format!(
            "{} positions for {n} atoms",
            positions.len()
        )));
    }
    let mut cell_dofs = match config.cell {
        Some(c) => {
            if periodic_volume(&cell, topology.pbc).is_none() {
                return Err(MdError::Input(
                    "--cell needs a structure with a full periodic cell (pbc on all three axes \
                     and a non-zero volume)"
                        .into(),
                ));
            }
            Some(CellDofs::new(&cell, c.pressure_gpa, n)?)
        }
        None => None,
    };
    // The FIRE velocities live in the momenta slot, so they migrate.
    let zeros = vec![[0.0; 3]; n];
    let (mut state, opts, ev) = crate::state::decompose(
        model,
        config.spec.clone(),
        config.skin,
        config.even_counts,
        config.dtype,
        topology,
        cell,
        positions,
        &zeros,
        None,
        (
            crate::config::DEFAULT_REPARTITION_EVERY,
            crate::config::DEFAULT_MAX_IMBALANCE,
            true,
        ),
        comm,
    )?;
    let mut ev = ev;
    ev.set_device(config.device.clone());
    let mut ev = RankForceSource::new(ev, field, topology.pbc);
    let mut out = ev.evaluate(&mut state)?;
    let initial_energy = out.energy;
    let mut fire = Fire::new(config.dt);
    let skin_half2 = 0.25 * config.skin * config.skin;
    let mut steps = 0;
    // Generalized atom forces (f·F) with the cell relaxed; reused.
    let mut general: Vec<[f64; 3]> = Vec::new();
    let mut dr: Vec<[f64; 3]> = Vec::new();
    let (converged, fmax) = loop {
        let forces: &[[f64; 3]] = match &mut cell_dofs {
            Some(c) => {
                c.update(&state.cell, &out.strain_gradient, steps)?;
                c.atom_forces(&state.forces, &mut general);
                &general
            }
            None => &state.forces,
        };
        let (mut s, m) = reduce(
            state.comm()?,
            &[
                dot(forces, &state.momenta),
                dot(forces, forces),
                dot(&state.momenta, &state.momenta),
            ],
            &[max_norm2(forces)],
        )?;
        let mut fmax2 = m[0];
        if let Some(c) = &cell_dofs {
            // The cell rows come after the atoms, as in ASE's vectors.
            s[0] += dot(&c.forces, &c.velocity);
            s[1] += dot(&c.forces, &c.forces);
            s[2] += dot(&c.velocity, &c.velocity);
            fmax2 = fmax2.max(max_norm2(&c.forces));
        }
        let fmax = fmax2.sqrt();
        if let (Some(obs), 0, 1..) = (&config.on_step, state.rank, steps) {
            obs.report(&StepProgress {
                done: steps,
                total: config.max_steps,
                ns_per_day: None,
                temperature: None,
                fmax: Some(fmax),
            });
        }
        if !(out.energy.is_finite() && fmax.is_finite()) {
            return Err(MdError::NonFinite {
                step: steps,
                what: "the energy or a force".into(),
            });
        }
        if fmax < config.fmax {
            break (true, fmax);
        }
        if steps == config.max_steps {
            break (false, fmax);
        }
        let mix = fire.mix(s[0], s[1], s[2], config.dt_max);
        mix.apply(&mut state.momenta, forces);
        let dt = fire.dt;
        dr.clear();
        for (v, f) in state.momenta.iter_mut().zip(forces) {
            for k in 0..3 {
                v[k] += dt * f[k];
            }
            dr.push([dt * v[0], dt * v[1], dt * v[2]]);
        }
        let (s, _) = reduce(state.comm()?, &[dot(&dr, &dr)], &[])?;
        let mut norm2 = s[0];
        if let Some(c) = &mut cell_dofs {
            mix.apply(&mut c.velocity, &c.forces);
            for (v, f) in c.velocity.iter_mut().zip(&c.forces) {
                for k in 0..3 {
                    v[k] += dt * f[k];
                }
            }
            norm2 += dt * dt * dot(&c.velocity, &c.velocity);
        }
        let norm = norm2.sqrt();
        let scale = if norm > config.maxstep {
            config.maxstep / norm
        } else {
            1.0
        };
        let n_owned = state.n_owned();
        let rebuild = match &cell_dofs {
            Some(c) => {
                state.cell = c.step(dt, scale, &mut state.positions[..n_owned], &dr, steps)?;
                // Domains, ghost images and wrapping depend on the cell.
                true
            }
            None => {
                for (r, d) in state.positions[..n_owned].iter_mut().zip(&dr) {
                    for k in 0..3 {
                        r[k] += scale * d[k];
                    }
                }
                let (_, m) = reduce(state.comm()?, &[], &[state.max_displacement2()])?;
                m[0] > skin_half2
            }
        };
        if rebuild {
            state = state.rebuild(topology, &opts)?;
        } else {
            state.refresh_ghosts()?;
        }
        out = ev.evaluate(&mut state)?;
        steps += 1;
    };
    summary(
        state,
        topology,
        &out,
        started,
        initial_energy,
        steps,
        converged,
        fmax,
    )
}

/// Gathers the final frame and counts onto rank 0. Collective.
#[allow(clippy::too_many_arguments)]
fn summary(
    state: RankState,
    topology: &Topology,
    out: &RankForces,
    started: std::time::Instant,
    initial_energy: f64,
    steps: u64,
    converged: bool,
    fmax: f64,
) -> Result<Option<RelaxSummary>, MdError> {
    let n = topology.len();
    let zeros = vec![[0.0; 3]; state.n_owned()];
    let mut rows = gather_rows(
        state.comm()?,
        n,
        &state.gids,
        &[&state.positions[..state.n_owned()], &state.forces, &zeros],
    )?;
    let (s, _) = reduce(state.comm()?, &[state.migrated as f64], &[])?;
    let momenta = rows.pop().unwrap_or_default();
    let forces = rows.pop().unwrap_or_default();
    let positions = rows.pop().unwrap_or_default();
    let volume = periodic_volume(&state.cell, topology.pbc);
    let stress = volume.map(|v| stress_voigt(&out.strain_gradient, v));
    Ok((state.rank == 0).then(|| RelaxSummary {
        converged,
        steps,
        initial_energy,
        energy: out.energy,
        fmax,
        n_atoms: n,
        ranks: state.size,
        rebuilds: state.rebuilds,
        migrated: s[0] as u64,
        wall_s: started.elapsed().as_secs_f64(),
        cell: (!state.cell.is_zero()).then_some(state.cell.matrix),
        volume,
        pressure_gpa: stress.map(|st| -(st[0] + st[1] + st[2]) / 3.0 / units::gpa()),
        last: Some(Frame {
            step: steps,
            cell: state.cell,
            positions,
            momenta,
            forces,
            energy: out.energy,
            stress,
        }),
    }))
}
