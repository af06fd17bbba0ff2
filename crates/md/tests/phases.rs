//! The per-phase breakdown of the steady MD step (`MdSummary::phase_s`):
//! the phases account for the step's wall-clock time, each is where the
//! work happens (no rebuild time in a run that never rebuilds after its
//! first build, a rebuild time once a hot run rebuilds), and none is
//! negative; the spread of the ranks' own compute holds rank 0's.

mod common;

use common::{argon_topology, fcc_argon, run};
use ddmlip_md::{maxwell_boltzmann, Ensemble, MdConfig, StartState, StepPhases};
use ddmlip_models::load_model;

fn phases(p: &StepPhases) -> [(&'static str, f64); 8] {
    [
        ("integrate", p.integrate),
        ("rebuild", p.rebuild),
        ("ghost_refresh", p.ghost_refresh),
        ("filter", p.filter),
        ("forward", p.forward),
        ("backward", p.backward),
        ("force_return", p.force_return),
        ("reduce", p.reduce),
    ]
}

#[test]
fn phases_account_for_the_steady_step() {
    let (positions, cell) = fcc_argon(6, 5.3, 0.05);
    let topology = argon_topology(positions.len());
    let model = load_model("lj").expect("lj");
    for (temperature, ranks) in [(20.0, 1), (20.0, 2), (3000.0, 2)] {
        let momenta = maxwell_boltzmann(&topology.masses, temperature, 5);
        let start = StartState::fresh(cell, positions.clone(), momenta);
        let mut config = MdConfig::new(Ensemble::Nve, 2.0, 12);
        config.skin = 0.5;
        let (summary, _) = run(model.as_ref(), &topology, &start, &config, ranks);
        let p = summary.phase_s;
        let what = format!("{ranks} rank(s) at {temperature} K: {p:?}");
        for (name, s) in phases(&p) {
            assert!(s >= 0.0 && s.is_finite(), "{name} = {s} s; {what}");
        }
        // The model's work happens in every step.
        assert!(
            p.filter > 0.0 && p.forward > 0.0 && p.backward > 0.0,
            "{what}"
        );
        // The phases are the step: what is left (output, bookkeeping, clock
        // reads) is a small part of it.
        let step = summary.step_s;
        assert!(
            (p.measured() + p.other - step).abs() <= 1e-9 * step.max(1.0),
            "{what}"
        );
        assert!(p.measured() <= step * 1.001, "{what}; step {step} s");
        assert!(p.measured() >= 0.8 * step, "{what}; step {step} s");
        // Every rank's own compute: ordered, positive, rank 0's among them,
        // and one number for one rank.
        let b = summary.rank_busy_s;
        let busy0 = p.filter + p.forward + p.backward;
        assert!(
            0.0 < b.min && b.min <= b.mean && b.mean <= b.max,
            "{what}; {b:?}"
        );
        assert!(
            b.min <= busy0 * (1.0 + 1e-12) && busy0 <= b.max * (1.0 + 1e-12),
            "{what}; {b:?}"
        );
        if ranks == 1 {
            assert_eq!((b.min, b.max), (b.mean, b.mean), "{what}; {b:?}");
        }
        // Rebuild time only where a steady step rebuilt: the cold crystal
        // keeps its first list, the hot one (atoms moving ~0.3 Å a step
        // against a 0.25 Å half skin) rebuilds.
        if summary.rebuilds == 1 {
            assert_eq!(p.rebuild, 0.0, "{what}");
            assert!(p.ghost_refresh > 0.0 || ranks == 1, "{what}");
        } else {
            assert!(p.rebuild > 0.0, "{what}; {} rebuilds", summary.rebuilds);
        }
    }
}
