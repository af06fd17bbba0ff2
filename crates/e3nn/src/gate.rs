//! e3nn `Gate` with normalised activations on scalars and gates
//! (normalised SiLU on both in the pretrained SevenNets).
//!
//! Input row layout: `[scalars (n_scalars) | gates (Σ mul) | gated blocks]`,
//! gated block k being `mul_k` copies of degree `l_k` (mul-major). Output:
//! `[φ_s(scalars) | φ_g(gate_u)·gated_u for each gated copy]`, φ_s per run
//! of scalars (e3nn picks it by the scalars' parity), φ_g one for all gates.

use crate::activation::Activation;
use crate::error::{check_len, E3nnError};
use crate::real::Real;
use rayon::prelude::*;

/// Gate layout: plain scalars with their activations, the gate activation
/// and the gated `(mul, l)` blocks.
#[derive(Clone, Debug)]
pub struct Gate {
    /// Number of scalars that only get φ.
    pub n_scalars: usize,
    /// Gated blocks `(mul, l)`, one gate per copy, in gate order.
    pub gated: Vec<(usize, usize)>,
    /// The scalars' activations as consecutive runs `(count, φ)`; the counts
    /// sum to `n_scalars`.
    pub scalar_activations: Vec<(usize, Activation)>,
    /// The activation of every gate scalar.
    pub gate_activation: Activation,
}

impl Gate {
    /// A gate with normalised SiLU on scalars and gates (the pretrained
    /// SevenNets' choice).
    pub fn silu(n_scalars: usize, gated: Vec<(usize, usize)>) -> Self {
        Self {
            n_scalars,
            gated,
            scalar_activations: vec![(n_scalars, Activation::Silu)],
            gate_activation: Activation::Silu,
        }
    }

    /// Checks that the activation runs cover the scalars exactly.
    fn check_runs(&self) -> Result<(), E3nnError> {
        check_len(
            "gate scalar activation runs",
            self.n_scalars,
            self.scalar_activations.iter().map(|r| r.0).sum(),
        )
    }

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
        self.check_runs()?;
        if n_rows == 0 || dout == 0 {
            return Ok(());
        }
        let act_g = self.gate_activation;
        output
            .par_chunks_mut(dout)
            .zip(input.par_chunks(di))
            .for_each(|(o, x)| {
                let mut c0 = 0;
                for &(count, act) in &self.scalar_activations {
                    act.eval_slice(&x[c0..c0 + count], &mut o[c0..c0 + count]);
                    c0 += count;
                }
                let (mut gi, mut src, mut dst) = (ns, ns + ng, ns);
                for &(mul, l) in &self.gated {
                    let d = 2 * l + 1;
                    for _ in 0..mul {
                        let g = act_g.eval(x[gi]);
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
        self.check_runs()?;
        if n_rows == 0 || di == 0 {
            return Ok(());
        }
        let act_g = self.gate_activation;
        grad_in
            .par_chunks_mut(di)
            .zip(input.par_chunks(di))
            .zip(grad_out.par_chunks(dout.max(1)))
            .for_each(|((gx, x), go)| {
                let mut c0 = 0;
                for &(count, act) in &self.scalar_activations {
                    for c in c0..c0 + count {
                        gx[c] = go[c] * act.grad(x[c]);
                    }
                    c0 += count;
                }
                let (mut gi, mut src, mut dst) = (ns, ns + ng, ns);
                for &(mul, l) in &self.gated {
                    let d = 2 * l + 1;
                    for _ in 0..mul {
                        let g = act_g.eval(x[gi]);
                        let mut dot = T::ZERO;
                        for c in 0..d {
                            dot += go[dst + c] * x[src + c];
                            gx[src + c] = go[dst + c] * g;
                        }
                        gx[gi] = dot * act_g.grad(x[gi]);
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
        let gate = Gate::silu(3, vec![(2, 1), (1, 2)]);
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

    /// Mixed activations (odd scalars through tanh, even through SiLU,
    /// gates through ssp): each output is its own φ of its input, and the
    /// backward matches finite differences.
    #[test]
    fn mixed_activations_forward_and_fd() {
        let gate = Gate {
            n_scalars: 5,
            gated: vec![(2, 1)],
            scalar_activations: vec![(2, Activation::Tanh), (3, Activation::Silu)],
            gate_activation: Activation::Ssp,
        };
        let n = 3;
        let x: Vec<f64> = (0..n * gate.dim_in())
            .map(|i| ((i as f64) * 0.53).cos() * 1.7)
            .collect();
        let mut y = vec![0.0; n * gate.dim_out()];
        gate.forward(&x, n, &mut y).unwrap();
        let (di, dout) = (gate.dim_in(), gate.dim_out());
        let c_tanh = Activation::Tanh.norm();
        let c_ssp = Activation::Ssp.norm();
        for r in 0..n {
            let (xr, yr) = (&x[r * di..(r + 1) * di], &y[r * dout..(r + 1) * dout]);
            for c in 0..2 {
                assert!((yr[c] - c_tanh * xr[c].tanh()).abs() < 1e-14);
            }
            for c in 2..5 {
                let silu = crate::radial::SILU_NORM * xr[c] / (1.0 + (-xr[c]).exp());
                assert!((yr[c] - silu).abs() < 1e-14);
            }
            // Second gated copy: gate 6, components 10..13 → outputs 8..11.
            let g = c_ssp * ((1.0 + xr[6].exp()).ln() - 2f64.ln());
            for k in 0..3 {
                assert!((yr[8 + k] - g * xr[10 + k]).abs() < 1e-14);
            }
        }
        let w: Vec<f64> = (0..n * dout).map(|i| ((i as f64) * 0.9).sin()).collect();
        let mut gx = vec![0.0; x.len()];
        gate.backward(&x, &w, n, &mut gx).unwrap();
        let loss = |x: &[f64]| {
            let mut y = vec![0.0; n * dout];
            gate.forward(x, n, &mut y).unwrap();
            y.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>()
        };
        for k in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[k] += 1e-6;
            xm[k] -= 1e-6;
            let fd = (loss(&xp) - loss(&xm)) / 2e-6;
            assert!((fd - gx[k]).abs() < 1e-8, "{k}: {fd} vs {}", gx[k]);
        }
        let bad = Gate {
            scalar_activations: vec![(4, Activation::Tanh)],
            ..gate
        };
        assert!(bad.forward(&x, n, &mut y).is_err());
    }
}
