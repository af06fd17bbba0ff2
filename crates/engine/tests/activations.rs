//! The exponential activations (`Silu`, `ScaledSilu`, `Sigmoid`, `Exp`) run as
//! slice kernels on a branch-free `exp`: values against std's `exp` within a
//! few ulp, on tensors large enough for the parallel chunked path, and the
//! backward against the closed-form derivative and central finite differences.

use ddmlip_engine::ops::Unary;
use ddmlip_engine::{Graph, RowDomain};

/// 3 × 20,000 values in [−30, 30): above the engine's parallel threshold.
fn inputs() -> Vec<f64> {
    let n = 60_000;
    (0..n).map(|k| -30.0 + 60.0 * k as f64 / n as f64).collect()
}

fn reference(f: Unary, x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    match f {
        Unary::Silu => x * s,
        Unary::ScaledSilu(c) => c * x * s,
        Unary::Sigmoid => s,
        Unary::Exp => x.exp(),
        _ => unreachable!(),
    }
}

/// The size of the terms the derivative sums (its value can cancel to zero,
/// where only an absolute error relative to these terms is meaningful).
fn derivative_scale(f: Unary, x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    match f {
        Unary::Silu => s * (1.0 + x.abs() * (1.0 - s)),
        Unary::ScaledSilu(c) => c * s * (1.0 + x.abs() * (1.0 - s)),
        Unary::Sigmoid => s,
        Unary::Exp => x.exp(),
        _ => unreachable!(),
    }
}

fn derivative(f: Unary, x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    match f {
        Unary::Silu => s * (1.0 + x * (1.0 - s)),
        Unary::ScaledSilu(c) => c * s * (1.0 + x * (1.0 - s)),
        Unary::Sigmoid => s * (1.0 - s),
        Unary::Exp => x.exp(),
        _ => unreachable!(),
    }
}

const ACTIVATIONS: [Unary; 4] = [
    Unary::Silu,
    Unary::ScaledSilu(1.679177),
    Unary::Sigmoid,
    Unary::Exp,
];

#[test]
fn values_and_gradients_match_std_in_f64() {
    let x = inputs();
    for f in ACTIVATIONS {
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.clone(), x.len() / 3, 3, RowDomain::Atom);
        let y = g.unary(t, f).unwrap();
        for (got, &xi) in g.value(y).iter().zip(&x) {
            let want = reference(f, xi);
            assert!(
                (got - want).abs() <= 1e-15 * want.abs().max(1e-300),
                "{f:?} at {xi}: {got} vs {want}"
            );
        }
        let w: Vec<f64> = (0..x.len()).map(|k| 0.5 + (k % 7) as f64 * 0.1).collect();
        let grad = g.grad(y, Some(w.clone()), &[t]).unwrap().remove(0);
        for ((gi, &xi), wi) in grad.iter().zip(&x).zip(&w) {
            let want = wi * derivative(f, xi);
            let scale = wi * derivative_scale(f, xi);
            assert!(
                (gi - want).abs() <= 2e-15 * scale + 1e-300,
                "{f:?}' at {xi}: {gi} vs {want}"
            );
        }
    }
}

#[test]
fn values_match_std_in_f32() {
    let x: Vec<f32> = inputs().iter().map(|&v| v as f32).collect();
    for f in ACTIVATIONS {
        let mut g = Graph::<f32>::new();
        let t = g.leaf(x.clone(), x.len() / 3, 3, RowDomain::Atom);
        let y = g.unary(t, f).unwrap();
        for (got, &xi) in g.value(y).iter().zip(&x) {
            let want = reference(f, xi as f64);
            assert!(
                (*got as f64 - want).abs() <= 5e-7 * want.abs().max(1e-30),
                "{f:?} at {xi}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    let x: Vec<f64> = (0..24).map(|k| -6.0 + 0.5 * k as f64).collect();
    let w: Vec<f64> = (0..x.len()).map(|k| 0.3 + 0.1 * k as f64).collect();
    let loss = |x: &[f64], f: Unary| -> f64 {
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.to_vec(), 8, 3, RowDomain::Atom);
        let y = g.unary(t, f).unwrap();
        g.value(y).iter().zip(&w).map(|(a, b)| a * b).sum()
    };
    let h = 1e-6;
    for f in ACTIVATIONS {
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.clone(), 8, 3, RowDomain::Atom);
        let y = g.unary(t, f).unwrap();
        let grad = g.grad(y, Some(w.clone()), &[t]).unwrap().remove(0);
        for i in 0..x.len() {
            let (mut plus, mut minus) = (x.clone(), x.clone());
            plus[i] += h;
            minus[i] -= h;
            let fd = (loss(&plus, f) - loss(&minus, f)) / (2.0 * h);
            assert!(
                (fd - grad[i]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{f:?} element {i}: analytic {} vs finite difference {fd}",
                grad[i]
            );
        }
    }
}
