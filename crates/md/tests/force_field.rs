//! MD and FIRE with a whole-system force field (the path GPU models take)
//! against the engine's decomposed path: the force field here is the
//! single-process runtime evaluating the whole periodic system, an
//! independent implementation of the same forces and stress, so the
//! trajectories must agree to rounding — positions, momenta and the cell
//! (whose NPT update reads the stress through ∂E/∂ε). A force field of each
//! rank's rows (the path of GPU ranks sharing a device) is checked the same
//! way on several ranks, against Lennard-Jones summed by hand.

mod common;

use common::*;
use ddmlip_atoms::{Cell, System};
use ddmlip_engine::Distributor;
use ddmlip_engine::Model;
use ddmlip_md::{
    maxwell_boltzmann, relax_threads, relax_threads_with_fields, relax_with_force_field,
    run_threads_with_fields, run_with_force_field, strain_gradient_of_stress, CellDof, CellRelax,
    Ensemble, LocalRows, MdConfig, MdError, RankForceField, RelaxConfig, StartState, SystemEnergy,
    SystemForceField,
};
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions};

/// The single-process runtime as a whole-system force field.
struct Runtime<'m> {
    model: &'m dyn Model,
    calls: usize,
}

impl SystemForceField for Runtime<'_> {
    fn evaluate(
        &mut self,
        positions: &[[f64; 3]],
        numbers: &[u32],
        cell: &Cell,
        pbc: [bool; 3],
        forces: &mut [[f64; 3]],
    ) -> Result<SystemEnergy, MdError> {
        self.calls += 1;
        let sys = System::new(positions.to_vec(), numbers.to_vec(), Some(*cell), pbc);
        let out = evaluate(self.model, &[sys], &EvalOptions::default())
            .map_err(|e| MdError::ForceField(e.to_string()))?;
        forces.copy_from_slice(&out.forces().expect("forces"));
        let stress = out.stress().expect("stress")[0].expect("a periodic stress");
        Ok(SystemEnergy {
            energy: out.energy().expect("energy")[0],
            strain_gradient: strain_gradient_of_stress(&stress, cell.volume()),
            pairs: 0,
        })
    }
}

fn hot_liquid() -> (ddmlip_md::Topology, StartState) {
    let (pos, cell) = fcc_argon(3, 5.26, 0.2);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 1200.0, 11);
    (topo, StartState::fresh(cell, pos, p))
}

/// NPT at 600 K and zero pressure, the full cell free.
fn full_cell_npt() -> Ensemble {
    Ensemble::Npt {
        temperature: 600.0,
        tdamp_fs: 100.0,
        pressure_gpa: 0.0,
        pdamp_fs: 300.0,
        compressibility_per_gpa: 0.3,
        cell_dof: CellDof::Full,
    }
}

fn with_field(
    model: &dyn Model,
    topo: &ddmlip_md::Topology,
    start: &StartState,
    config: &MdConfig,
) -> Collect {
    let mut field = Runtime { model, calls: 0 };
    let mut sink = Collect::default();
    let summary = run_with_force_field(model, topo, start, config, &mut field, &mut sink)
        .unwrap_or_else(|e| panic!("md with a force field failed: {e}"));
    assert_eq!(summary.ranks, 1);
    // One evaluation at the start and one per step: the engine was never asked.
    assert_eq!(field.calls as u64, config.steps + 1);
    sink
}

#[test]
fn nve_langevin_and_npt_follow_the_engine_path() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let npt = full_cell_npt();
    for (name, ensemble, steps) in [
        ("nve", Ensemble::Nve, 300),
        (
            "langevin",
            Ensemble::Langevin {
                temperature: 600.0,
                friction_per_ps: 5.0,
            },
            300,
        ),
        ("npt", npt, 150),
    ] {
        let mut config = MdConfig::new(ensemble, 2.0, steps);
        config.seed = 5;
        config.skin = 0.6;
        config.final_frame = true;
        let field = with_field(model.as_ref(), &topo, &start, &config);
        for ranks in [1, 3] {
            let (_, engine) = run(model.as_ref(), &topo, &start, &config, ranks);
            let (a, b) = (field.last.as_ref().unwrap(), engine.last.as_ref().unwrap());
            let dx = max_distance(&a.positions, &b.positions, &b.cell);
            let dp = max_abs_diff(&a.momenta, &b.momenta);
            let dh = max_abs_diff(&a.cell.matrix, &b.cell.matrix);
            eprintln!("{name}, engine on {ranks} ranks: |Δr| {dx:e} Å, |Δp| {dp:e}, |Δh| {dh:e}");
            assert!(dx < 1e-8, "{name} vs {ranks} ranks: positions {dx:e} Å");
            assert!(dp < 1e-8, "{name} vs {ranks} ranks: momenta {dp:e}");
            assert!(dh < 1e-10, "{name} vs {ranks} ranks: cell {dh:e} Å");
            assert!((a.energy - b.energy).abs() < 1e-8 * b.energy.abs().max(1.0));
        }
        if name == "npt" {
            let v = field.last.as_ref().unwrap().cell.volume();
            assert!(
                (v - start.cell.volume()).abs() > 1e-3 * v,
                "the cell did not move, so the stress path was not exercised"
            );
        }
    }
}

#[test]
fn fire_with_and_without_the_cell_follows_the_engine_path() {
    let model = load_model("lj").unwrap();
    let (rattled, cell) = fcc_argon(3, 5.26, 0.25);
    let topo = argon_topology(rattled.len());
    for relax_cell in [None, Some(CellRelax { pressure_gpa: 0.1 })] {
        let config = RelaxConfig {
            fmax: 1e-5,
            max_steps: 600,
            skin: 0.3,
            cell: relax_cell,
            ..Default::default()
        };
        let mut field = Runtime {
            model: model.as_ref(),
            calls: 0,
        };
        let got =
            relax_with_force_field(model.as_ref(), &topo, cell, &rattled, &config, &mut field)
                .unwrap();
        let want = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 2).unwrap();
        assert!(
            got.converged,
            "{relax_cell:?}: not converged ({})",
            got.fmax
        );
        assert_eq!(got.steps, want.steps, "{relax_cell:?}");
        let (a, b) = (got.last.unwrap(), want.last.unwrap());
        let dx = max_distance(&a.positions, &b.positions, &b.cell);
        assert!(dx < 1e-8, "{relax_cell:?}: positions differ by {dx:e} Å");
        assert!((got.energy - want.energy).abs() < 1e-9);
    }
}

/// A force field that fails the way a GPU model does: a typed input error
/// on the first call, or NaN forces after a few steps.
struct Failing {
    nan_after: Option<usize>,
    calls: usize,
}

impl SystemForceField for Failing {
    fn evaluate(
        &mut self,
        positions: &[[f64; 3]],
        _numbers: &[u32],
        _cell: &Cell,
        _pbc: [bool; 3],
        forces: &mut [[f64; 3]],
    ) -> Result<SystemEnergy, MdError> {
        self.calls += 1;
        let Some(after) = self.nan_after else {
            return Err(MdError::Input(format!(
                "{} atoms do not fit on the device",
                positions.len()
            )));
        };
        let value = if self.calls > after { f64::NAN } else { 0.0 };
        forces.iter_mut().for_each(|f| *f = [value; 3]);
        Ok(SystemEnergy {
            energy: 0.0,
            strain_gradient: [0.0; 9],
            pairs: 0,
        })
    }
}

#[test]
fn force_field_errors_reach_the_caller_typed() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let config = MdConfig::new(Ensemble::Nve, 2.0, 10);
    // Each run gets a fresh field, so its call count starts at zero.
    let run_failing = |nan_after: Option<usize>| {
        let mut field = Failing {
            nan_after,
            calls: 0,
        };
        run_with_force_field(
            model.as_ref(),
            &topo,
            &start,
            &config,
            &mut field,
            &mut Collect::default(),
        )
        .unwrap_err()
    };
    let err = run_failing(None);
    assert!(
        matches!(&err, MdError::Input(m) if m.contains("do not fit")),
        "{err}"
    );
    let err = run_failing(Some(4));
    assert!(
        matches!(err, MdError::NonFinite { step: 4, .. }),
        "expected a NaN stop at step 4, got {err}"
    );
}

/// Lennard-Jones summed by hand over one rank's rows: its owned atoms'
/// energies and forces from every local row within the cutoff (a pair
/// potential needs no exchange), and its share of ∂E/∂ε, half of every
/// pair at each owned end. Independent of the engine's LJ model.
struct RankLj {
    epsilon: f64,
    sigma: f64,
    cutoff: f64,
    calls: usize,
}

impl RankLj {
    fn argon() -> Self {
        Self {
            epsilon: 0.0104,
            sigma: 3.4,
            cutoff: 3.0 * 3.4,
            calls: 0,
        }
    }

    /// φ(d) and dφ/dd, shifted to zero at the cutoff.
    fn pair(&self, d: f64) -> (f64, f64) {
        let lj = |d: f64| {
            let s6 = (self.sigma / d).powi(6);
            4.0 * self.epsilon * (s6 * s6 - s6)
        };
        let s6 = (self.sigma / d).powi(6);
        let slope = 4.0 * self.epsilon * (-12.0 * s6 * s6 + 6.0 * s6) / d;
        (lj(d) - lj(self.cutoff), slope)
    }
}

impl RankForceField for RankLj {
    fn evaluate(
        &mut self,
        rows: &LocalRows<'_>,
        halo: &mut dyn Distributor,
        forces: &mut [[f64; 3]],
    ) -> Result<SystemEnergy, MdError> {
        self.calls += 1;
        assert_eq!(halo.n_owned(), rows.n_owned, "the rows are the halo's rows");
        assert_eq!(halo.n_local(), rows.positions.len());
        let mut energy = 0.0;
        let mut strain_gradient = [0.0; 9];
        for (i, f) in forces.iter_mut().enumerate().take(rows.n_owned) {
            *f = [0.0; 3];
            for (j, pj) in rows.positions.iter().enumerate() {
                let pi = rows.positions[i];
                let r = [pj[0] - pi[0], pj[1] - pi[1], pj[2] - pi[2]];
                let d = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
                if j == i || d >= self.cutoff {
                    continue;
                }
                let (e, slope) = self.pair(d);
                energy += 0.5 * e;
                for a in 0..3 {
                    f[a] += slope * r[a] / d;
                    for b in 0..3 {
                        strain_gradient[3 * a + b] += 0.5 * slope * r[a] * r[b] / d;
                    }
                }
            }
        }
        Ok(SystemEnergy {
            energy,
            strain_gradient,
            pairs: 0,
        })
    }
}

fn rank_fields(ranks: usize) -> Vec<Box<dyn RankForceField>> {
    (0..ranks)
        .map(|_| Box::new(RankLj::argon()) as Box<dyn RankForceField>)
        .collect()
}

/// MD and FIRE with a force field of each rank's rows (the path of GPU
/// ranks sharing a device) on 2 and 3 ranks follow the engine's run on one
/// rank: NVE, NPT (the summed ∂E/∂ε moves the cell), FIRE with the cell.
#[test]
fn rank_force_fields_follow_the_engine_path() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let npt = full_cell_npt();
    for (name, ensemble, steps) in [("nve", Ensemble::Nve, 120), ("npt", npt, 80)] {
        let mut config = MdConfig::new(ensemble, 2.0, steps);
        config.seed = 5;
        config.skin = 0.6;
        config.final_frame = true;
        let (_, engine) = run(model.as_ref(), &topo, &start, &config, 1);
        let b = engine.last.as_ref().unwrap();
        for ranks in [2, 3] {
            let mut sink = Collect::default();
            let summary = run_threads_with_fields(
                model.as_ref(),
                &topo,
                &start,
                &config,
                rank_fields(ranks),
                &mut sink,
            )
            .unwrap_or_else(|e| panic!("{name} on {ranks} rank fields: {e}"));
            assert_eq!(summary.ranks, ranks);
            let a = sink.last.as_ref().unwrap();
            let dx = max_distance(&a.positions, &b.positions, &b.cell);
            let dp = max_abs_diff(&a.momenta, &b.momenta);
            let dh = max_abs_diff(&a.cell.matrix, &b.cell.matrix);
            eprintln!("{name}, {ranks} rank fields: |Δr| {dx:e} Å, |Δp| {dp:e}, |Δh| {dh:e}");
            assert!(dx < 1e-8, "{name}, {ranks} ranks: positions {dx:e} Å");
            assert!(dp < 1e-8, "{name}, {ranks} ranks: momenta {dp:e}");
            assert!(dh < 1e-10, "{name}, {ranks} ranks: cell {dh:e} Å");
            assert!((a.energy - b.energy).abs() < 1e-8 * b.energy.abs().max(1.0));
        }
        if name == "npt" {
            let v = b.cell.volume();
            assert!(
                (v - start.cell.volume()).abs() > 1e-3 * v,
                "the cell did not move"
            );
        }
    }
    let (rattled, cell) = fcc_argon(3, 5.26, 0.25);
    let config = RelaxConfig {
        fmax: 1e-5,
        max_steps: 600,
        skin: 0.3,
        cell: Some(CellRelax { pressure_gpa: 0.1 }),
        ..Default::default()
    };
    let want = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 1).unwrap();
    let got = relax_threads_with_fields(
        model.as_ref(),
        &topo,
        cell,
        &rattled,
        &config,
        rank_fields(3),
    )
    .unwrap();
    assert!(got.converged, "not converged ({})", got.fmax);
    assert_eq!(got.steps, want.steps);
    let (a, b) = (got.last.unwrap(), want.last.unwrap());
    let dx = max_distance(&a.positions, &b.positions, &b.cell);
    assert!(
        dx < 1e-8,
        "FIRE on 3 rank fields: positions differ by {dx:e} Å"
    );
}
