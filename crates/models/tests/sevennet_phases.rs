//! The SevenNet kernels' phase timings (`ddmlip_models::sevennet_phases`):
//! off by default, the same results with them on, every phase of every
//! layer recorded once per pass, and FLOP counts equal to
//! `bench/sevennet0_flops.py`'s formulas (restated here from the
//! architecture) on the brute-force edge count.
//!
//! The recorder is process-wide: the tests take turns (nextest runs each in
//! its own process anyway; `cargo test` runs them as threads of one).

use ddmlip_atoms::System;
use ddmlip_engine::{DType, Model};
use ddmlip_models::sevennet_phases::{self as phases, Pass, PhaseTotal};
use ddmlip_neighbors::{brute_force_neighbor_list, NeighborOptions};
use ddmlip_runtime::{evaluate, EvalOptions, EvalResult};
use std::path::PathBuf;
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn model() -> Box<dyn Model> {
    ddmlip_testkit::sevennet_checkpoint();
    ddmlip_models::load_model("sevennet-0").expect("load sevennet-0")
}

/// The first public fixture frame (periodic).
fn frame() -> System {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/sevennet0/sevennet0_public.extxyz"
    ));
    let frames = ddmlip_atoms::read_structure(path).expect("read the SevenNet-0 fixtures");
    frames
        .into_iter()
        .find(|s| s.cell.is_some() && s.len() >= 8)
        .expect("a periodic fixture frame")
}

fn run(m: &dyn Model, sys: &System, dtype: DType) -> EvalResult {
    let opts = EvalOptions {
        dtype,
        ..Default::default()
    };
    evaluate(m, std::slice::from_ref(sys), &opts).expect("evaluate")
}

fn phase<'a>(table: &'a [PhaseTotal], name: &str, pass: Pass) -> &'a PhaseTotal {
    table
        .iter()
        .find(|p| p.name == name && p.pass == pass)
        .unwrap_or_else(|| panic!("phase {name} {pass:?} missing from {table:#?}"))
}

// SevenNet-0's architecture, as bench/sevennet0_flops.py states it.
const W: [usize; 5] = [384, 960, 960, 960, 224];

fn mul(l: usize) -> usize {
    [128, 64, 32][l]
}

fn tp_paths(t: usize) -> Vec<(usize, usize, usize, usize)> {
    match t {
        0 => vec![(128, 0, 0, 0), (128, 0, 1, 1), (128, 0, 2, 2)],
        4 => vec![(128, 0, 0, 0), (64, 1, 1, 0), (32, 2, 2, 0)],
        _ => {
            let mut p = Vec::new();
            for l1 in 0..3usize {
                for l2 in 0..3usize {
                    for l3 in l1.abs_diff(l2)..=(l1 + l2).min(2) {
                        p.push((mul(l1), l1, l2, l3));
                    }
                }
            }
            p
        }
    }
}

fn tp_flops(t: usize) -> usize {
    tp_paths(t)
        .into_iter()
        .map(|(u, l1, l2, l3)| {
            let (d1, d2, d3) = (2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1);
            2 * d1 * d2 * d3 + 2 * u * d1 * d3 + u * d3
        })
        .sum()
}

/// FLOPs per edge of one layer's radial part.
type FlopsOfLayer = fn(usize) -> usize;

fn mlp_flops(t: usize) -> usize {
    2 * (8 * 64 + 64 * 64 + 64 * W[t])
}

/// The radial table's quintic: 6 multiply-adds per weight.
fn table_flops(t: usize) -> usize {
    2 * 6 * W[t]
}

/// Linear FLOPs per atom of (self-connection, linear_1, linear_2) of layer t.
fn linear_flops(t: usize) -> [usize; 3] {
    let f = |pairs: &[(usize, usize, usize)]| -> usize {
        pairs.iter().map(|&(a, b, l)| 2 * a * b * (2 * l + 1)).sum()
    };
    match t {
        0 => [
            f(&[(128, 224, 0)]),
            f(&[(128, 128, 0)]),
            f(&[(128, 224, 0), (128, 64, 1), (128, 32, 2)]),
        ],
        4 => [
            f(&[(128, 128, 0)]),
            f(&[(128, 128, 0), (64, 64, 1), (32, 32, 2)]),
            f(&[(224, 128, 0)]),
        ],
        _ => [
            f(&[(128, 224, 0), (64, 64, 1), (32, 32, 2)]),
            f(&[(128, 128, 0), (64, 64, 1), (32, 32, 2)]),
            f(&[(224, 224, 0), (384, 64, 1), (352, 32, 2)]),
        ],
    }
}

#[test]
fn phases_are_off_by_default_and_do_not_change_results() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let m = model();
    let sys = frame();
    assert!(!phases::enabled());
    let off = run(m.as_ref(), &sys, DType::F64);
    assert!(phases::take().is_empty(), "recorded while off");
    phases::set_enabled(true);
    let on = run(m.as_ref(), &sys, DType::F64);
    phases::set_enabled(false);
    assert!(!phases::take().is_empty());
    assert_eq!(
        off.energy().unwrap()[0].to_bits(),
        on.energy().unwrap()[0].to_bits()
    );
    let (f_off, f_on) = (off.forces().unwrap(), on.forces().unwrap());
    for (a, b) in f_off.iter().zip(f_on) {
        for k in 0..3 {
            assert_eq!(a[k].to_bits(), b[k].to_bits());
        }
    }
}

#[test]
fn every_phase_is_recorded_with_the_scripts_flop_count() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let m = model();
    let sys = frame();
    let edges = brute_force_neighbor_list(
        &sys.positions,
        sys.cell.as_ref(),
        sys.pbc,
        &NeighborOptions {
            cutoff: m.cutoff(),
            half: false,
        },
    )
    .expect("brute-force pairs")
    .len();
    assert!(edges > 0);
    let atoms = sys.len();
    // f32 reads each layer's radial network from its table, f64 runs the MLP.
    let modes: [(DType, FlopsOfLayer); 2] = [(DType::F32, table_flops), (DType::F64, mlp_flops)];
    for (dtype, radial_flops) in modes {
        phases::set_enabled(true);
        let cpu0 = phases::process_cpu_s().expect("process CPU clock");
        let t0 = std::time::Instant::now();
        run(m.as_ref(), &sys, dtype);
        let (wall, cpu) = (
            t0.elapsed().as_secs_f64(),
            phases::process_cpu_s().unwrap() - cpu0,
        );
        phases::set_enabled(false);
        let table = phases::take();
        // Layer 0's self-connection and linear_1 read the species embedding, a
        // constant: they have no backward.
        assert_eq!(table.len(), 2 * (1 + 5 * 5 + 2) - 2, "{table:#?}");
        for name in ["0_self_connection", "0_self_interaction_1"] {
            assert!(!table
                .iter()
                .any(|p| p.name == name && p.pass == Pass::Backward));
        }
        for pass in [Pass::Forward, Pass::Backward] {
            for t in 0..5 {
                let lin = linear_flops(t);
                let names = [
                    "self_connection",
                    "self_interaction_1",
                    "self_interaction_2",
                ];
                for (name, per_atom) in names.iter().zip(lin) {
                    if t == 0 && pass == Pass::Backward && *name != "self_interaction_2" {
                        continue;
                    }
                    let p = phase(&table, &format!("{t}_{name}"), pass);
                    assert_eq!(p.calls, 1);
                    assert_eq!(p.flops, (per_atom * atoms) as f64, "{t}_{name} {pass:?}");
                }
                let conv = phase(&table, &format!("{t}_convolution"), pass);
                let mlp_passes = if pass == Pass::Forward { 1 } else { 2 };
                let per_edge = mlp_passes * radial_flops(t) + tp_flops(t);
                assert_eq!(conv.calls, 1);
                assert_eq!(
                    conv.flops,
                    (per_edge * edges) as f64,
                    "{dtype:?} layer {t} {pass:?}"
                );
                assert_eq!(
                    phase(&table, &format!("{t}_equivariant_gate"), pass).calls,
                    1
                );
            }
            assert_eq!(
                phase(&table, "reduce_input_to_hidden", pass).flops,
                (2 * 128 * 64 * atoms) as f64
            );
            assert_eq!(
                phase(&table, "reduce_hidden_to_energy", pass).flops,
                (2 * 64 * atoms) as f64
            );
            assert_eq!(phase(&table, "sevennet_edge_features", pass).calls, 1);
        }
        // The phases ran inside the evaluation, one after another.
        let (sum_wall, sum_cpu) = table
            .iter()
            .fold((0.0, 0.0), |(w, c), p| (w + p.wall_s, c + p.cpu_s));
        assert!(table.iter().all(|p| p.wall_s > 0.0 && p.cpu_s >= 0.0));
        assert!(
            sum_wall <= wall,
            "phases {sum_wall} s within the call's {wall} s"
        );
        assert!(
            sum_cpu <= cpu + 1e-3,
            "phases' CPU {sum_cpu} s within the call's {cpu} s"
        );
    }
}
