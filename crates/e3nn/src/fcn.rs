//! e3nn's `FullyConnectedNet` on the rows of a matrix: the readout of
//! SevenNets trained with `readout_as_fcn`.

use crate::activation::Activation;
use crate::error::{check_len, E3nnError};
use crate::gemm::{matmul, matmul_bt};
use crate::real::Real;
use rayon::prelude::*;

/// Rows per parallel block: each block runs its layers as GEMMs on
/// scratch it allocates once.
const BLOCK_ROWS: usize = 256;

/// `y = W_L·φ(… φ(W_1·x))` per row, e3nn's `FullyConnectedNet(widths, φ)`
/// without biases: layer k multiplies by its `(h_in × h_out)` weight over
/// √h_in, every layer but the last is followed by φ (normalised as e3nn
/// normalises it, [`Activation`]).
#[derive(Clone, Debug)]
pub struct FullyConnectedNet<T> {
    widths: Vec<usize>,
    /// Per layer, the weight divided by √h_in, row-major `(h_in, h_out)`.
    weights: Vec<Vec<T>>,
    activation: Activation,
}

impl<T: Real> FullyConnectedNet<T> {
    /// From the layer widths `[d_in, h_1, …, d_out]` and the stored weights
    /// `layer{k}.weight`, each row-major `(widths[k], widths[k+1])`.
    pub fn new(
        widths: &[usize],
        weights: &[Vec<f64>],
        activation: Activation,
    ) -> Result<Self, E3nnError> {
        if widths.len() < 2 || widths.contains(&0) {
            return Err(E3nnError::Config(format!(
                "a fully connected net needs at least two non-zero widths, got {widths:?}"
            )));
        }
        check_len("fully connected layers", widths.len() - 1, weights.len())?;
        let weights = weights
            .iter()
            .enumerate()
            .map(|(k, w)| {
                check_len(
                    &format!("fully connected layer {k} weight"),
                    widths[k] * widths[k + 1],
                    w.len(),
                )?;
                let s = (widths[k] as f64).sqrt();
                Ok(w.iter().map(|&v| T::from_f64(v / s)).collect())
            })
            .collect::<Result<_, E3nnError>>()?;
        Ok(Self {
            widths: widths.to_vec(),
            weights,
            activation,
        })
    }

    /// Input width.
    pub fn dim_in(&self) -> usize {
        self.widths[0]
    }

    /// Output width.
    pub fn dim_out(&self) -> usize {
        self.widths[self.widths.len() - 1]
    }

    /// The pre-activations of every layer of `rows` rows of `x`, into
    /// `z[k]` (rows × widths[k+1]); the last one is the output.
    fn layers(&self, x: &[T], rows: usize, z: &mut [Vec<T>], a: &mut Vec<T>) {
        let n_layers = self.weights.len();
        for k in 0..n_layers {
            let (h_in, h_out) = (self.widths[k], self.widths[k + 1]);
            let input: &[T] = if k == 0 { x } else { a };
            matmul(rows, h_in, h_out, input, &self.weights[k], &mut z[k]);
            if k + 1 < n_layers {
                a.resize(rows * h_out, T::ZERO);
                self.activation.eval_slice(&z[k], a);
            }
        }
    }

    fn scratch(&self, rows: usize) -> Vec<Vec<T>> {
        self.widths[1..]
            .iter()
            .map(|&h| vec![T::ZERO; rows * h])
            .collect()
    }

    /// `out` (N × dim_out, overwritten) from `x` (N × dim_in).
    pub fn forward(&self, x: &[T], n_rows: usize, out: &mut [T]) -> Result<(), E3nnError> {
        let (di, dout) = (self.dim_in(), self.dim_out());
        check_len("fully connected input", n_rows * di, x.len())?;
        check_len("fully connected output", n_rows * dout, out.len())?;
        out.par_chunks_mut(BLOCK_ROWS * dout)
            .zip(x.par_chunks(BLOCK_ROWS * di))
            .for_each(|(o, xb)| {
                let rows = xb.len() / di;
                let mut z = self.scratch(rows);
                let mut a = Vec::new();
                self.layers(xb, rows, &mut z, &mut a);
                if let Some(last) = z.last() {
                    o.copy_from_slice(last);
                }
            });
        Ok(())
    }

    /// `grad_x` (N × dim_in, overwritten) from `x` and `grad_out` (N × dim_out).
    pub fn backward(
        &self,
        x: &[T],
        grad_out: &[T],
        n_rows: usize,
        grad_x: &mut [T],
    ) -> Result<(), E3nnError> {
        let (di, dout) = (self.dim_in(), self.dim_out());
        check_len("fully connected input", n_rows * di, x.len())?;
        check_len("fully connected grad_out", n_rows * dout, grad_out.len())?;
        check_len("fully connected grad_x", n_rows * di, grad_x.len())?;
        let n_layers = self.weights.len();
        grad_x
            .par_chunks_mut(BLOCK_ROWS * di)
            .zip(x.par_chunks(BLOCK_ROWS * di))
            .zip(grad_out.par_chunks(BLOCK_ROWS * dout))
            .for_each(|((gx, xb), gb)| {
                let rows = xb.len() / di;
                // The forward pass again: the pre-activations are needed.
                let mut z = self.scratch(rows);
                let mut a = Vec::new();
                self.layers(xb, rows, &mut z, &mut a);
                // g holds the gradient w.r.t. layer k's output (post-activation
                // for hidden layers), walking back.
                let mut g = gb.to_vec();
                let mut next = Vec::new();
                for k in (0..n_layers).rev() {
                    let (h_in, h_out) = (self.widths[k], self.widths[k + 1]);
                    if k + 1 < n_layers {
                        for (gv, &zv) in g.iter_mut().zip(&z[k]) {
                            *gv *= self.activation.grad(zv);
                        }
                    }
                    let target: &mut [T] = if k == 0 {
                        &mut *gx
                    } else {
                        next.resize(rows * h_in, T::ZERO);
                        &mut next
                    };
                    matmul_bt(rows, h_out, h_in, &g, &self.weights[k], target);
                    if k > 0 {
                        std::mem::swap(&mut g, &mut next);
                    }
                }
            });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(widths: &[usize]) -> Vec<Vec<f64>> {
        widths
            .windows(2)
            .enumerate()
            .map(|(k, w)| {
                (0..w[0] * w[1])
                    .map(|i| ((i * 7 + k * 3) as f64 * 0.61).sin() * 1.3)
                    .collect()
            })
            .collect()
    }

    /// Forward equals the formula written out per row; backward equals
    /// finite differences, for a smooth and a kinked activation.
    #[test]
    fn forward_formula_and_backward_fd() {
        let widths = [5, 4, 3, 1];
        let w = weights(&widths);
        for act in [Activation::Tanh, Activation::Relu, Activation::Silu] {
            let net = FullyConnectedNet::<f64>::new(&widths, &w, act).unwrap();
            // 300 rows: more than one parallel block.
            let n = 300;
            let x: Vec<f64> = (0..n * 5).map(|i| (i as f64 * 0.37).cos() * 2.0).collect();
            let mut y = vec![0.0; n];
            net.forward(&x, n, &mut y).unwrap();
            for r in [0, 17, 299] {
                let mut h: Vec<f64> = x[r * 5..r * 5 + 5].to_vec();
                for (k, wk) in w.iter().enumerate() {
                    let (hi, ho) = (widths[k], widths[k + 1]);
                    let mut z = vec![0.0; ho];
                    for j in 0..ho {
                        for i in 0..hi {
                            z[j] += h[i] * wk[i * ho + j] / (hi as f64).sqrt();
                        }
                    }
                    h = if k + 1 < w.len() {
                        z.iter().map(|&v| act.eval(v)).collect()
                    } else {
                        z
                    };
                }
                assert!((y[r] - h[0]).abs() < 1e-13, "{act:?} row {r}");
            }
            let g: Vec<f64> = (0..n).map(|i| (i as f64 * 0.11).sin()).collect();
            let mut gx = vec![0.0; x.len()];
            net.backward(&x, &g, n, &mut gx).unwrap();
            let loss = |x: &[f64]| {
                let mut y = vec![0.0; n];
                net.forward(x, n, &mut y).unwrap();
                y.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>()
            };
            for k in (0..x.len()).step_by(37) {
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[k] += 1e-6;
                xm[k] -= 1e-6;
                let fd = (loss(&xp) - loss(&xm)) / 2e-6;
                assert!((fd - gx[k]).abs() < 1e-6, "{act:?} {k}: {fd} vs {}", gx[k]);
            }
        }
        assert!(FullyConnectedNet::<f64>::new(&[5, 3], &w[..1], Activation::Relu).is_err());
        assert!(FullyConnectedNet::<f64>::new(&[5], &[], Activation::Relu).is_err());
    }
}
