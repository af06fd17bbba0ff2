//! Decomposed MD against single-process MD and against the single-point
//! runtime: forces with a skin list, trajectories across migrations, the
//! Langevin temperature, bitwise restarts, and atom bookkeeping.

mod common;

use common::*;
use ddmlip_atoms::System;
use ddmlip_md::{gather_by_gid, maxwell_boltzmann, Ensemble, MdConfig, Share, StartState};
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EvalOptions};

/// A hot LJ argon liquid: 108 atoms at 1200 K in a 15.8 Å box, so that atoms
/// cross the 2×2×2 domain boundaries within tens of steps.
fn hot_liquid() -> (ddmlip_md::Topology, StartState) {
    let (pos, cell) = fcc_argon(3, 5.26, 0.2);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 1200.0, 11);
    (topo, StartState::fresh(cell, pos, p))
}

/// Step-0 energy, forces and stress of the MD path (persistent rows, skin
/// list filtered to the cutoff) equal the single-process runtime, for every
/// built-in model with a runtime graph and on several rank counts: pairs
/// between cutoff and cutoff + skin contribute nothing.
#[test]
fn skin_list_forces_equal_single_process_for_every_model() {
    let (pos, cell) = fcc_argon(3, 5.26, 0.3);
    // Copper numbers so that every demo model has parameters; the lattice
    // is then compressed, which is fine for a comparison.
    for name in [
        "lj",
        "eam-demo",
        "bp-demo",
        "schnet-demo",
        "qeq-demo",
        "rebuild-demo",
    ] {
        let model = load_model(name).unwrap();
        let z = if name == "lj" { 18 } else { 29 };
        let scale = if name == "lj" { 1.0 } else { 3.61 / 5.26 };
        let pos: Vec<[f64; 3]> = pos.iter().map(|p| p.map(|x| x * scale)).collect();
        let cell = ddmlip_atoms::Cell::new(cell.matrix.map(|r| r.map(|x| x * scale)));
        let sys = System::new(pos.clone(), vec![z; pos.len()], Some(cell), [true; 3]);
        let reference = evaluate(
            model.as_ref(),
            std::slice::from_ref(&sys),
            &EvalOptions::default(),
        )
        .unwrap();
        let ref_f = reference.forces().expect("forces");
        let ref_s = reference.stress().expect("stress")[0].unwrap();
        let mut topo = argon_topology(pos.len());
        topo.numbers = vec![z; pos.len()];
        let start = StartState::fresh(cell, pos.clone(), vec![[0.0; 3]; pos.len()]);
        for ranks in [1, 3, 8] {
            let mut config = MdConfig::new(Ensemble::Nve, 0.1, 1);
            config.skin = 1.5;
            config.frame_every = 1;
            let (_, got) = run(model.as_ref(), &topo, &start, &config, ranks);
            let f0 = &got.frames[0];
            let scale_f = ref_f.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()));
            let df = max_abs_diff(&f0.forces, &ref_f);
            assert!(
                df <= 1e-10 * scale_f.max(1e-3),
                "{name} on {ranks} ranks: forces differ by {df:e} (scale {scale_f:e})"
            );
            let de = (f0.energy - reference.energy().expect("energy")[0]).abs();
            assert!(
                de <= 1e-10 * reference.energy().expect("energy")[0].abs().max(1.0),
                "{name} on {ranks}: energy differs by {de:e}"
            );
            let s = f0.stress.unwrap();
            let scale_s = ref_s.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            for k in 0..6 {
                assert!(
                    (s[k] - ref_s[k]).abs() <= 1e-10 * scale_s.max(1e-6),
                    "{name} on {ranks}: stress[{k}] {} vs {}",
                    s[k],
                    ref_s[k]
                );
            }
        }
    }
}

/// NVE and Langevin (same seed) on 2, 4 and 8 ranks follow the one-rank
/// trajectory of a hot liquid whose atoms migrate between domains.
#[test]
fn decomposed_trajectories_equal_single_process() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    for ensemble in [
        Ensemble::Nve,
        Ensemble::Langevin {
            temperature: 1200.0,
            friction_per_ps: 5.0,
        },
    ] {
        let mut config = MdConfig::new(ensemble, 2.0, 300);
        config.seed = 5;
        config.skin = 0.6;
        config.final_frame = true;
        let (one_summary, one) = run(model.as_ref(), &topo, &start, &config, 1);
        let one = one.last.unwrap();
        assert!(
            one_summary.rebuilds > 3,
            "{} rebuilds",
            one_summary.rebuilds
        );
        for ranks in [2, 4, 8] {
            let (summary, got) = run(model.as_ref(), &topo, &start, &config, ranks);
            let got = got.last.unwrap();
            assert!(summary.migrated > 0, "{ranks} ranks: no atom migrated");
            let dx = max_distance(&got.positions, &one.positions, &start.cell);
            let dp = max_abs_diff(&got.momenta, &one.momenta);
            eprintln!(
                "{} {ranks} ranks: {} rebuilds, {} migrated, max |Δr| {dx:e} Å, max |Δp| {dp:e}",
                ensemble.name(),
                summary.rebuilds,
                summary.migrated
            );
            assert!(
                dx < 1e-8,
                "{} on {ranks} ranks: positions differ by {dx:e} Å",
                ensemble.name()
            );
            assert!(
                dp < 1e-8,
                "{} on {ranks} ranks: momenta differ by {dp:e}",
                ensemble.name()
            );
        }
    }
}

/// A run of 2K steps and a run of K steps + restart from its checkpoint + K
/// steps give bitwise identical positions and momenta on the same rank
/// count, and agree to rounding on another.
#[test]
fn restart_continues_bitwise() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let ens = Ensemble::Langevin {
        temperature: 900.0,
        friction_per_ps: 2.0,
    };
    let mut config = MdConfig::new(ens, 2.0, 120);
    config.seed = 3;
    config.skin = 0.5;
    config.final_frame = true;
    config.final_checkpoint = true;
    let (_, whole) = run(model.as_ref(), &topo, &start, &config, 4);
    let whole = whole.last.unwrap();
    let mut half = config.clone();
    half.steps = 60;
    let (_, first) = run(model.as_ref(), &topo, &start, &half, 4);
    let ck = first.checkpoints.last().unwrap().clone();
    assert_eq!(ck.step, 60);
    // Through the file format, as a real restart reads it.
    let dir = std::env::temp_dir().join(format!("ddmlip-md-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ck.json");
    ck.write(&path).unwrap();
    let ck = ddmlip_md::Checkpoint::read(&path).unwrap();
    let resumed = StartState::from_checkpoint(&ck, &topo).unwrap();
    let (_, second) = run(model.as_ref(), &topo, &resumed, &half, 4);
    let second = second.last.unwrap();
    assert_eq!(second.step, 120);
    assert_eq!(
        second.positions, whole.positions,
        "restart on the same rank count is not bitwise"
    );
    assert_eq!(second.momenta, whole.momenta);
    let (_, other) = run(model.as_ref(), &topo, &resumed, &half, 3);
    let other = other.last.unwrap();
    let dx = max_distance(&other.positions, &whole.positions, &start.cell);
    assert!(dx < 1e-9, "restart on 3 ranks differs by {dx:e} Å");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Langevin holds the target temperature: the mean over the production
/// steps is within 3 % of it.
#[test]
fn langevin_mean_temperature_matches_target() {
    let model = load_model("lj").unwrap();
    let (pos, cell) = fcc_argon(4, 5.26, 0.05);
    let topo = argon_topology(pos.len());
    let target = 60.0;
    let p = maxwell_boltzmann(&topo.masses, 2.0 * target, 1);
    let start = StartState::fresh(cell, pos, p);
    let ens = Ensemble::Langevin {
        temperature: target,
        friction_per_ps: 5.0,
    };
    let mut equil = MdConfig::new(ens, 5.0, 400);
    equil.final_checkpoint = true;
    equil.seed = 17;
    let (_, eq) = run(model.as_ref(), &topo, &start, &equil, 2);
    let ck = eq.checkpoints.last().unwrap();
    let resumed = StartState::from_checkpoint(ck, &topo).unwrap();
    let mut prod = equil.clone();
    prod.steps = 4000;
    let (summary, _) = run(model.as_ref(), &topo, &resumed, &prod, 2);
    let rel = (summary.mean_temperature - target).abs() / target;
    eprintln!(
        "mean temperature {:.3} K (target {target} K)",
        summary.mean_temperature
    );
    assert!(
        rel < 0.03,
        "mean temperature {} K vs target {target} K",
        summary.mean_temperature
    );
}

/// NVE conserves the total energy of a hot liquid through rebuilds and
/// migrations (velocity Verlet: bounded fluctuation, no drift).
#[test]
fn nve_conserves_energy_across_rebuilds() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let mut config = MdConfig::new(Ensemble::Nve, 1.0, 400);
    config.thermo_every = 1;
    config.skin = 0.5;
    let (summary, got) = run(model.as_ref(), &topo, &start, &config, 4);
    assert!(summary.rebuilds > 3);
    let e0 = got.thermo[0].total;
    let ke0 = got.thermo[0].kinetic;
    let worst = got
        .thermo
        .iter()
        .map(|r| (r.total - e0).abs())
        .fold(0.0, f64::max);
    // The kinetic energy swings by a large fraction of itself; the total
    // stays within a small fraction of that.
    assert!(
        worst < 2e-3 * ke0,
        "total energy moved by {worst:e} eV (kinetic {ke0} eV)"
    );
}

/// The ownership check fails on a lost or duplicated atom (so that its
/// passing at every rebuild means something), and a run with many
/// migrations keeps every atom exactly once.
#[test]
fn atoms_are_never_lost_or_duplicated() {
    let comms = ddmlip_comm::thread_world(1, Default::default()).unwrap();
    let comm = &comms[0];
    let ok = Share {
        gids: vec![1, 0, 2],
        positions: vec![[0.0; 3]; 3],
        momenta: vec![[0.0; 3]; 3],
    };
    assert!(gather_by_gid(comm, 3, &ok).is_ok());
    let dup = Share {
        gids: vec![1, 1, 2],
        ..ok
    };
    let err = gather_by_gid(comm, 3, &dup).unwrap_err().to_string();
    assert!(
        err.contains("atom 1 is held by rank 0 and by rank 0"),
        "{err}"
    );
    let lost = Share {
        gids: vec![1, 2],
        positions: vec![[0.0; 3]; 2],
        momenta: vec![[0.0; 3]; 2],
    };
    let err = gather_by_gid(comm, 3, &lost).unwrap_err().to_string();
    assert!(err.contains("atom 0 is held by no rank"), "{err}");

    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let mut config = MdConfig::new(Ensemble::Nve, 2.0, 200);
    config.skin = 0.2;
    config.frame_every = 50;
    let (summary, got) = run(model.as_ref(), &topo, &start, &config, 8);
    assert!(
        summary.migrated > 20,
        "only {} migrations",
        summary.migrated
    );
    assert!(summary.rebuilds > 10);
    for f in &got.frames {
        // gather by id leaves NaN rows for atoms no rank held.
        assert!(
            f.positions.iter().flatten().all(|x| x.is_finite()),
            "step {}: an atom is missing",
            f.step
        );
    }
}

/// The Nosé–Hoover chain keeps its conserved quantity, pulls a system
/// started hot towards the target temperature, and follows the one-rank
/// trajectory on 4 ranks (its kinetic energy is reduced over ranks, so
/// rank counts differ by rounding only).
#[test]
fn nose_hoover_chain_conserves_its_quantity_and_thermostats() {
    let model = load_model("lj").unwrap();
    let (pos, cell) = fcc_argon(3, 5.26, 0.05);
    let topo = argon_topology(pos.len());
    let target = 40.0;
    let p = maxwell_boltzmann(&topo.masses, 3.0 * target, 4);
    let start = StartState::fresh(cell, pos, p);
    let ens = Ensemble::NoseHoover {
        temperature: target,
        tdamp_fs: 50.0,
        chain: 3,
    };
    let mut config = MdConfig::new(ens, 2.0, 1500);
    config.thermo_every = 1;
    config.final_frame = true;
    let (_, one) = run(model.as_ref(), &topo, &start, &config, 1);
    let c0 = one.thermo[0].conserved;
    let drift = one
        .thermo
        .iter()
        .map(|r| (r.conserved - c0).abs())
        .fold(0.0, f64::max);
    let total_swing = one
        .thermo
        .iter()
        .map(|r| (r.total - one.thermo[0].total).abs())
        .fold(0.0, f64::max);
    eprintln!("NHC: conserved moves {drift:e} eV while the total energy moves {total_swing:e} eV");
    assert!(
        total_swing > 0.1,
        "the thermostat did nothing ({total_swing} eV)"
    );
    assert!(
        drift < 1e-3 * total_swing,
        "conserved quantity moved {drift:e} eV"
    );
    let late: Vec<f64> = one.thermo[750..].iter().map(|r| r.temperature).collect();
    let mean = late.iter().sum::<f64>() / late.len() as f64;
    eprintln!("NHC: mean temperature of the second half {mean:.2} K (target {target} K)");
    assert!(
        (mean - target).abs() < 0.15 * target,
        "mean temperature {mean} K"
    );
    let mut short = config.clone();
    short.steps = 300;
    let (_, a) = run(model.as_ref(), &topo, &start, &short, 1);
    let (_, b) = run(model.as_ref(), &topo, &start, &short, 4);
    let dx = max_distance(
        &a.last.unwrap().positions,
        &b.last.unwrap().positions,
        &cell,
    );
    assert!(dx < 1e-8, "4 ranks differ from 1 by {dx:e} Å");
}
