//! SevenNet's f32 path reads each layer's radial network from a table of
//! its quintic pieces (`ddmlip_e3nn::RadialTable`); the network itself
//! stays available (`RadialEvaluation::Network`). Against the f64 network
//! on the same rattled crystal, the table's f32 results must be as close as
//! the f32 network's: its interpolation error is below f32's rounding.

use ddmlip_atoms::build::{diamond, rattle_uniform};
use ddmlip_engine::DType;
use ddmlip_models::{RadialEvaluation, SevenNetModel};
use ddmlip_runtime::{evaluate, EvalOptions, EvalResult};

fn run(model: &SevenNetModel, dtype: DType) -> EvalResult {
    let mut s = diamond(14, 5.43, 2);
    rattle_uniform(&mut s, 0.2, 7);
    let opts = EvalOptions {
        dtype,
        ..Default::default()
    };
    evaluate(model, &[s], &opts).expect("evaluation")
}

/// Largest |a − b| over a named output.
fn gap(a: &EvalResult, b: &EvalResult, name: &str) -> f64 {
    let (x, y) = (&a.outputs[name].values, &b.outputs[name].values);
    assert_eq!(x.len(), y.len());
    x.iter()
        .zip(y)
        .fold(0.0f64, |m, (p, q)| m.max((p - q).abs()))
}

#[test]
fn the_f32_table_is_as_close_to_f64_as_the_f32_network() {
    let path = ddmlip_testkit::sevennet_checkpoint();
    let table = SevenNetModel::load(&path, "sevennet-0", None).expect("load");
    assert_eq!(table.f32_radial(), RadialEvaluation::Table);
    let network = SevenNetModel::load(&path, "sevennet-0", None)
        .expect("load")
        .with_f32_radial(RadialEvaluation::Network);
    let reference = run(&network, DType::F64);
    let (with_table, with_network) = (run(&table, DType::F32), run(&network, DType::F32));
    // The two f32 paths differ (so the option takes effect) …
    assert_ne!(with_table.outputs["forces"], with_network.outputs["forces"]);
    // … and the table's is as close to f64 as the network's.
    for (name, floor) in [("energy", 1e-5), ("forces", 1e-6), ("stress", 1e-8)] {
        let (t, n) = (
            gap(&with_table, &reference, name),
            gap(&with_network, &reference, name),
        );
        eprintln!("{name}: f32 table vs f64 {t:.2e}, f32 network vs f64 {n:.2e}");
        assert!(n > 0.0, "{name}: the f32 network equals f64 bit for bit");
        assert!(
            t <= 2.0 * n.max(floor),
            "{name}: f32 table off f64 by {t:e}, the f32 network by {n:e}"
        );
    }
    // Every layer's table was built to its tolerance.
    let tables = table.f32_tables().expect("tables");
    assert_eq!(tables.len(), 5);
    assert!(tables.iter().all(|t| t.error_fraction() <= 1.0));
    for (k, t) in tables.iter().enumerate() {
        eprintln!(
            "layer {k}: {} cells, {} intervals, {} weights, {:.2} MB",
            t.cells(),
            t.intervals(),
            t.dim_out(),
            t.bytes() as f64 / 1e6
        );
    }
}
