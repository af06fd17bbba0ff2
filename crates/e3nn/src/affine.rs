//! An e3nn `Linear` plus a constant row: how a multi-fidelity SevenNet's
//! Linears read the modality. sevenn appends the modality one-hot
//! (`n_modals x 0e`) to the input of some Linears; with the modality fixed
//! for a run, that one-hot adds the same vector to every output row, and it
//! widens the fan-in (hence the path normalisation) of the scalar outputs.

use crate::error::{check_len, E3nnError};
use crate::irreps::{Irrep, Irreps, IrrepsLinear};
use crate::real::Real;
use rayon::prelude::*;

/// `output = Linear(input) + bias` row by row (`bias` absent: a plain Linear).
#[derive(Clone, Debug)]
pub struct AffineLinear<T> {
    /// The Linear on the node features alone, normalised as sevenn's Linear
    /// with the modality inputs.
    pub linear: IrrepsLinear<T>,
    /// The modality's constant contribution, one value per output column.
    pub bias: Option<Vec<T>>,
}

impl<T: Real> AffineLinear<T> {
    /// A plain Linear from e3nn's flat weight vector.
    pub fn plain(irreps_in: &Irreps, irreps_out: &Irreps, flat: &[f64]) -> Result<Self, E3nnError> {
        Ok(Self {
            linear: IrrepsLinear::new(irreps_in, irreps_out, flat)?,
            bias: None,
        })
    }

    /// sevenn's Linear on `irreps_x + n_modals x 0e` (flat weights as stored,
    /// the modality block last) with the one-hot of modality `modal` fixed.
    pub fn with_modal(
        irreps_x: &Irreps,
        irreps_out: &Irreps,
        flat: &[f64],
        n_modals: usize,
        modal: usize,
    ) -> Result<Self, E3nnError> {
        if modal >= n_modals {
            return Err(E3nnError::Config(format!("modality {modal} of {n_modals}")));
        }
        let scalar = Irrep { l: 0, p: 1 };
        let n_x = irreps_x.blocks.len();
        let mut blocks_in: Vec<(usize, Irrep)> =
            irreps_x.blocks.iter().map(|b| (b.mul, b.ir)).collect();
        blocks_in.push((n_modals, scalar));
        // e3nn's instruction order: input block outer, output block inner.
        let mut instrs = Vec::new();
        let mut fan_x = vec![0usize; irreps_out.blocks.len()];
        let mut fan_full = vec![0usize; irreps_out.blocks.len()];
        let mut off = 0;
        for (a, &(mul_in, ir_in)) in blocks_in.iter().enumerate() {
            for (b, bo) in irreps_out.blocks.iter().enumerate() {
                if bo.ir == ir_in {
                    instrs.push((a, b, off));
                    off += mul_in * bo.mul;
                    fan_full[b] += mul_in;
                    if a < n_x {
                        fan_x[b] += mul_in;
                    }
                }
            }
        }
        check_len(
            &format!("Linear {irreps_x}+{n_modals}x0e -> {irreps_out} weights"),
            off,
            flat.len(),
        )?;
        let out_offs = irreps_out.offsets();
        let mut x_flat = Vec::new();
        let mut bias = vec![0.0f64; irreps_out.dim()];
        for &(a, b, w_off) in &instrs {
            let mul_out = irreps_out.blocks[b].mul;
            let mul_in = blocks_in[a].0;
            let full = fan_full[b] as f64;
            if a < n_x {
                // IrrepsLinear divides by √fan_x; sevenn divides by √fan_full.
                let s = (fan_x[b] as f64).sqrt() / full.sqrt();
                x_flat.extend(flat[w_off..w_off + mul_in * mul_out].iter().map(|w| w * s));
            } else {
                let row = &flat[w_off + modal * mul_out..w_off + (modal + 1) * mul_out];
                for (v, w) in row.iter().enumerate() {
                    bias[out_offs[b] + v] += w / full.sqrt();
                }
            }
        }
        Ok(Self {
            linear: IrrepsLinear::new(irreps_x, irreps_out, &x_flat)?,
            bias: Some(bias.into_iter().map(T::from_f64).collect()),
        })
    }

    /// Adds e3nn's Linear bias (`biases=True`): `flat` holds one value per
    /// `0e` output channel, block after block in output order; the other
    /// outputs get none. An empty `flat` adds nothing.
    pub fn add_scalar_bias(mut self, flat: &[f64]) -> Result<Self, E3nnError> {
        if flat.is_empty() {
            return Ok(self);
        }
        let out = self.linear.irreps_out().clone();
        let scalar = Irrep { l: 0, p: 1 };
        let n_bias: usize = out
            .blocks
            .iter()
            .filter(|b| b.ir == scalar)
            .map(|b| b.mul)
            .sum();
        check_len(&format!("Linear -> {out} bias"), n_bias, flat.len())?;
        let mut bias: Vec<f64> = match &self.bias {
            Some(b) => b.iter().map(|v| v.to_f64_lossless()).collect(),
            None => vec![0.0; out.dim()],
        };
        let mut k = 0;
        for (block, off) in out.blocks.iter().zip(out.offsets()) {
            if block.ir == scalar {
                for v in 0..block.mul {
                    bias[off + v] += flat[k];
                    k += 1;
                }
            }
        }
        self.bias = Some(bias.into_iter().map(T::from_f64).collect());
        Ok(self)
    }

    /// Input irreps (without the modality block).
    pub fn irreps_in(&self) -> &Irreps {
        self.linear.irreps_in()
    }

    /// Output irreps.
    pub fn irreps_out(&self) -> &Irreps {
        self.linear.irreps_out()
    }

    /// `output` (N × dim_out, overwritten) = Linear(`input`) + bias.
    pub fn forward(&self, input: &[T], n_rows: usize, output: &mut [T]) -> Result<(), E3nnError> {
        self.linear.forward(input, n_rows, output)?;
        self.add_bias(output);
        Ok(())
    }

    /// [`Self::forward`] on input rows stored component-major by `parts`
    /// ([`IrrepsLinear::forward_component_major`]).
    pub fn forward_component_major(
        &self,
        input: &[T],
        parts: &[(usize, usize, usize)],
        n_rows: usize,
        output: &mut [T],
    ) -> Result<(), E3nnError> {
        self.linear
            .forward_component_major(input, parts, n_rows, output)?;
        self.add_bias(output);
        Ok(())
    }

    fn add_bias(&self, output: &mut [T]) {
        if let Some(bias) = &self.bias {
            let d = bias.len();
            output.par_chunks_mut(d.max(1)).for_each(|row| {
                for (o, &b) in row.iter_mut().zip(bias) {
                    *o += b;
                }
            });
        }
    }

    /// Gradient w.r.t. the input (the bias is a constant).
    pub fn backward(
        &self,
        grad_out: &[T],
        n_rows: usize,
        grad_in: &mut [T],
    ) -> Result<(), E3nnError> {
        self.linear.backward(grad_out, n_rows, grad_in)
    }

    /// [`Self::backward`] writing the input gradient component-major by
    /// `parts` ([`IrrepsLinear::backward_component_major`]).
    pub fn backward_component_major(
        &self,
        grad_out: &[T],
        n_rows: usize,
        grad_in: &mut [T],
        parts: &[(usize, usize, usize)],
    ) -> Result<(), E3nnError> {
        self.linear
            .backward_component_major(grad_out, n_rows, grad_in, parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed-modality Linear equals the full Linear applied to the
    /// input with the one-hot appended.
    #[test]
    fn modal_linear_equals_linear_on_concatenated_one_hot() {
        let x = Irreps::parse("3x0e+2x1e").unwrap();
        let out = Irreps::parse("4x0e+1x1e").unwrap();
        let mut full_in = x.clone();
        full_in
            .blocks
            .push(Irreps::parse("2x0e").unwrap().blocks[0]);
        let n_w = 3 * 4 + 2 + 2 * 4;
        let flat: Vec<f64> = (0..n_w)
            .map(|k| ((k * 7 % 11) as f64 - 5.0) / 3.0)
            .collect();
        let full = IrrepsLinear::<f64>::new(&full_in, &out, &flat).unwrap();
        let rows = 3;
        let input: Vec<f64> = (0..rows * x.dim())
            .map(|k| (k as f64 * 0.37).sin())
            .collect();
        for modal in 0..2 {
            let aff = AffineLinear::<f64>::with_modal(&x, &out, &flat, 2, modal).unwrap();
            let mut got = vec![0.0; rows * out.dim()];
            aff.forward(&input, rows, &mut got).unwrap();
            let mut cat = Vec::new();
            for r in 0..rows {
                cat.extend_from_slice(&input[r * x.dim()..(r + 1) * x.dim()]);
                cat.extend([
                    f64::from(u8::from(modal == 0)),
                    f64::from(u8::from(modal == 1)),
                ]);
            }
            let mut want = vec![0.0; rows * out.dim()];
            full.forward(&cat, rows, &mut want).unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-14, "{a} vs {b}");
            }
        }
    }
}
