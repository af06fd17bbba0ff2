//! The broadcast-within-rows kernel against a naive broadcast on random
//! shapes (every pattern of kept and broadcast dimensions, one-row
//! constants, row counts across the parallel blocks), forward and backward,
//! in f64 and f32, through a graph (so constants take the path without a
//! gradient buffer).

use super::{BroadcastOp, RowBroadcast};
use ddmlip_engine::{Graph, OpaqueKernel, RowDomain, Scalar};
use std::sync::Arc;

/// xorshift in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() * n as f64) as usize % n
    }
}

/// Flat offset of the output multi-index `idx` in an operand of `shape`
/// (dimensions of 1 broadcast), both without the row dimension.
fn offset(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter()
        .zip(shape)
        .fold(0, |acc, (&i, &n)| acc * n + if n == 1 { 0 } else { i })
}

fn multi_index(mut j: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = j % shape[d];
        j /= shape[d];
    }
    idx
}

fn apply(op: BroadcastOp, a: f64, b: f64) -> f64 {
    match op {
        BroadcastOp::Add => a + b,
        BroadcastOp::Sub => a - b,
        BroadcastOp::Mul => a * b,
        BroadcastOp::Div => a / b,
    }
}

fn partials(op: BroadcastOp, a: f64, b: f64) -> (f64, f64) {
    match op {
        BroadcastOp::Add => (1.0, 1.0),
        BroadcastOp::Sub => (1.0, -1.0),
        BroadcastOp::Mul => (b, a),
        BroadcastOp::Div => (1.0 / b, -a / (b * b)),
    }
}

fn check<T: Scalar>(tol: f64) {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let ops = [
        BroadcastOp::Add,
        BroadcastOp::Sub,
        BroadcastOp::Mul,
        BroadcastOp::Div,
    ];
    for case in 0..120 {
        let rows = [0, 1, 5, 64, 131][case % 5];
        let op = ops[(case / 5) % 4];
        // Output shape (without rows) of 1–3 dimensions; each operand keeps
        // or broadcasts each dimension; some cases are the same shape or a
        // per-row scalar, the fast paths.
        let ndim = 1 + rng.below(3);
        let out: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(5)).collect();
        let pick = |mode: usize, rng: &mut Rng| -> Vec<usize> {
            match mode {
                0 => out.clone(),
                1 => vec![1; ndim],
                _ => out
                    .iter()
                    .map(|&n| if rng.below(2) == 0 { n } else { 1 })
                    .collect(),
            }
        };
        let mode = rng.below(3);
        let sa = pick(mode, &mut rng);
        let mode = rng.below(3);
        let sb = pick(mode, &mut rng);
        // At most one operand is a one-row constant.
        let per_row = match rng.below(4) {
            0 => [true, false],
            1 => [false, true],
            _ => [true, true],
        };
        let n: usize = out.iter().product();
        let (ca, cb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
        let maps: [Vec<u32>; 2] = [&sa, &sb].map(|s| {
            (0..n)
                .map(|j| offset(&multi_index(j, &out), s) as u32)
                .collect()
        });
        let ra = if per_row[0] { rows } else { 1 };
        let rb = if per_row[1] { rows } else { 1 };
        // Divisors away from zero.
        let a: Vec<f64> = (0..ra * ca).map(|_| 0.5 + rng.next()).collect();
        let b: Vec<f64> = (0..rb * cb).map(|_| 0.5 + rng.next()).collect();
        let w: Vec<f64> = (0..rows * n).map(|_| rng.next() - 0.5).collect();
        let round = |v: &[f64]| -> Vec<T> { v.iter().map(|&x| T::from_f64(x)).collect() };
        let (a, b, w) = (round(&a), round(&b), round(&w));

        // Naive reference: the output in T, the gradients summed in f64 (the
        // kernel's order of summation is its own).
        let mut want = vec![T::zero(); rows * n];
        let mut sum_ga = vec![0.0f64; ra * ca];
        let mut sum_gb = vec![0.0f64; rb * cb];
        for r in 0..rows {
            for j in 0..n {
                let ia = if per_row[0] { r * ca } else { 0 } + maps[0][j] as usize;
                let ib = if per_row[1] { r * cb } else { 0 } + maps[1][j] as usize;
                let (x, y) = (a[ia].to_f64_lossless(), b[ib].to_f64_lossless());
                want[r * n + j] = T::from_f64(apply(op, x, y));
                let (da, db) = partials(op, x, y);
                let g = w[r * n + j].to_f64_lossless();
                sum_ga[ia] += g * da;
                sum_gb[ib] += g * db;
            }
        }
        let want_ga: Vec<T> = sum_ga.iter().map(|&x| T::from_f64(x)).collect();
        let want_gb: Vec<T> = sum_gb.iter().map(|&x| T::from_f64(x)).collect();
        let close = |got: &[T], want: &[T], what: &str| {
            let scale = want
                .iter()
                .fold(1.0f64, |m, x| m.max(x.to_f64_lossless().abs()));
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                let d = (g.to_f64_lossless() - w.to_f64_lossless()).abs();
                assert!(
                    d <= tol * scale,
                    "case {case} {op:?} {what}[{k}]: {g:?} vs {w:?}; out {out:?}, a {sa:?}, b {sb:?}, per_row {per_row:?}, rows {rows}"
                );
            }
        };

        let kernel: Arc<dyn OpaqueKernel<T>> = Arc::new(RowBroadcast {
            op,
            maps: maps.clone(),
            per_row,
        });
        // Both operands differentiable (one-row operands as parameters that
        // still take a gradient: leaves with no row domain).
        let mut g = Graph::<T>::new();
        let dom = |p: bool| if p { RowDomain::Edge } else { RowDomain::None };
        let ta = g.leaf(a.clone(), ra, ca, dom(per_row[0]));
        let tb = g.leaf(b.clone(), rb, cb, dom(per_row[1]));
        let t = g.rowwise(kernel.clone(), &[ta, tb]).unwrap();
        assert_eq!(g.shape(t), (rows, n));
        close(g.value(t), &want, "out");
        let grads = g.grad(t, Some(w.clone()), &[ta, tb]).unwrap();
        close(&grads[0], &want_ga, "grad a");
        close(&grads[1], &want_gb, "grad b");

        // The second operand a constant: no gradient buffer for it, the
        // first's gradient unchanged.
        let mut g = Graph::<T>::new();
        let ta = g.leaf(a.clone(), ra, ca, dom(per_row[0]));
        let tb = g.constant(b.clone(), rb, cb, dom(per_row[1]));
        let t = g.rowwise(kernel, &[ta, tb]).unwrap();
        close(g.value(t), &want, "out (constant b)");
        let grads = g.grad(t, Some(w.clone()), &[ta]).unwrap();
        close(&grads[0], &want_ga, "grad a (constant b)");
    }
}

#[test]
fn row_broadcast_matches_a_naive_broadcast_f64() {
    check::<f64>(1e-13);
}

#[test]
fn row_broadcast_matches_a_naive_broadcast_f32() {
    check::<f32>(1e-5);
}
