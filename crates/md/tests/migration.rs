//! Point-to-point migration: between repartitions each rank sends the atoms
//! that left its domain to their new owners and gets its ghosts from its
//! neighbour ranks. Checked against the collective path (every position
//! gathered, partitioned with the same domains) bit for bit, for regular
//! and count-balanced domains; restarts keep the domains.

mod common;

use common::*;
use ddmlip_md::{maxwell_boltzmann, Ensemble, MdConfig, StartState};
use ddmlip_models::load_model;

/// The hot liquid of the dynamics tests: atoms cross domain boundaries
/// within tens of steps.
fn hot_liquid() -> (ddmlip_md::Topology, StartState) {
    let (pos, cell) = fcc_argon(3, 5.26, 0.2);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 1200.0, 11);
    (topo, StartState::fresh(cell, pos, p))
}

#[test]
fn point_to_point_rebuilds_equal_the_collective_path_bitwise() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    for even_counts in [false, true] {
        for ensemble in [
            Ensemble::Nve,
            Ensemble::Langevin {
                temperature: 1200.0,
                friction_per_ps: 5.0,
            },
        ] {
            for ranks in [2, 3, 8] {
                let mut config = MdConfig::new(ensemble, 2.0, 150);
                config.seed = 9;
                config.skin = 0.4;
                config.even_counts = even_counts;
                // Keep the domains for the whole run in both paths.
                config.repartition_every = 0;
                config.max_imbalance = 1e9;
                config.final_frame = true;
                let (p2p, a) = run(model.as_ref(), &topo, &start, &config, ranks);
                config.point_to_point = false;
                let (coll, b) = run(model.as_ref(), &topo, &start, &config, ranks);
                let (a, b) = (a.last.unwrap(), b.last.unwrap());
                let what = format!(
                    "{} on {ranks} ranks (even counts: {even_counts})",
                    ensemble.name()
                );
                eprintln!(
                    "{what}: {} rebuilds, {} migrated, {} repartitions",
                    p2p.rebuilds, p2p.migrated, p2p.repartitions
                );
                assert!(p2p.rebuilds > 5, "{what}: {} rebuilds", p2p.rebuilds);
                assert!(p2p.migrated > 0, "{what}: nothing migrated");
                assert_eq!(p2p.repartitions, 1, "{what}: repartitioned");
                assert_eq!(p2p.rebuilds, coll.rebuilds, "{what}");
                assert_eq!(p2p.migrated, coll.migrated, "{what}");
                assert_eq!(a.positions, b.positions, "{what}: positions differ");
                assert_eq!(a.momenta, b.momenta, "{what}: momenta differ");
                assert_eq!(a.forces, b.forces, "{what}: forces differ");
            }
        }
    }
}

/// Count-balanced domains move at repartitions; scheduled ones happen, the
/// run still follows the single-process trajectory, and a restart keeps
/// the checkpointed domains (bitwise on the same rank count).
#[test]
fn repartitions_keep_the_trajectory_and_restarts_keep_the_domains() {
    let model = load_model("lj").unwrap();
    let (topo, start) = hot_liquid();
    let ens = Ensemble::Langevin {
        temperature: 1200.0,
        friction_per_ps: 2.0,
    };
    let mut config = MdConfig::new(ens, 2.0, 160);
    config.seed = 21;
    config.skin = 0.4;
    config.even_counts = true;
    config.repartition_every = 4;
    config.final_frame = true;
    config.final_checkpoint = true;
    let (_, one) = run(model.as_ref(), &topo, &start, &config, 1);
    let (whole_summary, whole) = run(model.as_ref(), &topo, &start, &config, 4);
    assert!(
        whole_summary.repartitions > 2,
        "{} repartitions in {} rebuilds",
        whole_summary.repartitions,
        whole_summary.rebuilds
    );
    assert!(whole_summary.repartitions < whole_summary.rebuilds);
    let (one, whole) = (one.last.unwrap(), whole.last.unwrap());
    let dx = max_distance(&whole.positions, &one.positions, &start.cell);
    assert!(dx < 1e-8, "4 ranks differ from 1 by {dx:e} Å");

    let mut half = config.clone();
    half.steps = 80;
    let (_, first) = run(model.as_ref(), &topo, &start, &half, 4);
    let ck = first.checkpoints.last().unwrap().clone();
    assert!(ck.domains.is_some(), "the checkpoint holds no domains");
    let resumed = StartState::from_checkpoint(&ck, &topo).unwrap();
    let (_, second) = run(model.as_ref(), &topo, &resumed, &half, 4);
    let second = second.last.unwrap();
    assert_eq!(second.step, 160);
    assert_eq!(second.positions, whole.positions, "restart is not bitwise");
    assert_eq!(second.momenta, whole.momenta);
    // Without the domains (an older checkpoint), fresh ones are placed: the
    // same trajectory to rounding.
    let mut bare = resumed.clone();
    bare.domains = None;
    let (_, third) = run(model.as_ref(), &topo, &bare, &half, 4);
    let dx = max_distance(
        &third.last.unwrap().positions,
        &whole.positions,
        &start.cell,
    );
    assert!(dx < 1e-8, "restart without domains differs by {dx:e} Å");
}
