//! f32 edge geometry from the f64 values behind the f32 inputs
//! (`Graph::set_exact_values`): vectors and lengths are the f64 ones rounded
//! once, the gradients those of the f32 leaves, and bad exact values are
//! refused.

use ddmlip_engine::ops::PeriodicShifts;
use ddmlip_engine::{Graph, RowDomain};
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
    let (p, c, ci, ni, shifts) = geometry();
    let mut g = Graph::<f32>::new();
    let pos = g.leaf(p.iter().map(|&x| x as f32).collect(), 2, 3, RowDomain::Atom);
    let strain = g.leaf(vec![0.0; 9], 1, 9, RowDomain::System);
    let cell = g.constant(
        c.iter().map(|&x| x as f32).collect(),
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
    let (vv, lv) = (g.value(v).to_vec(), g.value(l).to_vec());
    let grads = g.grad(l, Some(vec![1.0; 3]), &[pos]).unwrap();
    (vv, lv, grads[0].clone())
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
