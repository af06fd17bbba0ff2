//! The op-time profile: names and call counts are those of the ops
//! recorded, its totals lie inside the wall time of the passes they time,
//! and it is absent unless enabled.

use ddmlip_engine::{Graph, OpProfile, RowDomain, Tensor};
use std::time::Instant;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect()
}

/// `layers` × (matmul by a 64×64 weight, SiLU), on 2,000 atom rows.
fn mlp(g: &mut Graph<f64>, x: Tensor, layers: usize) -> Tensor {
    let mut h = x;
    for k in 0..layers {
        let w = g.param(&values(64 * 64, 10 + k as u64), 64, 64).unwrap();
        h = g.matmul(h, w).unwrap();
        h = g.silu(h).unwrap();
    }
    h
}

#[test]
fn profile_counts_every_op_and_fits_inside_the_passes() {
    let layers = 6;
    let mut g = Graph::<f64>::new();
    let x = g.leaf(values(2000 * 64, 1), 2000, 64, RowDomain::Atom);
    let recorded_before = g.len();
    let t0 = Instant::now();
    g.enable_profile();
    let y = mlp(&mut g, x, layers);
    let forward_wall = t0.elapsed().as_secs_f64();
    let ops_recorded = g.len() - recorded_before;
    let t1 = Instant::now();
    let grads = g.grad(y, None, &[x]).unwrap();
    let backward_wall = t1.elapsed().as_secs_f64();
    assert_eq!(grads[0].len(), 2000 * 64);
    let p: OpProfile = g.take_profile().expect("profiling was on");

    // Every node recorded after enabling is one forward call.
    let forward_calls: usize = p.forward.iter().map(|t| t.calls).sum();
    assert_eq!(forward_calls, ops_recorded);
    assert_eq!(p.forward_op("matmul").map(|t| t.calls), Some(layers));
    assert_eq!(p.forward_op("silu").map(|t| t.calls), Some(layers));
    // Backward: one call per differentiable op (the weights are constants).
    assert_eq!(p.backward_op("matmul").map(|t| t.calls), Some(layers));
    assert_eq!(p.backward_op("silu").map(|t| t.calls), Some(layers));
    assert!(p.backward_op("constant").is_none(), "{p:?}");

    // The totals are parts of the passes' wall time, and most of it.
    assert!(
        p.forward_s() <= forward_wall,
        "{} > {forward_wall}",
        p.forward_s()
    );
    assert!(
        p.backward_s() <= backward_wall,
        "{} > {backward_wall}",
        p.backward_s()
    );
    assert!(
        p.forward_s() >= 0.5 * forward_wall,
        "{p:?} vs {forward_wall}"
    );
    assert!(
        p.backward_s() >= 0.5 * backward_wall,
        "{p:?} vs {backward_wall}"
    );
    // Sorted by decreasing time.
    for list in [&p.forward, &p.backward] {
        assert!(
            list.windows(2).all(|w| w[0].seconds >= w[1].seconds),
            "{list:?}"
        );
    }
    // Taking it ends profiling.
    assert!(g.take_profile().is_none());
}

#[test]
fn no_profile_unless_enabled() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(values(10 * 64, 2), 10, 64, RowDomain::Atom);
    let y = mlp(&mut g, x, 1);
    g.grad(y, None, &[x]).unwrap();
    assert!(g.take_profile().is_none());
}

#[test]
fn merged_profiles_add_op_by_op_and_scale_to_a_mean() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(values(100 * 64, 3), 100, 64, RowDomain::Atom);
    g.enable_profile();
    let y = mlp(&mut g, x, 2);
    g.grad(y, None, &[x]).unwrap();
    let one = g.take_profile().unwrap();
    let mut sum = OpProfile::default();
    sum.merge(&one);
    sum.merge(&one);
    sum.merge(&one);
    for t in &one.forward {
        let s = sum.forward_op(&t.op).unwrap();
        assert_eq!(s.calls, 3 * t.calls);
        assert!((s.seconds - 3.0 * t.seconds).abs() <= 1e-12 * s.seconds.max(1.0));
    }
    assert!((sum.total_s() - 3.0 * one.total_s()).abs() <= 1e-12);
    let mean = sum.scaled_down(3);
    assert_eq!(mean.forward.len(), one.forward.len());
    for t in &one.backward {
        let m = mean.backward_op(&t.op).unwrap();
        assert_eq!(m.calls, t.calls);
        assert!((m.seconds - t.seconds).abs() <= 1e-12 * t.seconds.max(1e-9));
    }
}
