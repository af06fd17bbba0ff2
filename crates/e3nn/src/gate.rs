//! e3nn `Gate` with normalised-SiLU activations on scalars and gates.
//!
//! Input row layout: `[scalars (n_scalars) | gates (Σ mul) | gated blocks]`,
//! gated block k being `mul_k` copies of degree `l_k` (mul-major). Output:
//! `[φ(scalars) | φ(gate_u)·gated_u for each gated copy]`.

use crate::error::{check_len, E3nnError};
use crate::radial::{nsilu, nsilu_grad};
use crate::real::Real;
use rayon::prelude::*;

/// Gate layout: number of plain scalars and the gated `(mul, l)` blocks.
#[derive(Clone, Debug)]
pub struct Gate {
    /// Number of scalars that only get φ.
    pub n_scalars: usize,
    /// Gated blocks `(mul, l)`, one gate per copy, in gate order.
    pub gated: Vec<(usize, usize)>,
}

impl Gate {
    /// Number of gates Σ mul.
    pub fn n_gates(&self) -> usize {
        self.gated.iter().map(|g| g.0).sum()
    }
    fn gated_dim(&self) -> usize {
        self.gated.iter().map(|&(m, l)| m * (2 * l + 1)).sum()
    }
    /// Input width: scalars + gates + gated components.
    pub fn dim_in(&self) -> usize {
        self.n_scalars + self.n_gates() + self.gated_dim()
    }
    /// Output width: scalars + gated components.
    pub fn dim_out(&self) -> usize {
        self.n_scalars + self.gated_dim()
    }

    /// `output` (N × dim_out, overwritten) from `input` (N × dim_in).
    pub fn forward<T: Real>(
        &self,
        input: &[T],
        n_rows: usize,
        output: &mut [T],
    ) -> Result<(), E3nnError> {
        let (di, dout, ns, ng) = (
            self.dim_in(),
            self.dim_out(),
            self.n_scalars,
            self.n_gates(),
        );
        check_len("gate input", n_rows * di, input.len())?;
        check_len("gate output", n_rows * dout, output.len())?;
        if n_rows == 0 || dout == 0 {
            return Ok(());
        }
        output
            .par_chunks_mut(dout)
            .zip(input.par_chunks(di))
            .for_each(|(o, x)| {
                for c in 0..ns {
                    o[c] = nsilu(x[c]);
                }
                let (mut gi, mut src, mut dst) = (ns, ns + ng, ns);
                for &(mul, l) in &self.gated {
                    let d = 2 * l + 1;
                    for _ in 0..mul {
                        let g = nsilu(x[gi]);
                        for c in 0..d {
                            o[dst + c] = g * x[src + c];
                        }
                        gi += 1;
                        src += d;
                        dst += d;
                    }
                }
            });
        Ok(())
    }

    /// `grad_in` (N × dim_in, overwritten) from `input` and `grad_out` (N × dim_out).
    pub fn backward<T: Real>(
        &self,
        input: &[T],
        grad_out: &[T],
        n_rows: usize,
        grad_in: &mut [T],
    ) -> Result<(), E3nnError> {
        let (di, dout, ns, ng) = (
            self.dim_in(),
            self.dim_out(),
            self.n_scalars,
            self.n_gates(),
        );
        check_len("gate input", n_rows * di, input.len())?;
        check_len("gate grad_out", n_rows * dout, grad_out.len())?;
        check_len("gate grad_in", n_rows * di, grad_in.len())?;
        if n_rows == 0 || di == 0 {
            return Ok(());
        }
        grad_in
            .par_chunks_mut(di)
            .zip(input.par_chunks(di))
            .zip(grad_out.par_chunks(dout.max(1)))
            .for_each(|((gx, x), go)| {
                for c in 0..ns {
                    gx[c] = go[c] * nsilu_grad(x[c]);
                }
                let (mut gi, mut src, mut dst) = (ns, ns + ng, ns);
                for &(mul, l) in &self.gated {
                    let d = 2 * l + 1;
                    for _ in 0..mul {
                        let g = nsilu(x[gi]);
                        let mut dot = T::ZERO;
                        for c in 0..d {
                            dot += go[dst + c] * x[src + c];
                            gx[src + c] = go[dst + c] * g;
                        }
                        gx[gi] = dot * nsilu_grad(x[gi]);
                        gi += 1;
                        src += d;
                        dst += d;
                    }
                }
            });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_forward_and_fd() {
        let gate = Gate {
            n_scalars: 3,
            gated: vec![(2, 1), (1, 2)],
        };
        assert_eq!(gate.dim_in(), 3 + 3 + 6 + 5);
        assert_eq!(gate.dim_out(), 3 + 6 + 5);
        let n = 4;
        let x: Vec<f64> = (0..n * gate.dim_in())
            .map(|i| ((i as f64) * 0.71).sin() * 2.0)
            .collect();
        let mut y = vec![0.0; n * gate.dim_out()];
        gate.forward(&x, n, &mut y).unwrap();
        // Direct check of the layout on row 1.
        let (xr, yr) = (&x[17..34], &y[14..28]);
        let phi = |s: f64| crate::radial::SILU_NORM * s / (1.0 + (-s).exp());
        assert!((yr[0] - phi(xr[0])).abs() < 1e-15);
        assert!((yr[3 + 1] - phi(xr[3]) * xr[6 + 1]).abs() < 1e-15);
        assert!((yr[6 + 2] - phi(xr[4]) * xr[9 + 2]).abs() < 1e-15);
        assert!((yr[9 + 4] - phi(xr[5]) * xr[12 + 4]).abs() < 1e-15);
        let g: Vec<f64> = (0..n * gate.dim_out())
            .map(|i| ((i as f64) * 1.3).cos())
            .collect();
        let mut gx = vec![0.0; x.len()];
        gate.backward(&x, &g, n, &mut gx).unwrap();
        let loss = |x: &[f64]| {
            let mut y = vec![0.0; n * gate.dim_out()];
            gate.forward(x, n, &mut y).unwrap();
            y.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>()
        };
        for k in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[k] += 1e-6;
            xm[k] -= 1e-6;
            let fd = (loss(&xp) - loss(&xm)) / 2e-6;
            assert!((fd - gx[k]).abs() < 1e-8, "{k}: {fd} vs {}", gx[k]);
        }
    }
}
