//! Row-local kernels for the N-d ops of imported graphs whose first
//! dimension is the row (atoms or edges): per-row einsum (also `tensordot`
//! and `permute`), column gathers (`slice`, `narrow`, `cat`, `stack`) and
//! `clamp_min`. Each row is computed independently, so decomposed they need
//! no exchange (the engine's `rowwise`), and each has a backward.

use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{KernelError, OpaqueKernel, Scalar};
use rayon::prelude::*;

/// `out[r, o…] = Σ_{contracted} Π_k operand_k[r?, …]`: an einsum whose
/// first label is the row in every per-row operand and in the output;
/// constant operands (weights) have no row label.
pub(crate) struct RowEinsum {
    name: String,
    /// Per operand: strides of each (non-row) label in `sizes` order (0
    /// when the operand lacks the label), and the constant's values if the
    /// operand is a constant.
    operands: Vec<(Vec<usize>, Option<Vec<f64>>, usize)>,
    /// Output strides per label.
    out_strides: Vec<usize>,
    out_cols: usize,
    /// Sizes of every non-row label.
    sizes: Vec<usize>,
}

/// One einsum operand: its labels (row label excluded), sizes and, for a
/// constant, its values.
pub(crate) struct EinsumOperand {
    pub labels: Vec<char>,
    pub sizes: Vec<usize>,
    pub constant: Option<Vec<f64>>,
}

impl RowEinsum {
    /// Builds the contraction; `out_labels` excludes the row label.
    pub(crate) fn new(
        name: &str,
        operands: Vec<EinsumOperand>,
        out_labels: &[char],
    ) -> Result<RowEinsum, String> {
        let mut labels: Vec<char> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        for op in &operands {
            if op.labels.len() != op.sizes.len() {
                return Err(format!(
                    "{} labels for {} dimensions",
                    op.labels.len(),
                    op.sizes.len()
                ));
            }
            for (&l, &n) in op.labels.iter().zip(&op.sizes) {
                match labels.iter().position(|&x| x == l) {
                    Some(k) if sizes[k] != n => {
                        return Err(format!("label `{l}` has sizes {} and {n}", sizes[k]))
                    }
                    Some(_) => {}
                    None => {
                        labels.push(l);
                        sizes.push(n);
                    }
                }
            }
        }
        let strides_for = |ls: &[char]| -> Result<(Vec<usize>, usize), String> {
            let mut st = vec![0; labels.len()];
            let mut s = 1;
            for &l in ls.iter().rev() {
                let k = labels
                    .iter()
                    .position(|&x| x == l)
                    .ok_or_else(|| format!("output label `{l}` is in no operand"))?;
                if st[k] != 0 {
                    return Err(format!(
                        "label `{l}` repeated within one operand (diagonals are not supported)"
                    ));
                }
                st[k] = s;
                s *= sizes[k];
            }
            Ok((st, s))
        };
        let mut ops = Vec::new();
        for op in operands {
            let (st, n) = strides_for(&op.labels)?;
            if let Some(c) = &op.constant {
                if c.len() != n {
                    return Err(format!("a constant of {} values for {n}", c.len()));
                }
            }
            ops.push((st, op.constant, n));
        }
        let (out_strides, out_cols) = strides_for(out_labels)?;
        Ok(RowEinsum {
            name: name.to_string(),
            operands: ops,
            out_strides,
            out_cols,
            sizes,
        })
    }

    /// Calls `f(out_offset, operand_offsets)` for every combination of label values.
    fn for_each_combo(&self, mut f: impl FnMut(usize, &[usize])) {
        let n = self.sizes.len();
        if self.sizes.contains(&0) {
            return;
        }
        let mut idx = vec![0usize; n];
        let mut offs = vec![0usize; self.operands.len()];
        loop {
            let out: usize = idx.iter().zip(&self.out_strides).map(|(i, s)| i * s).sum();
            for (o, (st, _, _)) in offs.iter_mut().zip(&self.operands) {
                *o = idx.iter().zip(st).map(|(i, s)| i * s).sum();
            }
            f(out, &offs);
            let mut d = n;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// Per-row views of the operands: tensor inputs in order, constants from self.
    fn row_values<'a, T: Scalar>(
        &'a self,
        inputs: &[&'a [T]],
        row: usize,
        consts: &'a [Vec<T>],
    ) -> Vec<&'a [T]> {
        let mut next = 0;
        self.operands
            .iter()
            .zip(consts)
            .map(|((_, c, n), cv)| {
                if c.is_some() {
                    cv.as_slice()
                } else {
                    let s = &inputs[next][row * n..(row + 1) * n];
                    next += 1;
                    s
                }
            })
            .collect()
    }

    fn constants<T: Scalar>(&self) -> Vec<Vec<T>> {
        self.operands
            .iter()
            .map(|(_, c, _)| {
                c.as_ref()
                    .map_or_else(Vec::new, |v| v.iter().map(|&x| T::from_f64(x)).collect())
            })
            .collect()
    }
}

impl<T: Scalar> OpaqueKernel<T> for RowEinsum {
    fn name(&self) -> &str {
        &self.name
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let (domain, rows, _) = *inputs
            .first()
            .ok_or_else(|| inputs_err("per-row operands"))?;
        Ok((domain, rows, self.out_cols))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let consts = self.constants::<T>();
        out.par_chunks_mut(self.out_cols.max(1))
            .enumerate()
            .for_each(|(r, o)| {
                let vals = self.row_values(inputs, r, &consts);
                self.for_each_combo(|oo, offs| {
                    let mut p = T::one();
                    for (v, &k) in vals.iter().zip(offs) {
                        p *= v[k];
                    }
                    o[oo] += p;
                });
            });
        Ok(())
    }

    fn backward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let consts = self.constants::<T>();
        let oc = self.out_cols.max(1);
        // One pass per tensor input, parallel over its rows.
        let tensor_ops: Vec<usize> = (0..self.operands.len())
            .filter(|&k| self.operands[k].1.is_none())
            .collect();
        for (t, &k) in tensor_ops.iter().enumerate() {
            let n = self.operands[k].2.max(1);
            grads[t].par_chunks_mut(n).enumerate().for_each(|(r, gr)| {
                let vals = self.row_values(inputs, r, &consts);
                let g = &grad_out[r * oc..(r + 1) * oc];
                self.for_each_combo(|oo, offs| {
                    let mut p = g[oo];
                    for (j, (v, &o)) in vals.iter().zip(offs).enumerate() {
                        if j != k {
                            p *= v[o];
                        }
                    }
                    gr[offs[k]] += p;
                });
            });
        }
        Some(Ok(()))
    }
}

/// `out[r, j] = input_{src[j].0}[r, src[j].1]`: slices, narrows, permutes,
/// concatenations and stacks along non-row dimensions.
pub(crate) struct RowGather {
    pub name: String,
    /// For each output column: (input, column).
    pub src: Vec<(usize, usize)>,
}

impl<T: Scalar> OpaqueKernel<T> for RowGather {
    fn name(&self) -> &str {
        &self.name
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let (domain, rows, _) = *inputs
            .first()
            .ok_or_else(|| inputs_err("at least one input"))?;
        for &(i, c) in &self.src {
            let (_, r, cols) = *inputs
                .get(i)
                .ok_or_else(|| inputs_err("a gather input index within the inputs"))?;
            if r != rows || c >= cols {
                return Err(inputs_err("column indices within the input"));
            }
        }
        Ok((domain, rows, self.src.len()))
    }

    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        let n = self.src.len().max(1);
        out.par_chunks_mut(n).enumerate().for_each(|(r, o)| {
            for (j, &(i, c)) in self.src.iter().enumerate() {
                o[j] = inputs[i][r * shapes[i].2 + c];
            }
        });
        Ok(())
    }

    fn backward(
        &self,
        _inputs: &[&[T]],
        shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let n = self.src.len().max(1);
        // One pass per input, parallel over its rows.
        for (i, gi) in grads.iter_mut().enumerate() {
            let cols = shapes[i].2.max(1);
            gi.par_chunks_mut(cols).enumerate().for_each(|(r, gr)| {
                let g = &grad_out[r * n..(r + 1) * n];
                for (j, &(input, c)) in self.src.iter().enumerate() {
                    if input == i {
                        gr[c] += g[j];
                    }
                }
            });
        }
        Some(Ok(()))
    }
}

/// `max(x, min)` element-wise; the gradient passes where `x > min`.
pub(crate) struct ClampMin(pub f64);

impl<T: Scalar> OpaqueKernel<T> for ClampMin {
    fn name(&self) -> &str {
        "clamp_min"
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        inputs
            .first()
            .copied()
            .ok_or_else(|| inputs_err("one input"))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let m = T::from_f64(self.0);
        for (o, &x) in out.iter_mut().zip(inputs[0]) {
            *o = if x > m { x } else { m };
        }
        Ok(())
    }

    fn backward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let m = T::from_f64(self.0);
        for ((gi, &g), &x) in grads[0].iter_mut().zip(grad_out).zip(inputs[0]) {
            if x > m {
                *gi += g;
            }
        }
        Some(Ok(()))
    }
}

/// torch's normalised sinc, sin(πx)/(πx), 1 at x = 0.
pub(crate) fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let y = std::f64::consts::PI * x;
        y.sin() / y
    }
}

/// The derivative of [`sinc`]: (cos(πx) − sinc(x)) / x, 0 at x = 0.
fn sinc_derivative(x: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        ((std::f64::consts::PI * x).cos() - sinc(x)) / x
    }
}

/// Element-wise [`sinc`] (NequIP's Bessel encoding), with its exact gradient.
pub(crate) struct Sinc;

impl<T: Scalar> OpaqueKernel<T> for Sinc {
    fn name(&self) -> &str {
        "sinc"
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        inputs
            .first()
            .copied()
            .ok_or_else(|| inputs_err("one input"))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        for (o, &x) in out.iter_mut().zip(inputs[0]) {
            *o = T::from_f64(sinc(x.to_f64_lossless()));
        }
        Ok(())
    }

    fn backward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        for ((gi, &g), &x) in grads[0].iter_mut().zip(grad_out).zip(inputs[0]) {
            *gi += g * T::from_f64(sinc_derivative(x.to_f64_lossless()));
        }
        Some(Ok(()))
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Flat indices (within one row, or the whole tensor when `shape` has no
/// row) of the elements a strided view `[start, start+len)` along `dim`
/// selects, in output order.
pub(crate) fn slice_map(
    shape: &[usize],
    dim: usize,
    start: usize,
    len: usize,
    step: usize,
) -> Vec<usize> {
    let mut out_shape = shape.to_vec();
    out_shape[dim] = len;
    let st = strides(shape);
    let total: usize = out_shape.iter().product();
    let ost = strides(&out_shape);
    (0..total)
        .map(|i| {
            (0..shape.len())
                .map(|d| {
                    let k = (i / ost[d]) % out_shape[d].max(1);
                    let k = if d == dim { start + k * step } else { k };
                    k * st[d]
                })
                .sum()
        })
        .collect()
}

/// Flat indices of `permute(shape, perm)` in output order.
pub(crate) fn permute_map(shape: &[usize], perm: &[usize]) -> Vec<usize> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let ost = strides(&out_shape);
    let total: usize = out_shape.iter().product();
    (0..total)
        .map(|i| {
            (0..perm.len())
                .map(|d| ((i / ost[d]) % out_shape[d].max(1)) * st[perm[d]])
                .sum()
        })
        .collect()
}

/// A kernel's inputs are not what it takes; `expected` says what it takes.
fn inputs_err(expected: &str) -> KernelError {
    KernelError::Inputs {
        expected: expected.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddmlip_engine::{Graph, RowDomain};
    use std::sync::Arc;

    fn values(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|k| ((k as f64 + 1.0) * seed).sin()).collect()
    }

    /// Σ w ⊙ kernel(inputs) and its gradients w.r.t. every input.
    fn eval(
        kernel: &Arc<dyn OpaqueKernel<f64>>,
        inputs: &[(Vec<f64>, usize)],
        rows: usize,
    ) -> (f64, Vec<Vec<f64>>) {
        let mut g = Graph::<f64>::new();
        let leaves: Vec<_> = inputs
            .iter()
            .map(|(v, cols)| g.leaf(v.clone(), rows, *cols, RowDomain::Edge))
            .collect();
        let y = g.rowwise(kernel.clone(), &leaves).unwrap();
        let w = values(g.value(y).len(), 0.37);
        let loss = g.value(y).iter().zip(&w).map(|(a, b)| a * b).sum();
        let grads = g.grad(y, Some(w), &leaves).unwrap();
        (loss, grads)
    }

    fn check_gradients(
        kernel: Arc<dyn OpaqueKernel<f64>>,
        inputs: Vec<(Vec<f64>, usize)>,
        rows: usize,
    ) {
        let (_, grads) = eval(&kernel, &inputs, rows);
        let h = 1e-6;
        for (k, (v, _)) in inputs.iter().enumerate() {
            // Perturbs element i of input k in copies of the inputs.
            #[allow(clippy::needless_range_loop)]
            for i in 0..v.len() {
                let mut plus = inputs.clone();
                plus[k].0[i] += h;
                let mut minus = inputs.clone();
                minus[k].0[i] -= h;
                let fd = (eval(&kernel, &plus, rows).0 - eval(&kernel, &minus, rows).0) / (2.0 * h);
                assert!(
                    (fd - grads[k][i]).abs() <= 1e-7 * (1.0 + fd.abs()),
                    "input {k}[{i}]: {} vs {fd}",
                    grads[k][i]
                );
            }
        }
    }

    fn operand(labels: &str, sizes: &[usize], constant: Option<Vec<f64>>) -> EinsumOperand {
        EinsumOperand {
            labels: labels.chars().collect(),
            sizes: sizes.to_vec(),
            constant,
        }
    }

    #[test]
    fn row_einsum_forward_is_the_per_row_contraction() {
        // out[r, a, c] = Σ_b x[r, a, b] · w[b, c]: a matrix product per row.
        let (rows, a, b, c) = (3, 2, 4, 5);
        let x = values(rows * a * b, 0.7);
        let w = values(b * c, 1.3);
        let k = RowEinsum::new(
            "t",
            vec![
                operand("ab", &[a, b], None),
                operand("bc", &[b, c], Some(w.clone())),
            ],
            &['a', 'c'],
        )
        .unwrap();
        let k: Arc<dyn OpaqueKernel<f64>> = Arc::new(k);
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.clone(), rows, a * b, RowDomain::Edge);
        let y = g.rowwise(k, &[t]).unwrap();
        for r in 0..rows {
            for i in 0..a {
                for j in 0..c {
                    let want: f64 = (0..b)
                        .map(|m| x[r * a * b + i * b + m] * w[m * c + j])
                        .sum();
                    let got = g.value(y)[r * a * c + i * c + j];
                    assert!((got - want).abs() < 1e-14, "{got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn row_einsum_backward_matches_finite_differences() {
        // Two per-row operands with an outer product (e3nn's `edb,eca->ecdab`).
        let k = RowEinsum::new(
            "outer",
            vec![operand("db", &[2, 3], None), operand("ca", &[2, 2], None)],
            &['c', 'd', 'a', 'b'],
        )
        .unwrap();
        check_gradients(
            Arc::new(k),
            vec![(values(12, 0.3), 6), (values(8, 0.9), 4)],
            2,
        );
        // A contraction with a constant (`dba,dabc->dc` with a weight).
        let w = values(3 * 2, 1.1);
        let k = RowEinsum::new(
            "contract",
            vec![
                operand("ba", &[2, 3], None),
                operand("ac", &[3, 2], Some(w)),
            ],
            &['c'],
        )
        .unwrap();
        check_gradients(Arc::new(k), vec![(values(12, 0.5), 6)], 2);
    }

    #[test]
    fn row_gather_and_clamp_backward_match_finite_differences() {
        // A permute of a 2×3 block and a concatenation with a second input.
        let k = RowGather {
            name: "g".into(),
            src: vec![(0, 0), (0, 3), (0, 1), (1, 1), (0, 4), (1, 0)],
        };
        check_gradients(
            Arc::new(k),
            vec![(values(12, 0.4), 6), (values(4, 0.8), 2)],
            2,
        );
        check_gradients(Arc::new(ClampMin(0.1)), vec![(values(8, 0.6), 4)], 2);
    }

    #[test]
    fn sinc_is_sin_pi_x_over_pi_x_and_its_backward_matches_finite_differences() {
        for x in [-1.7, -0.3, 0.25, 0.5, 1.0, 2.2] {
            let want = (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x);
            assert!((sinc(x) - want).abs() < 1e-15, "{x}");
        }
        assert_eq!(sinc(0.0), 1.0);
        assert!((sinc(1e-9) - 1.0).abs() < 1e-15);
        check_gradients(Arc::new(Sinc), vec![(values(8, 0.6), 4)], 2);
    }

    #[test]
    fn slice_and_permute_maps() {
        // shape [2, 3]: column 1 of each row; rows 0..2 step 1 of dim 0.
        assert_eq!(slice_map(&[2, 3], 1, 1, 1, 1), vec![1, 4]);
        assert_eq!(slice_map(&[4], 0, 1, 2, 2), vec![1, 3]);
        // The transpose of a 2×3 block.
        assert_eq!(permute_map(&[2, 3], &[1, 0]), vec![0, 3, 1, 4, 2, 5]);
    }
}
