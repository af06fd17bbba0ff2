//! Structure relaxation with FIRE on a decomposed system.
//!
//! The update is ASE's `FIRE` (Bitzek et al. 2006, ASE's defaults): mass-less
//! velocities mixed towards the force direction while the power `F·v` stays
//! positive, reset when it turns negative, and a step length capped at
//! `maxstep`. The dot products and norms it needs (`F·v`, `|F|²`, `|v|²`,
//! `|Δr|²`) and the largest force are reduced over ranks in rank order. The
//! FIRE velocities travel with their atoms when atoms migrate.

use crate::driver::{gather_rows, periodic_volume, reduce, stress_voigt, Frame};
use crate::rank_eval::{LocalRows, RankEvaluator, RankForces};
use crate::state::{BuildOptions, RankState, Share, Topology};
use crate::MdError;
use ddmlip_atoms::Cell;
use ddmlip_comm::Communicator;
use ddmlip_engine::{DType, Model};
use ddmlip_spec::MLIPSpec;
use serde::Serialize;

/// FIRE settings (ASE's defaults; times in ASE units).
#[derive(Debug, Clone)]
pub struct RelaxConfig {
    /// Stop when the largest force on any atom is below this (eV/Å).
    pub fmax: f64,
    /// Stop after this many steps even if not converged.
    pub max_steps: u64,
    /// Largest displacement of the whole step (Å): the step vector's norm
    /// is capped at it, as ASE does.
    pub maxstep: f64,
    /// Initial and largest FIRE time step (ASE time units).
    pub dt: f64,
    pub dt_max: f64,
    pub skin: f64,
    pub dtype: DType,
    pub even_counts: bool,
    pub spec: Option<MLIPSpec>,
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
        Ok(())
    }
}

/// The outcome of a relaxation (rank 0).
#[derive(Debug, Clone, Serialize)]
pub struct RelaxSummary {
    pub converged: bool,
    /// FIRE steps taken (force evaluations − 1).
    pub steps: u64,
    pub initial_energy: f64,
    pub energy: f64,
    /// Largest force on an atom at the end (eV/Å).
    pub fmax: f64,
    pub n_atoms: usize,
    pub ranks: usize,
    pub rebuilds: u64,
    pub migrated: u64,
    pub wall_s: f64,
    /// The final state (positions, forces; momenta are zero).
    #[serde(skip)]
    pub last: Option<Frame>,
}

fn evaluate(state: &mut RankState, ev: &mut RankEvaluator<'_>) -> Result<RankForces, MdError> {
    let rows = LocalRows {
        positions: &state.positions,
        numbers: &state.numbers,
        n_owned: state.n_owned(),
        centers: &state.centers,
        neighbors: &state.neighbors,
        cell: state.cell,
    };
    let out = ev.evaluate(&rows, &mut state.halo)?;
    state.forces.clone_from(&out.forces);
    Ok(out)
}

fn dot(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x[0] * y[0] + x[1] * y[1] + x[2] * y[2])
        .sum()
}

/// Relaxes the positions as this rank of `comm`'s world; every rank passes
/// the same input, rank 0 gets the summary with the final frame.
pub fn relax_rank(
    model: &dyn Model,
    topology: &Topology,
    cell: Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
    comm: Box<dyn Communicator>,
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
    let spec = config
        .spec
        .clone()
        .or_else(|| model.declared_spec())
        .unwrap_or_else(MLIPSpec::standard_energy_model);
    let opts = BuildOptions {
        cutoff: model.cutoff(),
        skin: config.skin,
        halo_depth: spec.halo_depth.max(1) as usize,
        even_counts: config.even_counts,
        with_pairs: model.uses_runtime_graph(),
    };
    let (rank, size) = (comm.rank(), comm.size());
    let mine: Vec<usize> = (rank..n).step_by(size).collect();
    let share = Share {
        gids: mine.iter().map(|&i| i as u64).collect(),
        positions: mine.iter().map(|&i| positions[i]).collect(),
        // The FIRE velocities live in the momenta slot, so they migrate.
        momenta: vec![[0.0; 3]; mine.len()],
    };
    let mut state = RankState::initial(comm, spec.clone(), topology, cell, &share, &opts)?;
    let mut ev = RankEvaluator::new(model, spec, config.dtype);
    let mut out = evaluate(&mut state, &mut ev)?;
    let initial_energy = out.energy;
    let (mut dt, mut alpha, mut n_positive) = (config.dt, 0.1, 0u64);
    let (n_min, f_inc, f_dec, alpha_start, f_alpha) = (5, 1.1, 0.5, 0.1, 0.99);
    let skin_half2 = 0.25 * config.skin * config.skin;
    let mut steps = 0;
    let mut first = true;
    let (converged, fmax) = loop {
        let fmax2_local = state
            .forces
            .iter()
            .map(|f| f[0] * f[0] + f[1] * f[1] + f[2] * f[2])
            .fold(0.0, f64::max);
        let (s, m) = reduce(
            state.comm()?,
            &[
                dot(&state.forces, &state.momenta),
                dot(&state.forces, &state.forces),
                dot(&state.momenta, &state.momenta),
            ],
            &[fmax2_local],
        )?;
        let fmax = m[0].sqrt();
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
        let (vf, ff, vv) = (s[0], s[1], s[2]);
        if !first {
            if vf > 0.0 {
                let mix = alpha * vv.sqrt() / ff.sqrt();
                for (v, f) in state.momenta.iter_mut().zip(&state.forces) {
                    for k in 0..3 {
                        v[k] = (1.0 - alpha) * v[k] + mix * f[k];
                    }
                }
                if n_positive > n_min {
                    dt = (dt * f_inc).min(config.dt_max);
                    alpha *= f_alpha;
                }
                n_positive += 1;
            } else {
                for v in state.momenta.iter_mut() {
                    *v = [0.0; 3];
                }
                alpha = alpha_start;
                dt *= f_dec;
                n_positive = 0;
            }
        }
        first = false;
        let mut dr: Vec<[f64; 3]> = Vec::with_capacity(state.n_owned());
        for (v, f) in state.momenta.iter_mut().zip(&state.forces) {
            for k in 0..3 {
                v[k] += dt * f[k];
            }
            dr.push([dt * v[0], dt * v[1], dt * v[2]]);
        }
        let (s, _) = reduce(state.comm()?, &[dot(&dr, &dr)], &[])?;
        let norm = s[0].sqrt();
        let scale = if norm > config.maxstep {
            config.maxstep / norm
        } else {
            1.0
        };
        let n_owned = state.n_owned();
        for (r, d) in state.positions[..n_owned].iter_mut().zip(&dr) {
            for k in 0..3 {
                r[k] += scale * d[k];
            }
        }
        let (_, m) = reduce(state.comm()?, &[], &[state.max_displacement2()])?;
        if m[0] > skin_half2 {
            state = state.rebuild(topology, &opts)?;
        } else {
            state.refresh_ghosts()?;
        }
        out = evaluate(&mut state, &mut ev)?;
        steps += 1;
    };
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
    let stress =
        periodic_volume(&state.cell, topology.pbc).map(|v| stress_voigt(&out.strain_gradient, v));
    Ok((rank == 0).then(|| RelaxSummary {
        converged,
        steps,
        initial_energy,
        energy: out.energy,
        fmax,
        n_atoms: n,
        ranks: size,
        rebuilds: state.rebuilds,
        migrated: s[0] as u64,
        wall_s: started.elapsed().as_secs_f64(),
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
