//! f32 edge geometry from the f64 values behind the f32 inputs
//! (`Graph::set_exact_values`): vectors and lengths are the f64 ones rounded
//! once, the gradients those of the f32 leaves, and bad exact values are
//! refused.

use ddmlip_engine::device::ReferenceDevice;
use ddmlip_engine::ops::PeriodicShifts;
use ddmlip_engine::{Graph, RowDomain, Scalar};
use std::sync::Arc;

/// Positions (Atom×3), cell (3×3), edge centres, neighbours and shifts.
type Geometry = (Vec<f64>, Vec<f64>, Vec<u32>, Vec<u32>, Vec<[i32; 3]>);

/// Two atoms far from the origin (so that f32 positions lose digits), a
/// triclinic cell, and three edges: direct, shifted, and shifted back.
fn geometry() -> Geometry {
    let positions = vec![
        1234.567891234,
        -987.654321987,
        555.555555555,
        1234.901234567,
        -986.123456789,
        556.777777777,
    ];
    let cell = vec![
        5.123456789,
        0.0,
        0.0,
        1.234567891,
        4.987654321,
        0.0,
        0.333333333,
        0.777777777,
        6.111111111,
    ];
    (
        positions,
        cell,
        vec![0, 0, 1],
        vec![1, 1, 0],
        vec![[0, 0, 0], [1, -1, 2], [-1, 1, -2]],
    )
}

/// The edge vectors in f64: r_j − r_i, then + S·cell.
fn reference_vectors() -> Vec<[f64; 3]> {
    let (p, c, ci, ni, shifts) = geometry();
    (0..ci.len())
        .map(|e| {
            let (i, j) = (ci[e] as usize * 3, ni[e] as usize * 3);
            let mut v = [p[j] - p[i], p[j + 1] - p[i + 1], p[j + 2] - p[i + 2]];
            for a in 0..3 {
                for k in 0..3 {
                    v[k] += shifts[e][a] as f64 * c[a * 3 + k];
                }
            }
            v
        })
        .collect()
}

/// Vectors, lengths and ∂(Σ lengths)/∂positions of an f32 graph, with or
/// without the exact values.
fn f32_run(exact: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (v, l, grads) = run_on::<f32>(exact, false);
    (v, l, grads[0].clone())
}

/// [`f32_run`] in `T`, with the ops on the reference device (`device`),
/// and with ∂(Σ lengths)/∂strain as the second gradient.
fn run_on<T: Scalar>(exact: bool, device: bool) -> (Vec<T>, Vec<T>, Vec<Vec<T>>) {
    let (p, c, ci, ni, shifts) = geometry();
    let mut g = Graph::<T>::new();
    if device {
        g.set_device(Arc::new(ReferenceDevice::new()));
    }
    let pos = g.leaf(
        p.iter().map(|&x| T::from_f64(x)).collect(),
        2,
        3,
        RowDomain::Atom,
    );
    let strain = g.leaf(vec![T::zero(); 9], 1, 9, RowDomain::System);
    let cell = g.constant(
        c.iter().map(|&x| T::from_f64(x)).collect(),
        3,
        3,
        RowDomain::System,
    );
    if exact {
        g.set_exact_values(pos, p).unwrap();
        g.set_exact_values(cell, c).unwrap();
    }
    let atom_system = g
        .index(
            Arc::new(vec![0, 0]),
            RowDomain::Atom,
            RowDomain::System,
            1,
            "atom_system",
        )
        .unwrap();
    let cell_system = g
        .index(
            Arc::new(vec![0; 3]),
            RowDomain::System,
            RowDomain::System,
            1,
            "cell_system",
        )
        .unwrap();
    let pos_s = g.apply_strain(pos, strain, atom_system).unwrap();
    let cell_s = g.apply_strain(cell, strain, cell_system).unwrap();
    let center = g
        .index(
            Arc::new(ci),
            RowDomain::Edge,
            RowDomain::Atom,
            2,
            "edge_center",
        )
        .unwrap();
    let neighbor = g
        .index(
            Arc::new(ni),
            RowDomain::Edge,
            RowDomain::Atom,
            2,
            "edge_neighbor",
        )
        .unwrap();
    let es = g
        .index(
            Arc::new(vec![0; 3]),
            RowDomain::Edge,
            RowDomain::System,
            1,
            "edge_system",
        )
        .unwrap();
    let periodic = || PeriodicShifts {
        cell: cell_s,
        shifts: Arc::new(shifts.clone()),
        edge_system: es,
    };
    let v = g
        .edge_vectors(pos_s, center, neighbor, Some(periodic()))
        .unwrap();
    let l = g
        .edge_lengths(pos_s, center, neighbor, Some(periodic()))
        .unwrap();
    g.ensure_host(&[v, l]).unwrap();
    assert_eq!(g.is_on_device(l), device);
    let (vv, lv) = (g.value(v).to_vec(), g.value(l).to_vec());
    let grads = g.grad(l, Some(vec![T::one(); 3]), &[pos, strain]).unwrap();
    (vv, lv, grads)
}

/// On a device the strained positions and cell, the edge vectors and
/// lengths are the host's bits (the same operations in the same order,
/// from the same exact values); in f64 their gradients are the host's to
/// rounding, and in f32 as close to the f64 gradients as the host's (the
/// device sums the strain's terms in f64: atoms 1,000 Å from the origin
/// make them cancel to a few ulp of f32).
#[test]
fn the_device_computes_the_host_geometry() {
    let (_, _, reference) = run_on::<f64>(false, false);
    let (_, _, on_device) = run_on::<f64>(false, true);
    for (h, d) in reference.iter().zip(&on_device) {
        let scale = h.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (a, b) in h.iter().zip(d) {
            assert!((a - b).abs() <= 1e-12 * scale, "f64: {a} vs {b}");
        }
    }
    for exact in [true, false] {
        let (hv, hl, hg) = run_on::<f32>(exact, false);
        let (dv, dl, dg) = run_on::<f32>(exact, true);
        assert_eq!(hv, dv, "vectors, exact = {exact}");
        assert_eq!(hl, dl, "lengths, exact = {exact}");
        for (k, ((h, d), r)) in hg.iter().zip(&dg).zip(&reference).enumerate() {
            let scale = r.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let error = |v: &[f32]| {
                v.iter()
                    .zip(r)
                    .fold(0.0f64, |m, (&a, &b)| m.max((f64::from(a) - b).abs()))
                    / scale
            };
            let (host, device) = (error(h), error(d));
            assert!(
                device <= host.max(1e-6),
                "gradient {k}, exact = {exact}: device {device:e} from f64, host {host:e}"
            );
        }
    }
}

#[test]
fn f32_edge_geometry_is_the_f64_geometry_rounded_once() {
    let reference = reference_vectors();
    let (vectors, lengths, grads) = f32_run(true);
    for (e, r) in reference.iter().enumerate() {
        for k in 0..3 {
            assert_eq!(vectors[e * 3 + k], r[k] as f32, "edge {e} component {k}");
        }
        let length = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
        assert_eq!(lengths[e], length as f32, "edge {e} length");
    }
    // Without the exact values the f32 positions (ulp 1.2e-4 Å at 1,000 Å)
    // put the vectors visibly off: the test above could fail.
    let (rounded_thrice, _, _) = f32_run(false);
    let worst = reference
        .iter()
        .flatten()
        .zip(&rounded_thrice)
        .fold(0.0f64, |m, (r, &v)| m.max((r - v as f64).abs()));
    assert!(worst > 1e-5, "f32 positions lose {worst} Å only");
    // ∂(Σ|v_e|)/∂r_i = Σ over edges ±v_e/|v_e|, from the f64 vectors.
    let mut expected = [0.0f64; 6];
    let (_, _, ci, ni, _) = geometry();
    for (e, r) in reference.iter().enumerate() {
        let length = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
        for k in 0..3 {
            expected[ni[e] as usize * 3 + k] += r[k] / length;
            expected[ci[e] as usize * 3 + k] -= r[k] / length;
        }
    }
    for (k, (&g, x)) in grads.iter().zip(expected).enumerate() {
        assert!((g as f64 - x).abs() < 1e-6, "gradient {k}: {g} vs {x}");
    }
}

#[test]
fn exact_values_that_do_not_round_to_the_tensor_are_refused() {
    let mut g = Graph::<f32>::new();
    let t = g.leaf(vec![1.0, 2.0, 3.0], 1, 3, RowDomain::Atom);
    let short = g.set_exact_values(t, vec![1.0, 2.0]).unwrap_err();
    assert!(short.to_string().contains("2 exact values"), "{short}");
    let other = g.set_exact_values(t, vec![1.0, 2.5, 3.0]).unwrap_err();
    assert!(other.to_string().contains("exact value 1"), "{other}");
    g.set_exact_values(t, vec![1.0 + 1e-12, 2.0, 3.0]).unwrap();
}
