//! Evaluations with the engine's ops on a device (`EvalOptions::device`,
//! here the reference device) equal the host evaluation for every demo
//! model, in one process and split over ranks (whose halo exchanges run on
//! the host between device ops), and trace the same ops.

use ddmlip_atoms::build;
use ddmlip_atoms::{Cell, System};
use ddmlip_engine::device::ReferenceSource;
use ddmlip_engine::DType;
use ddmlip_models::load_model;
use ddmlip_runtime::{evaluate, EngineDevice, EvalOptions, EvalResult};
use std::sync::Arc;

const MODELS: [&str; 6] = [
    "lj",
    "eam-demo",
    "bp-demo",
    "schnet-demo",
    "qeq-demo",
    "rebuild-demo",
];

fn systems() -> Vec<System> {
    let mut fcc = build::fcc(29, 3.615, 3);
    build::rattle_uniform(&mut fcc, 0.05, 7);
    let mut slab = build::fcc(29, 3.615, 2);
    build::rattle_uniform(&mut slab, 0.1, 3);
    slab.pbc = [true, true, false];
    let mut cluster = build::fcc(29, 3.615, 2);
    build::rattle_uniform(&mut cluster, 0.1, 5);
    cluster.cell = None;
    cluster.pbc = [false; 3];
    let tilted = System::new(
        fcc.positions[..40].to_vec(),
        fcc.numbers[..40].to_vec(),
        Some(Cell::new([
            [8.0, 0.0, 0.0],
            [2.1, 8.5, 0.0],
            [-1.2, 1.7, 9.0],
        ])),
        [true; 3],
    );
    vec![fcc, slab, cluster, tilted]
}

/// The largest difference between two results over energy, forces and
/// stress, relative to each quantity's largest magnitude.
fn difference(a: &EvalResult, b: &EvalResult) -> f64 {
    let mut worst = 0.0f64;
    for name in ["energy", "forces", "stress", "atomic_energies"] {
        let (Some(x), Some(y)) = (a.outputs.get(name), b.outputs.get(name)) else {
            assert_eq!(a.outputs.contains_key(name), b.outputs.contains_key(name));
            continue;
        };
        assert_eq!(x.values.len(), y.values.len(), "{name}");
        let scale = y
            .values
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(1e-300);
        for (p, q) in x.values.iter().zip(&y.values) {
            if p.is_nan() && q.is_nan() {
                continue;
            }
            worst = worst.max((p - q).abs() / scale);
        }
    }
    worst
}

fn on_device(opts: EvalOptions) -> EvalOptions {
    EvalOptions {
        device: Some(EngineDevice(Arc::new(ReferenceSource))),
        ..opts
    }
}

#[test]
fn every_demo_model_gives_the_host_results_on_a_device() {
    let batch = systems();
    for name in MODELS {
        let model = load_model(name).unwrap();
        for ranks in [1, 3] {
            let opts = EvalOptions {
                ranks,
                ..Default::default()
            };
            let host = evaluate(model.as_ref(), &batch, &opts).unwrap();
            let dev = evaluate(model.as_ref(), &batch, &on_device(opts))
                .unwrap_or_else(|e| panic!("{name} on {ranks} ranks: {e}"));
            let d = difference(&dev, &host);
            assert!(d <= 1e-12, "{name}, {ranks} ranks: differs by {d:e}");
        }
        let f32_opts = EvalOptions {
            dtype: DType::F32,
            ..Default::default()
        };
        let host = evaluate(model.as_ref(), &batch, &f32_opts).unwrap();
        let dev = evaluate(model.as_ref(), &batch, &on_device(f32_opts)).unwrap();
        let d = difference(&dev, &host);
        assert!(d <= 1e-5, "{name} in f32: differs by {d:e}");
    }
}

/// The traced ops of a device run are the host run's, op by op (the
/// ranks' traces too), and every model runs some of them on the device.
#[test]
fn device_runs_trace_the_host_ops() {
    let batch = vec![systems().remove(0)];
    for name in MODELS {
        let model = load_model(name).unwrap();
        for ranks in [1, 2] {
            let opts = EvalOptions {
                ranks,
                trace: true,
                ..Default::default()
            };
            let host = evaluate(model.as_ref(), &batch, &opts).unwrap();
            let dev = evaluate(model.as_ref(), &batch, &on_device(opts)).unwrap();
            let (ht, dt) = (&host.diagnostics.traces, &dev.diagnostics.traces);
            assert_eq!(ht.len(), dt.len());
            let mut on_device = 0;
            for (h, d) in ht.iter().zip(dt) {
                assert_eq!(h.events.len(), d.events.len(), "{name}");
                for (a, b) in h.events.iter().zip(&d.events) {
                    assert_eq!(
                        (&a.op, &a.inputs, &a.output, &a.handler, a.phase),
                        (&b.op, &b.inputs, &b.output, &b.handler, b.phase),
                        "{name} on {ranks} ranks"
                    );
                    assert_eq!(a.device, None);
                    on_device += usize::from(b.device.as_deref() == Some("reference"));
                }
            }
            assert!(on_device > 0, "{name}: no op ran on the device");
        }
    }
}

/// SevenNet-0 through the engine on a device: its irreps linears run
/// there as GEMMs of the matrices read off its host kernels; its e3nn kernels, which this device has no
/// implementation of, on the host. The results are the host run's, in one
/// process and over ranks, and the trace names the same ops.
#[test]
fn sevennet0_on_a_device_gives_the_host_results() {
    let model =
        load_model("sevennet-0").expect("the SevenNet-0 checkpoint (scripts/fetch-sevennet.sh)");
    let mut si = build::diamond(14, 5.43, 2);
    build::rattle_uniform(&mut si, 0.05, 11);
    let batch = vec![si];
    for ranks in [1, 2] {
        let opts = EvalOptions {
            ranks,
            trace: true,
            ..Default::default()
        };
        let host = evaluate(model.as_ref(), &batch, &opts).unwrap();
        let dev = evaluate(model.as_ref(), &batch, &on_device(opts)).unwrap();
        let d = difference(&dev, &host);
        assert!(d <= 1e-12, "SevenNet-0 on {ranks} ranks: differs by {d:e}");
        let mut ran_there = Vec::new();
        for (h, t) in host.diagnostics.traces.iter().zip(&dev.diagnostics.traces) {
            assert_eq!(h.events.len(), t.events.len());
            for (a, b) in h.events.iter().zip(&t.events) {
                assert_eq!(
                    (&a.op, &a.output, &a.handler),
                    (&b.op, &b.output, &b.handler)
                );
                if b.device.is_some() {
                    ran_there.push(b.op.clone());
                }
            }
        }
        for op in [
            "rowwise:0_self_connection",
            "rowwise:0_self_interaction_1",
            "rowwise:4_self_interaction_2",
            "rowwise:reduce_hidden_to_energy",
        ] {
            assert!(
                ran_there.iter().any(|o| o == op),
                "{op} did not run on the device: {ran_there:?}"
            );
        }
    }
    let f32_opts = EvalOptions {
        dtype: DType::F32,
        ..Default::default()
    };
    let host = evaluate(model.as_ref(), &batch, &f32_opts).unwrap();
    let dev = evaluate(model.as_ref(), &batch, &on_device(f32_opts)).unwrap();
    let d = difference(&dev, &host);
    assert!(d <= 1e-5, "SevenNet-0 in f32: differs by {d:e}");
}
