//! `Unary::Cos` and `Unary::Sin` (what imported `.pt2` graphs use for
//! cosine cutoffs): values against std, backward against central finite
//! differences.

use ddmlip_engine::ops::Unary;
use ddmlip_engine::{Graph, RowDomain};

fn inputs() -> Vec<f64> {
    (0..12).map(|k| -3.0 + 0.55 * k as f64).collect()
}

fn weighted_sum(x: &[f64], f: Unary, with_grad: bool) -> (f64, Vec<f64>) {
    let mut g = Graph::<f64>::new();
    let t = g.leaf(x.to_vec(), 4, 3, RowDomain::Atom);
    let y = g.unary(t, f).unwrap();
    let w: Vec<f64> = (0..x.len()).map(|k| 0.3 + 0.1 * k as f64).collect();
    let loss = g.value(y).iter().zip(&w).map(|(a, b)| a * b).sum();
    if !with_grad {
        return (loss, vec![]);
    }
    let grads = g.grad(y, Some(w), &[t]).unwrap();
    (loss, grads[0].clone())
}

#[test]
fn cos_and_sin_forward_match_std() {
    let x = inputs();
    for (f, reference) in [
        (Unary::Cos, f64::cos as fn(f64) -> f64),
        (Unary::Sin, f64::sin),
    ] {
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.clone(), 4, 3, RowDomain::Atom);
        let y = g.unary(t, f).unwrap();
        for (got, &xi) in g.value(y).iter().zip(&x) {
            assert_eq!(*got, reference(xi), "{f:?} at {xi}");
        }
    }
}

#[test]
fn cos_and_sin_backward_match_finite_differences() {
    let x = inputs();
    let h = 1e-6;
    for f in [Unary::Cos, Unary::Sin] {
        let (_, grad) = weighted_sum(&x, f, true);
        for i in 0..x.len() {
            let mut plus = x.clone();
            plus[i] += h;
            let mut minus = x.clone();
            minus[i] -= h;
            let fd =
                (weighted_sum(&plus, f, false).0 - weighted_sum(&minus, f, false).0) / (2.0 * h);
            assert!(
                (fd - grad[i]).abs() <= 1e-7 * (1.0 + fd.abs()),
                "{f:?} element {i}: analytic {} vs finite difference {fd}",
                grad[i]
            );
        }
    }
}
