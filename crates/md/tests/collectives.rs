//! Communication per MD step, from the communicators' own counters: a step
//! that reuses its pair list makes exactly one collective call (the step
//! reduction, which also carries the energy, the virial and the next step's
//! displacement test), for `nve` and `langevin` on several rank counts.

mod common;

use common::*;
use ddmlip_md::{maxwell_boltzmann, Ensemble, MdConfig, StartState};
use ddmlip_models::load_model;

#[test]
fn one_collective_per_step_without_rebuild() {
    let model = load_model("lj").unwrap();
    let (pos, cell) = fcc_argon(3, 5.26, 0.2);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 1200.0, 11);
    let start = StartState::fresh(cell, pos, p);
    for ensemble in [
        Ensemble::Nve,
        Ensemble::Langevin {
            temperature: 1200.0,
            friction_per_ps: 5.0,
        },
    ] {
        for ranks in [1, 2, 4] {
            let mut config = MdConfig::new(ensemble, 2.0, 120);
            config.skin = 0.6;
            // Frames and thermo rows on some steps: their gathers are not
            // part of a step's own communication.
            config.frame_every = 40;
            let (summary, _) = run(model.as_ref(), &topo, &start, &config, ranks);
            let t = summary.traffic;
            eprintln!("{} on {ranks} ranks: {t:?}", ensemble.name());
            assert_eq!(t.plain_steps + t.rebuild_steps, 120);
            assert!(t.plain_steps > 60, "{t:?}");
            assert!(t.rebuild_steps > 0, "{t:?}");
            assert_eq!(
                t.plain_collectives,
                t.plain_steps,
                "{} on {ranks} ranks: {} collectives in {} steps without rebuild",
                ensemble.name(),
                t.plain_collectives,
                t.plain_steps
            );
        }
    }
}
