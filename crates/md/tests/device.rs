//! MD and FIRE with the op engine's ops on a device (`MdConfig::device`,
//! `RelaxConfig::device`; here the reference device) follow the host runs,
//! on one rank and split over ranks.

mod common;

use common::*;
use ddmlip_engine::device::{EngineDevice, ReferenceSource};
use ddmlip_md::{maxwell_boltzmann, relax_threads, Ensemble, MdConfig, RelaxConfig, StartState};
use ddmlip_models::load_model;
use std::sync::Arc;

fn device() -> Option<EngineDevice> {
    Some(EngineDevice(Arc::new(ReferenceSource)))
}

#[test]
fn md_on_a_device_follows_the_host_run() {
    let model = load_model("schnet-demo").unwrap();
    let (pos, cell) = fcc_argon(3, 5.26, 0.1);
    let topo = argon_topology(pos.len());
    let p = maxwell_boltzmann(&topo.masses, 600.0, 5);
    let start = StartState::fresh(cell, pos, p);
    let mut config = MdConfig::new(Ensemble::Nve, 1.0, 20);
    config.final_frame = true;
    let (host, host_frames) = run(model.as_ref(), &topo, &start, &config, 1);
    config.device = device();
    for ranks in [1, 2] {
        let (dev, dev_frames) = run(model.as_ref(), &topo, &start, &config, ranks);
        let (a, b) = (host_frames.last.as_ref(), dev_frames.last.as_ref());
        let (a, b) = (a.unwrap(), b.unwrap());
        let dx = max_distance(&a.positions, &b.positions, &cell);
        assert!(
            dx < 1e-10,
            "{ranks} rank(s) on a device: {dx:e} Å from the host"
        );
        let de = (host.potential_energy - dev.potential_energy).abs();
        assert!(
            de < 1e-9 * host.potential_energy.abs().max(1.0),
            "energy {de:e}"
        );
    }
}

#[test]
fn fire_on_a_device_follows_the_host_run() {
    let model = load_model("schnet-demo").unwrap();
    let (rattled, cell) = fcc_argon(2, 5.26, 0.2);
    let topo = argon_topology(rattled.len());
    let mut config = RelaxConfig {
        fmax: 1e-3,
        max_steps: 200,
        skin: 0.3,
        ..Default::default()
    };
    let host = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 1).unwrap();
    config.device = device();
    let dev = relax_threads(model.as_ref(), &topo, cell, &rattled, &config, 2).unwrap();
    assert_eq!(dev.steps, host.steps);
    let dx = max_distance(
        &dev.last.unwrap().positions,
        &host.last.unwrap().positions,
        &cell,
    );
    assert!(dx < 1e-8, "FIRE on a device: {dx:e} Å from the host");
}
