//! e3nn's `FullyConnectedTensorProduct(x, one-hot, out)` with a species
//! one-hot as second operand: NequIP's (and sevenn's `nequip`)
//! self-connection. Since the operand `n_types x 0e` is a one-hot, the
//! product is one e3nn Linear per species, applied to the rows of that
//! species.
//!
//! Weight layout (e3nn `uvw` paths, path normalisation `element`): for every
//! pair of an input block `mul_in x ir` and an output block `mul_out x ir`
//! of the same irrep, in (input block, output block) order, a tensor
//! `[mul_in, n_types, mul_out]` row-major; each output block is scaled by
//! `1/√(n_types · Σ mul_in)` over the input blocks of its irrep. The CG of
//! `l ⊗ 0 → l` with e3nn's component normalisation is the identity.

use crate::error::{check_len, E3nnError};
use crate::irreps::{Irreps, IrrepsLinear};
use crate::real::Real;

/// A per-species e3nn Linear: the fully connected tensor product of the
/// node features with the species one-hot.
#[derive(Clone, Debug)]
pub struct SpeciesLinear<T> {
    /// Linear of each species (type index), weights pre-scaled.
    per_type: Vec<IrrepsLinear<T>>,
    dim_in: usize,
    dim_out: usize,
}

impl<T: Real> SpeciesLinear<T> {
    /// Builds the product `irreps_in ⊗ n_types x 0e → irreps_out` from
    /// e3nn's flat weight vector (`*.fc_tensor_product.weight`). Fails if
    /// the length does not match the paths or `n_types` is 0.
    pub fn new(
        irreps_in: &Irreps,
        n_types: usize,
        irreps_out: &Irreps,
        flat_weights: &[f64],
    ) -> Result<Self, E3nnError> {
        if n_types == 0 {
            return Err(E3nnError::Config(
                "a species tensor product needs at least one species".into(),
            ));
        }
        let pairs: Vec<(usize, usize)> = irreps_in
            .blocks
            .iter()
            .flat_map(|bi| {
                irreps_out
                    .blocks
                    .iter()
                    .filter(move |bo| bo.ir == bi.ir)
                    .map(move |bo| (bi.mul, bo.mul))
            })
            .collect();
        let numel: usize = pairs.iter().map(|(a, b)| a * n_types * b).sum();
        check_len(
            &format!("tensor product {irreps_in} x {n_types}x0e -> {irreps_out} weights"),
            numel,
            flat_weights.len(),
        )?;
        // IrrepsLinear scales by 1/√(Σ mul_in); the product's fan-in is
        // n_types times larger.
        let extra = 1.0 / (n_types as f64).sqrt();
        let mut per_type = Vec::with_capacity(n_types);
        for t in 0..n_types {
            let mut flat = Vec::with_capacity(numel / n_types);
            let mut off = 0;
            for &(mi, mo) in &pairs {
                for u in 0..mi {
                    let row = off + (u * n_types + t) * mo;
                    flat.extend(flat_weights[row..row + mo].iter().map(|w| w * extra));
                }
                off += mi * n_types * mo;
            }
            per_type.push(IrrepsLinear::new(irreps_in, irreps_out, &flat)?);
        }
        Ok(Self {
            per_type,
            dim_in: irreps_in.dim(),
            dim_out: irreps_out.dim(),
        })
    }

    /// Floating-point operations of the forward per row (one species'
    /// Linear; every species' has the same shape).
    pub fn flops_per_row(&self) -> usize {
        self.per_type.first().map_or(0, IrrepsLinear::flops_per_row)
    }

    /// Number of species (width of the one-hot rows).
    pub fn n_types(&self) -> usize {
        self.per_type.len()
    }

    /// Input irreps.
    pub fn irreps_in(&self) -> &Irreps {
        self.per_type[0].irreps_in()
    }

    /// Output irreps.
    pub fn irreps_out(&self) -> &Irreps {
        self.per_type[0].irreps_out()
    }

    /// Type index of every row of `onehot` (N × n_types); a row that is not
    /// exactly one 1 among zeros is an error.
    pub fn types_of(&self, onehot: &[T], n_rows: usize) -> Result<Vec<usize>, E3nnError> {
        let nt = self.n_types();
        check_len("species one-hot", n_rows * nt, onehot.len())?;
        onehot
            .chunks_exact(nt)
            .enumerate()
            .map(|(r, row)| {
                let ones: Vec<usize> = (0..nt).filter(|&k| row[k] != T::ZERO).collect();
                match ones[..] {
                    [t] if row[t] == T::ONE => Ok(t),
                    _ => Err(E3nnError::Config(format!(
                        "species one-hot row {r} is not a one-hot vector"
                    ))),
                }
            })
            .collect()
    }

    /// `output` (N × dim_out, overwritten) from `input` (N × dim_in), row r
    /// using the Linear of species `types[r]`.
    pub fn forward(&self, input: &[T], types: &[usize], output: &mut [T]) -> Result<(), E3nnError> {
        self.apply(input, types, output, false)
    }

    /// Gradient w.r.t. the input: `grad_in` (N × dim_in, overwritten) from
    /// `grad_out` (N × dim_out). The weights and species are constants.
    pub fn backward(
        &self,
        grad_out: &[T],
        types: &[usize],
        grad_in: &mut [T],
    ) -> Result<(), E3nnError> {
        self.apply(grad_out, types, grad_in, true)
    }

    /// Groups the rows by species, runs each species' Linear on its rows as
    /// one batch (GEMMs) and scatters the results back.
    fn apply(
        &self,
        src: &[T],
        types: &[usize],
        dst: &mut [T],
        transposed: bool,
    ) -> Result<(), E3nnError> {
        let (ds, dd) = if transposed {
            (self.dim_out, self.dim_in)
        } else {
            (self.dim_in, self.dim_out)
        };
        let n = types.len();
        check_len("species linear source", n * ds, src.len())?;
        check_len("species linear destination", n * dd, dst.len())?;
        let nt = self.n_types();
        if let Some((position, &t)) = types.iter().enumerate().find(|(_, &t)| t >= nt) {
            return Err(E3nnError::Index {
                what: "types",
                position,
                index: t,
                n_rows: nt,
            });
        }
        let mut rows_of = vec![Vec::new(); nt];
        for (r, &t) in types.iter().enumerate() {
            rows_of[t].push(r);
        }
        let mut gathered = Vec::new();
        let mut result = Vec::new();
        for (lin, rows) in self.per_type.iter().zip(&rows_of) {
            if rows.is_empty() {
                continue;
            }
            gathered.clear();
            for &r in rows {
                gathered.extend_from_slice(&src[r * ds..(r + 1) * ds]);
            }
            result.clear();
            result.resize(rows.len() * dd, T::ZERO);
            if transposed {
                lin.backward(&gathered, rows.len(), &mut result)?;
            } else {
                lin.forward(&gathered, rows.len(), &mut result)?;
            }
            for (k, &r) in rows.iter().enumerate() {
                dst[r * dd..(r + 1) * dd].copy_from_slice(&result[k * dd..(k + 1) * dd]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wigner::wigner_3j;

    /// The definition, summed naively: out[w,m] = Σ_{u,v} W[u,v,w] x[u,m]
    /// onehot[v] · √(2l+1)·C(l,0,l)[m,0,m'] / √(n_types·Σ mul_in), with the
    /// CG from `wigner_3j`.
    #[test]
    fn matches_the_tensor_product_definition_and_its_adjoint() {
        let ir_in = Irreps::parse("3x0e+2x1o+1x0e+2x2e").unwrap();
        let ir_out = Irreps::parse("4x0e+1x1o+2x2e+1x1e").unwrap();
        let nt = 3;
        let mut numel = 0;
        for bi in &ir_in.blocks {
            for bo in &ir_out.blocks {
                if bi.ir == bo.ir {
                    numel += bi.mul * nt * bo.mul;
                }
            }
        }
        let w: Vec<f64> = (0..numel).map(|k| ((k as f64) * 0.37).sin()).collect();
        let sl = SpeciesLinear::<f64>::new(&ir_in, nt, &ir_out, &w).unwrap();
        let n = 5;
        let types = [2, 0, 1, 2, 0];
        let x: Vec<f64> = (0..n * ir_in.dim())
            .map(|k| ((k as f64) * 0.71).cos())
            .collect();
        let mut out = vec![0.0; n * ir_out.dim()];
        sl.forward(&x, &types, &mut out).unwrap();
        let (oi, oo) = (ir_in.offsets(), ir_out.offsets());
        let mut expect = vec![0.0; n * ir_out.dim()];
        for (bo_i, bo) in ir_out.blocks.iter().enumerate() {
            let fan: usize = ir_in
                .blocks
                .iter()
                .filter(|b| b.ir == bo.ir)
                .map(|b| b.mul * nt)
                .sum();
            let mut off = 0;
            for (bi_i, bi) in ir_in.blocks.iter().enumerate() {
                for (bj, bj_blk) in ir_out.blocks.iter().enumerate() {
                    if bi.ir != bj_blk.ir {
                        continue;
                    }
                    if bj == bo_i {
                        let (l, d) = (bi.ir.l, bi.ir.dim());
                        let cg = wigner_3j(l, 0, l).unwrap();
                        let norm = ((2 * l + 1) as f64).sqrt() / (fan as f64).sqrt();
                        for r in 0..n {
                            for u in 0..bi.mul {
                                for wv in 0..bo.mul {
                                    let wt = w[off + (u * nt + types[r]) * bo.mul + wv];
                                    for a in 0..d {
                                        for k in 0..d {
                                            expect[r * ir_out.dim() + oo[bo_i] + wv * d + k] += norm
                                                * cg[a * d + k]
                                                * wt
                                                * x[r * ir_in.dim() + oi[bi_i] + u * d + a];
                                        }
                                    }
                                }
                            }
                        }
                    }
                    off += bi.mul * nt * bj_blk.mul;
                }
            }
        }
        for (a, b) in out.iter().zip(&expect) {
            assert!((a - b).abs() < 1e-13, "{a} vs {b}");
        }
        // Adjoint: <g, F x> = <F^T g, x>.
        let g: Vec<f64> = (0..out.len()).map(|k| ((k as f64) * 1.3).sin()).collect();
        let mut gx = vec![0.0; x.len()];
        sl.backward(&g, &types, &mut gx).unwrap();
        let lhs: f64 = g.iter().zip(&out).map(|(a, b)| a * b).sum();
        let rhs: f64 = gx.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-12 * lhs.abs().max(1.0));
    }

    #[test]
    fn one_hot_rows_are_checked() {
        let ir = Irreps::parse("2x0e").unwrap();
        let sl = SpeciesLinear::<f64>::new(&ir, 2, &ir, &[0.5; 8]).unwrap();
        assert_eq!(sl.types_of(&[0.0, 1.0, 1.0, 0.0], 2).unwrap(), [1, 0]);
        assert!(sl.types_of(&[0.0, 0.5, 1.0, 0.0], 2).is_err());
        assert!(sl.types_of(&[1.0, 1.0, 1.0, 0.0], 2).is_err());
        assert!(SpeciesLinear::<f64>::new(&ir, 2, &ir, &[0.5; 7]).is_err());
        let mut out = vec![0.0; 2];
        assert!(sl.forward(&[1.0, 2.0], &[2], &mut out).is_err());
    }
}
