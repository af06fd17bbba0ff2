//! Irreps lists (`"128x0e+64x1e+32x2e"`) and e3nn's `o3.Linear` on them.
//!
//! Layout is e3nn's mul-major one: block b occupies `offset_b ..
//! offset_b + mul·(2l+1)` and copy u, component c sits at
//! `offset_b + u·(2l+1) + c`.

use crate::error::{check_len, E3nnError};
use crate::gemm::{gemm, MatMut, MatRef};
use crate::real::Real;
use rayon::prelude::*;
use std::fmt;

/// An irreducible representation of O(3): degree `l` and parity `p` (±1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Irrep {
    /// Degree l ≥ 0.
    pub l: usize,
    /// Parity: +1 (`e`) or −1 (`o`).
    pub p: i8,
}

impl Irrep {
    /// Dimension 2l+1.
    pub fn dim(&self) -> usize {
        2 * self.l + 1
    }
    /// e3nn's ordering key: by l, then odd before even.
    fn sort_key(&self) -> (usize, i8) {
        (self.l, self.p)
    }
}

/// One block of an irreps list: `mul` copies of `ir`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulIr {
    /// Multiplicity (number of copies).
    pub mul: usize,
    /// The irrep.
    pub ir: Irrep,
}

impl MulIr {
    /// Dimension `mul·(2l+1)`.
    pub fn dim(&self) -> usize {
        self.mul * self.ir.dim()
    }
}

/// An ordered list of irreps blocks.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Irreps {
    /// The blocks, in layout order.
    pub blocks: Vec<MulIr>,
}

impl Irreps {
    /// Parses e3nn syntax: blocks `MULxLP` (or `LP` for mul 1) joined by `+`,
    /// P ∈ {e, o}; whitespace is ignored; `""` is the empty list.
    pub fn parse(s: &str) -> Result<Self, E3nnError> {
        let err = |reason: &str| E3nnError::IrrepsParse {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let mut blocks = Vec::new();
        if compact.is_empty() {
            return Ok(Self { blocks });
        }
        for part in compact.split('+') {
            let (mul, ir) = match part.split_once('x') {
                Some((m, ir)) => (
                    m.parse::<usize>()
                        .map_err(|_| err(&format!("bad multiplicity in {part:?}")))?,
                    ir,
                ),
                None => (1, part),
            };
            let p = match ir.chars().last() {
                Some('e') => 1,
                Some('o') => -1,
                _ => return Err(err(&format!("block {part:?} must end with parity e or o"))),
            };
            let l = ir[..ir.len() - 1]
                .parse::<usize>()
                .map_err(|_| err(&format!("bad degree in {part:?}")))?;
            blocks.push(MulIr {
                mul,
                ir: Irrep { l, p },
            });
        }
        Ok(Self { blocks })
    }

    /// Total dimension Σ mul·(2l+1).
    pub fn dim(&self) -> usize {
        self.blocks.iter().map(|b| b.dim()).sum()
    }

    /// Start offset of every block.
    pub fn offsets(&self) -> Vec<usize> {
        let mut o = Vec::with_capacity(self.blocks.len());
        let mut acc = 0;
        for b in &self.blocks {
            o.push(acc);
            acc += b.dim();
        }
        o
    }

    /// Whether `parts` (`(offset, mul, dim)` by offset; parts of no copies
    /// ignored) tile the blocks: every block is covered exactly by
    /// consecutive parts of its dimension, and no part is left over.
    pub fn tiled_by(&self, parts: &[(usize, usize, usize)]) -> bool {
        let mut parts = parts.iter().filter(|r| r.1 > 0).peekable();
        for (b, off) in self.blocks.iter().zip(self.offsets()) {
            let (end, d) = (off + b.dim(), b.ir.dim());
            let mut at = off;
            while at < end {
                match parts.next() {
                    Some(&(o, m, pd)) if o == at && pd == d && o + m * d <= end => at += m * d,
                    _ => return false,
                }
            }
        }
        parts.peek().is_none()
    }

    /// Largest degree present (0 for an empty list).
    pub fn lmax(&self) -> usize {
        self.blocks.iter().map(|b| b.ir.l).max().unwrap_or(0)
    }

    /// e3nn `simplify()`: merges adjacent blocks of the same irrep (no sort).
    pub fn simplify(&self) -> Self {
        let mut out: Vec<MulIr> = Vec::new();
        for b in &self.blocks {
            match out.last_mut() {
                Some(last) if last.ir == b.ir => last.mul += b.mul,
                _ => out.push(*b),
            }
        }
        Self { blocks: out }
    }

    /// e3nn `sort()`: stable sort by irrep; returns the sorted list and the
    /// permutation `perm[old] = new`.
    pub fn sort(&self) -> (Self, Vec<usize>) {
        let mut idx: Vec<usize> = (0..self.blocks.len()).collect();
        idx.sort_by_key(|&i| self.blocks[i].ir.sort_key());
        let mut perm = vec![0; idx.len()];
        for (new, &old) in idx.iter().enumerate() {
            perm[old] = new;
        }
        (
            Self {
                blocks: idx.iter().map(|&i| self.blocks[i]).collect(),
            },
            perm,
        )
    }
}

impl fmt::Display for Irreps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .blocks
            .iter()
            .map(|b| format!("{}x{}{}", b.mul, b.ir.l, if b.ir.p > 0 { 'e' } else { 'o' }))
            .collect();
        write!(f, "{}", parts.join("+"))
    }
}

#[derive(Clone, Debug)]
struct LinearInstr {
    block_in: usize,
    block_out: usize,
    /// Offset of the (mul_in × mul_out) block in `weights`.
    w_offset: usize,
}

/// A part of a Linear's input block: `(first copy, copies, column)`.
type InputSegment = (usize, usize, usize);

/// e3nn `o3.Linear` without bias (`path_normalization='element'`): every pair
/// of equal irreps (input block outer loop, output block inner loop) gets a
/// `(mul_in × mul_out)` row-major weight block; output block b is scaled by
/// `1/√(Σ mul_in feeding b)`. Output blocks nothing feeds are zero.
#[derive(Clone, Debug)]
pub struct IrrepsLinear<T> {
    irreps_in: Irreps,
    irreps_out: Irreps,
    instrs: Vec<LinearInstr>,
    /// Flat weights, already multiplied by their path normalisation.
    weights: Vec<T>,
}

/// Rows per parallel task.
const LINEAR_CHUNK: usize = 64;

impl<T: Real> IrrepsLinear<T> {
    /// Builds the Linear from e3nn's flat weight vector (unscaled, as stored
    /// in `*.linear.weight`). Fails if its length does not match the
    /// instructions.
    pub fn new(
        irreps_in: &Irreps,
        irreps_out: &Irreps,
        flat_weights: &[f64],
    ) -> Result<Self, E3nnError> {
        let mut instrs = Vec::new();
        let mut fan_in = vec![0usize; irreps_out.blocks.len()];
        let mut off = 0;
        for (a, bi) in irreps_in.blocks.iter().enumerate() {
            for (b, bo) in irreps_out.blocks.iter().enumerate() {
                if bi.ir == bo.ir {
                    instrs.push(LinearInstr {
                        block_in: a,
                        block_out: b,
                        w_offset: off,
                    });
                    off += bi.mul * bo.mul;
                    fan_in[b] += bi.mul;
                }
            }
        }
        check_len(
            &format!("Linear {irreps_in} -> {irreps_out} weights"),
            off,
            flat_weights.len(),
        )?;
        let mut weights = vec![T::ZERO; off];
        for ins in &instrs {
            let (mi, mo) = (
                irreps_in.blocks[ins.block_in].mul,
                irreps_out.blocks[ins.block_out].mul,
            );
            let alpha = if fan_in[ins.block_out] > 0 {
                1.0 / (fan_in[ins.block_out] as f64).sqrt()
            } else {
                0.0
            };
            for k in ins.w_offset..ins.w_offset + mi * mo {
                weights[k] = T::from_f64(flat_weights[k] * alpha);
            }
        }
        Ok(Self {
            irreps_in: irreps_in.clone(),
            irreps_out: irreps_out.clone(),
            instrs,
            weights,
        })
    }

    /// Input irreps.
    pub fn irreps_in(&self) -> &Irreps {
        &self.irreps_in
    }

    /// Output irreps.
    pub fn irreps_out(&self) -> &Irreps {
        &self.irreps_out
    }

    /// Floating-point operations of the forward per row (a multiply-add is
    /// 2): `2 · Σ mul_in · mul_out · (2l+1)` over the weight blocks.
    pub fn flops_per_row(&self) -> usize {
        self.instrs
            .iter()
            .map(|ins| {
                let (bi, bo) = (
                    &self.irreps_in.blocks[ins.block_in],
                    &self.irreps_out.blocks[ins.block_out],
                );
                2 * bi.mul * bo.mul * bo.ir.dim()
            })
            .sum()
    }

    /// `output` (N × dim_out, overwritten) = Linear(`input`, N × dim_in).
    pub fn forward(&self, input: &[T], n_rows: usize, output: &mut [T]) -> Result<(), E3nnError> {
        self.apply(input, n_rows, output, false, None)
    }

    /// Gradient w.r.t. the input: `grad_in` (N × dim_in, overwritten) from
    /// `grad_out` (N × dim_out). The weights are constants.
    pub fn backward(
        &self,
        grad_out: &[T],
        n_rows: usize,
        grad_in: &mut [T],
    ) -> Result<(), E3nnError> {
        self.apply(grad_out, n_rows, grad_in, true, None)
    }

    /// [`Self::forward`] on input rows stored component-major by parts:
    /// `parts` are `(offset, mul, dim)` blocks that tile every input irreps
    /// block (consecutive parts of the block's dimension covering it), and
    /// copy u of component c of a part sits at `offset + c·mul + u` — the
    /// layout the convolution kernels write their message in
    /// ([`crate::ConvPaths::out_blocks`]). The output is in e3nn's layout.
    /// Each part is its own GEMM, so a block of several parts sums over its
    /// copies in a different order than [`Self::forward`] (within rounding).
    pub fn forward_component_major(
        &self,
        input: &[T],
        parts: &[(usize, usize, usize)],
        n_rows: usize,
        output: &mut [T],
    ) -> Result<(), E3nnError> {
        self.apply(input, n_rows, output, false, Some(parts))
    }

    /// [`Self::backward`] writing the input gradient component-major by
    /// `parts` (as [`Self::forward_component_major`] reads its input): the
    /// same values, moved.
    pub fn backward_component_major(
        &self,
        grad_out: &[T],
        n_rows: usize,
        grad_in: &mut [T],
        parts: &[(usize, usize, usize)],
    ) -> Result<(), E3nnError> {
        self.apply(grad_out, n_rows, grad_in, true, Some(parts))
    }

    /// Per instruction, the parts of its input block as `(first copy,
    /// copies, offset)`: one part `(0, mul, offset)` in e3nn's layout
    /// (`parts` = None), else the given parts inside the block, which must
    /// tile the input irreps ([`Irreps::tiled_by`]).
    fn input_segments(
        &self,
        parts: Option<&[(usize, usize, usize)]>,
    ) -> Result<Vec<Vec<InputSegment>>, E3nnError> {
        if let Some(parts) = parts {
            if !self.irreps_in.tiled_by(parts) {
                return Err(E3nnError::Config(format!(
                    "component-major parts do not tile the Linear's input irreps {}",
                    self.irreps_in
                )));
            }
        }
        let offs = self.irreps_in.offsets();
        let segments = self
            .instrs
            .iter()
            .map(|ins| {
                let (bi, off) = (self.irreps_in.blocks[ins.block_in], offs[ins.block_in]);
                match parts {
                    None => vec![(0, bi.mul, off)],
                    Some(parts) => parts
                        .iter()
                        .filter(|&&(o, m, _)| m > 0 && (off..off + bi.dim()).contains(&o))
                        .map(|&(o, m, _)| ((o - off) / bi.ir.dim(), m, o))
                        .collect(),
                }
            })
            .collect();
        Ok(segments)
    }

    /// One GEMM per (instruction, component) over a chunk of rows; the
    /// transposed flag swaps the roles of input and output (backward).
    fn apply(
        &self,
        src: &[T],
        n_rows: usize,
        dst: &mut [T],
        transposed: bool,
        input_parts: Option<&[(usize, usize, usize)]>,
    ) -> Result<(), E3nnError> {
        let (ir_src, ir_dst) = if transposed {
            (&self.irreps_out, &self.irreps_in)
        } else {
            (&self.irreps_in, &self.irreps_out)
        };
        let (ds, dd) = (ir_src.dim(), ir_dst.dim());
        check_len("Linear source", n_rows * ds, src.len())?;
        check_len("Linear destination", n_rows * dd, dst.len())?;
        if n_rows == 0 || dd == 0 {
            return Ok(());
        }
        if ds == 0 {
            dst.fill(T::ZERO);
            return Ok(());
        }
        let off_out = self.irreps_out.offsets();
        let segments = self.input_segments(input_parts)?;
        dst.par_chunks_mut(LINEAR_CHUNK * dd)
            .zip(src.par_chunks(LINEAR_CHUNK * ds))
            .for_each(|(d, s)| {
                let rows = d.len() / dd;
                let mut written = vec![false; ir_dst.blocks.len()];
                for (ins, segs) in self.instrs.iter().zip(&segments) {
                    let (bi, bo) = (
                        self.irreps_in.blocks[ins.block_in],
                        self.irreps_out.blocks[ins.block_out],
                    );
                    let dim = bi.ir.dim();
                    // Weight as (mul_in × mul_out) row-major.
                    let w = &self.weights[ins.w_offset..ins.w_offset + bi.mul * bo.mul];
                    let out_at = off_out[ins.block_out];
                    let dst_blk = if transposed {
                        ins.block_in
                    } else {
                        ins.block_out
                    };
                    let beta = if written[dst_blk] { T::ONE } else { T::ZERO };
                    written[dst_blk] = true;
                    for c in 0..dim {
                        for (k, &(first, m, at)) in segs.iter().enumerate() {
                            // Component c of this part of the input block:
                            // copies `dim` apart from its column c (e3nn's
                            // layout), or contiguous from column c·m.
                            let (in_at, in_cs) = if input_parts.is_some() {
                                (at + c * m, 1)
                            } else {
                                (at + c, dim)
                            };
                            if transposed {
                                // grad_in[part] = grad_out_c · Wᵀ[:, part].
                                gemm(
                                    T::ONE,
                                    MatRef {
                                        data: &s[out_at + c..],
                                        rows,
                                        cols: bo.mul,
                                        rs: ds,
                                        cs: dim,
                                    },
                                    MatRef {
                                        data: &w[first * bo.mul..],
                                        rows: bo.mul,
                                        cols: m,
                                        rs: 1,
                                        cs: bo.mul,
                                    },
                                    beta,
                                    MatMut {
                                        data: &mut d[in_at..],
                                        rows,
                                        cols: m,
                                        rs: dd,
                                        cs: in_cs,
                                    },
                                );
                            } else {
                                // out_c (+)= input_c[part] · W[part, :].
                                let beta = if k == 0 { beta } else { T::ONE };
                                gemm(
                                    T::ONE,
                                    MatRef {
                                        data: &s[in_at..],
                                        rows,
                                        cols: m,
                                        rs: ds,
                                        cs: in_cs,
                                    },
                                    MatRef {
                                        data: &w[first * bo.mul..],
                                        rows: m,
                                        cols: bo.mul,
                                        rs: bo.mul,
                                        cs: 1,
                                    },
                                    beta,
                                    MatMut {
                                        data: &mut d[out_at + c..],
                                        rows,
                                        cols: bo.mul,
                                        rs: dd,
                                        cs: dim,
                                    },
                                );
                            }
                        }
                    }
                }
                // Blocks no instruction writes are zero.
                let offs = ir_dst.offsets();
                for (b, blk) in ir_dst.blocks.iter().enumerate() {
                    if !written[b] {
                        for r in 0..rows {
                            d[r * dd + offs[b]..r * dd + offs[b] + blk.dim()].fill(T::ZERO);
                        }
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
    fn parse_and_dims() {
        let ir = Irreps::parse("128x0e+64x1e + 32x2e").unwrap();
        assert_eq!(ir.dim(), 128 + 192 + 160);
        assert_eq!(ir.offsets(), vec![0, 128, 320]);
        assert_eq!(ir.to_string(), "128x0e+64x1e+32x2e");
        assert_eq!(
            Irreps::parse("0e+2x1o").unwrap().blocks[1],
            MulIr {
                mul: 2,
                ir: Irrep { l: 1, p: -1 }
            }
        );
        assert!(Irreps::parse("12x1").is_err());
        assert!(Irreps::parse("ax1e").is_err());
        assert!(Irreps::parse("3xqe").is_err());
        assert_eq!(Irreps::parse("").unwrap().dim(), 0);
    }

    #[test]
    fn sort_and_simplify() {
        let ir = Irreps::parse("1x1e+2x0e+3x1e+1x0o+4x0e").unwrap();
        let (s, perm) = ir.sort();
        assert_eq!(s.to_string(), "1x0o+2x0e+4x0e+1x1e+3x1e");
        assert_eq!(perm, vec![3, 1, 4, 0, 2]);
        assert_eq!(s.simplify().to_string(), "1x0o+6x0e+4x1e");
    }

    fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// Independent per-element implementation of §4.2.
    fn naive(ir_in: &Irreps, ir_out: &Irreps, w: &[f64], x: &[f64]) -> Vec<f64> {
        let (oi, oo) = (ir_in.offsets(), ir_out.offsets());
        let mut y = vec![0.0; ir_out.dim()];
        let mut woff = 0;
        let mut fan = vec![0usize; ir_out.blocks.len()];
        for bi in &ir_in.blocks {
            for (b, bo) in ir_out.blocks.iter().enumerate() {
                if bi.ir == bo.ir {
                    fan[b] += bi.mul;
                }
            }
        }
        for (a, bi) in ir_in.blocks.iter().enumerate() {
            for (b, bo) in ir_out.blocks.iter().enumerate() {
                if bi.ir != bo.ir {
                    continue;
                }
                let d = bi.ir.dim();
                for u in 0..bi.mul {
                    for v in 0..bo.mul {
                        for c in 0..d {
                            y[oo[b] + v * d + c] += w[woff + u * bo.mul + v] * x[oi[a] + u * d + c]
                                / (fan[b] as f64).sqrt();
                        }
                    }
                }
                woff += bi.mul * bo.mul;
            }
        }
        y
    }

    /// A copy-major row moved to component-major by `parts` (each
    /// `(offset, mul, dim)` part of a block on its own).
    fn to_parts(parts: &[(usize, usize, usize)], row: &[f64]) -> Vec<f64> {
        let mut out = row.to_vec();
        for &(off, mul, d) in parts {
            for u in 0..mul {
                for c in 0..d {
                    out[off + c * mul + u] = row[off + u * d + c];
                }
            }
        }
        out
    }

    /// Input rows component-major by parts: whole blocks give the
    /// copy-major forward's output bit for bit; blocks split in parts give
    /// it within rounding (each part its own GEMM); the backward writes the
    /// copy-major input gradient's values, moved; parts that do not tile a
    /// block are refused.
    #[test]
    fn component_major_input_equals_copy_major() {
        let ir_in = Irreps::parse("5x0e+3x1e+2x0e+2x2e+1x1o").unwrap();
        let ir_out = Irreps::parse("4x0e+2x1e+3x2e+2x3e").unwrap();
        let w = random(5 * 4 + 3 * 2 + 2 * 4 + 2 * 3, 3);
        let lin = IrrepsLinear::<f64>::new(&ir_in, &ir_out, &w).unwrap();
        let (n, di, dout) = (70, ir_in.dim(), ir_out.dim());
        let whole: Vec<_> = ir_in
            .blocks
            .iter()
            .zip(ir_in.offsets())
            .map(|(b, o)| (o, b.mul, b.ir.dim()))
            .collect();
        // 3x1e as 2 + 1 copies, 2x2e as 1 + 1.
        let split = vec![
            (0, 5, 1),
            (5, 2, 3),
            (11, 1, 3),
            (14, 2, 1),
            (16, 1, 5),
            (21, 1, 5),
            (26, 1, 3),
        ];
        let x = random(n * di, 4);
        let mut y = vec![0.0; n * dout];
        lin.forward(&x, n, &mut y).unwrap();
        let g = random(n * dout, 5);
        let mut gx = vec![0.0; n * di];
        lin.backward(&g, n, &mut gx).unwrap();
        for (parts, exact) in [(&whole, true), (&split, false)] {
            let moved = |v: &[f64]| -> Vec<f64> {
                v.chunks_exact(di)
                    .flat_map(|r| to_parts(parts, r))
                    .collect()
            };
            let x_cm = moved(&x);
            assert_ne!(x, x_cm, "the layouts differ for these irreps");
            let mut y_cm = vec![1.0; n * dout];
            lin.forward_component_major(&x_cm, parts, n, &mut y_cm)
                .unwrap();
            if exact {
                assert_eq!(y, y_cm);
            } else {
                for (a, b) in y.iter().zip(&y_cm) {
                    assert!((a - b).abs() <= 1e-14 * (1.0 + a.abs()), "{a} vs {b}");
                }
            }
            let mut gx_cm = vec![1.0; n * di];
            lin.backward_component_major(&g, n, &mut gx_cm, parts)
                .unwrap();
            assert_eq!(moved(&gx), gx_cm);
        }
        let gaps = vec![(0, 5, 1), (5, 2, 3)];
        let mut y_cm = vec![0.0; n * dout];
        let err = lin
            .forward_component_major(&x, &gaps, n, &mut y_cm)
            .unwrap_err();
        assert!(err.to_string().contains("do not tile"), "{err}");
    }

    #[test]
    fn forward_matches_naive_backward_is_adjoint() {
        let ir_in = Irreps::parse("5x0e+3x1e+2x0e+2x2e+1x1o").unwrap();
        let ir_out = Irreps::parse("4x0e+2x1e+3x2e+2x3e").unwrap();
        let nw = 5 * 4 + 3 * 2 + 2 * 4 + 2 * 3;
        let w = random(nw, 1);
        let lin = IrrepsLinear::<f64>::new(&ir_in, &ir_out, &w).unwrap();
        assert!(IrrepsLinear::<f64>::new(&ir_in, &ir_out, &w[1..]).is_err());
        let n = 150;
        let x = random(n * ir_in.dim(), 2);
        let mut y = vec![7.0; n * ir_out.dim()];
        lin.forward(&x, n, &mut y).unwrap();
        for r in [0, 63, 64, 149] {
            let want = naive(
                &ir_in,
                &ir_out,
                &w,
                &x[r * ir_in.dim()..(r + 1) * ir_in.dim()],
            );
            for (c, wv) in want.iter().enumerate() {
                assert!((y[r * ir_out.dim() + c] - wv).abs() < 1e-13);
            }
        }
        // <g, L x> = <Lᵀ g, x>.
        let g = random(n * ir_out.dim(), 3);
        let mut gx = vec![0.0; n * ir_in.dim()];
        lin.backward(&g, n, &mut gx).unwrap();
        let lhs: f64 = g.iter().zip(&y).map(|(a, b)| a * b).sum();
        let rhs: f64 = gx.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-10 * lhs.abs().max(1.0));
        // The 1o input block feeds nothing: its gradient is zero.
        let off = ir_in.offsets()[4];
        assert!(gx[off..off + 3].iter().all(|v| *v == 0.0));
    }
}
