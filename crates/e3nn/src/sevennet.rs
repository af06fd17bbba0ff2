//! The pretrained SevenNet-0 potential (checkpoint "11Jul2024") on the fused
//! kernels of this crate: weight loading with sevenn's load-time fix-ups,
//! every layer's forward and hand-written backward, and a single-process
//! reference evaluation.
//!
//! Conventions: edge e goes from receiver `centers[e]` = i to sender
//! `neighbors[e]` = j with vector `r_e = r_j + S·cell − r_i` (Å); energies in
//! eV; `∂E/∂r_e` per edge is what [`evaluate`] returns.

use crate::conv::{
    radial_conv_backward, radial_conv_forward, uvu_sorted_paths, ConvGraph, ConvPaths, TpPath,
};
use crate::error::{check_len, E3nnError};
use crate::gate::Gate;
use crate::irreps::{Irreps, IrrepsLinear};
use crate::radial::{EdgeEmbedding, RadialMlp};
use crate::real::Real;
use crate::sh::{sh_backward, sh_dim, sh_forward};
use crate::wigner::wigner_3j;
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// Species of SevenNet-0 in type-index order (alphabetical by symbol), with Z.
pub const SPECIES: [(&str, u32); 89] = [
    ("Ac", 89),
    ("Ag", 47),
    ("Al", 13),
    ("Ar", 18),
    ("As", 33),
    ("Au", 79),
    ("B", 5),
    ("Ba", 56),
    ("Be", 4),
    ("Bi", 83),
    ("Br", 35),
    ("C", 6),
    ("Ca", 20),
    ("Cd", 48),
    ("Ce", 58),
    ("Cl", 17),
    ("Co", 27),
    ("Cr", 24),
    ("Cs", 55),
    ("Cu", 29),
    ("Dy", 66),
    ("Er", 68),
    ("Eu", 63),
    ("F", 9),
    ("Fe", 26),
    ("Ga", 31),
    ("Gd", 64),
    ("Ge", 32),
    ("H", 1),
    ("He", 2),
    ("Hf", 72),
    ("Hg", 80),
    ("Ho", 67),
    ("I", 53),
    ("In", 49),
    ("Ir", 77),
    ("K", 19),
    ("Kr", 36),
    ("La", 57),
    ("Li", 3),
    ("Lu", 71),
    ("Mg", 12),
    ("Mn", 25),
    ("Mo", 42),
    ("N", 7),
    ("Na", 11),
    ("Nb", 41),
    ("Nd", 60),
    ("Ne", 10),
    ("Ni", 28),
    ("Np", 93),
    ("O", 8),
    ("Os", 76),
    ("P", 15),
    ("Pa", 91),
    ("Pb", 82),
    ("Pd", 46),
    ("Pm", 61),
    ("Pr", 59),
    ("Pt", 78),
    ("Pu", 94),
    ("Rb", 37),
    ("Re", 75),
    ("Rh", 45),
    ("Ru", 44),
    ("S", 16),
    ("Sb", 51),
    ("Sc", 21),
    ("Se", 34),
    ("Si", 14),
    ("Sm", 62),
    ("Sn", 50),
    ("Sr", 38),
    ("Ta", 73),
    ("Tb", 65),
    ("Tc", 43),
    ("Te", 52),
    ("Th", 90),
    ("Ti", 22),
    ("Tl", 81),
    ("Tm", 69),
    ("U", 92),
    ("V", 23),
    ("W", 74),
    ("Xe", 54),
    ("Y", 39),
    ("Yb", 70),
    ("Zn", 30),
    ("Zr", 40),
];

/// Number of species (rows of the one-hot embedding).
pub const N_SPECIES: usize = 89;
/// Neighbour cutoff (Å).
pub const CUTOFF: f64 = 5.0;
/// Start of the XPLOR switch (Å).
pub const CUTOFF_ON: f64 = 4.5;
/// Node irreps: entry t is the input of layer t, entry t+1 its output.
pub const NODE_IRREPS: [&str; 6] = [
    "128x0e",
    "128x0e+64x1e+32x2e",
    "128x0e+64x1e+32x2e",
    "128x0e+64x1e+32x2e",
    "128x0e+64x1e+32x2e",
    "128x0e",
];
/// Degree of the edge spherical harmonics.
pub const LMAX_SH: usize = 2;
const N_LAYERS: usize = 5;
const N_BASIS: usize = 8;
const HIDDEN: usize = 64;
const FEATURES: usize = 128;

/// Type index (one-hot row) of atomic number `z`.
pub fn type_index(z: u32) -> Result<usize, E3nnError> {
    SPECIES
        .iter()
        .position(|&(_, zz)| zz == z)
        .ok_or(E3nnError::UnknownElement(z))
}

/// Type indices of a list of atomic numbers; the first unknown one is an error.
pub fn types_from_numbers(numbers: &[u32]) -> Result<Vec<usize>, E3nnError> {
    numbers.iter().map(|&z| type_index(z)).collect()
}

/// Raw weights of one interaction block, after sevenn's load-time fix-ups.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// Irreps of the block input x.
    pub irreps_in: Irreps,
    /// Irreps of the block output (after the gate).
    pub irreps_out: Irreps,
    /// Irreps of the gate input (self-connection and Linear_2 output).
    pub irreps_gate_in: Irreps,
    /// Message irreps in sorted path order (unsimplified).
    pub irreps_msg: Irreps,
    /// Flat self-connection Linear weights (x → gate_in).
    pub self_connection: Vec<f64>,
    /// Flat Linear_1 weights (x → x).
    pub linear_1: Vec<f64>,
    /// Radial MLP matrices `[8×64, 64×64, 64×W]`, (in, out) row-major; the last
    /// one with its columns in sorted path order and flipped paths negated.
    pub radial: [Vec<f64>; 3],
    /// Flat Linear_2 weights (simplified message irreps → gate_in).
    pub linear_2: Vec<f64>,
    /// Message divisor.
    pub denominator: f64,
    /// Tensor-product paths in sorted order; CG tensors are the checkpoint's
    /// (sign-fixed) buffers where it stores one, exact `wigner_3j` otherwise.
    pub paths: Vec<TpPath>,
    /// `(l1, l2, l3)` of the paths whose sign was flipped at load.
    pub flipped: Vec<(usize, usize, usize)>,
}

/// All SevenNet-0 weights as f64, independent of the evaluation precision.
#[derive(Clone, Debug)]
pub struct SevenNetWeights {
    /// Trained Bessel frequencies (1/Å), 8.
    pub bessel_freqs: Vec<f64>,
    /// One-hot Linear, 89×128 row-major (unscaled).
    pub onehot: Vec<f64>,
    /// The 5 interaction blocks.
    pub layers: Vec<LayerWeights>,
    /// Readout Linear 128→64, flat (unscaled).
    pub readout_hidden: Vec<f64>,
    /// Readout Linear 64→1, flat (unscaled).
    pub readout_energy: Vec<f64>,
    /// Per-species energy shift (eV), type-index order.
    pub shift: Vec<f64>,
    /// Per-species energy scale, type-index order.
    pub scale: Vec<f64>,
}

struct Dict<'a> {
    map: HashMap<&'a str, (&'a [usize], &'a [f32])>,
}

impl<'a> Dict<'a> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, E3nnError> {
        let (s, d) = self
            .map
            .get(name)
            .ok_or_else(|| E3nnError::Checkpoint(format!("tensor {name:?} is missing")))?;
        let numel: usize = shape.iter().product();
        let same = *s == shape
            || (s.iter().product::<usize>() == numel && s.len() <= 1 && shape.len() <= 1);
        if !same || d.len() != numel {
            return Err(E3nnError::Checkpoint(format!(
                "tensor {name:?} has shape {s:?} ({} values), SevenNet-0 needs {shape:?}",
                d.len()
            )));
        }
        Ok(d.iter().map(|&v| v as f64).collect())
    }
    fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f64>>, E3nnError> {
        if self.map.contains_key(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// `|a − b| ≤ atol + rtol·|b|` everywhere (torch.allclose).
fn allclose(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-8 + 1e-5 * y.abs())
}

/// Gate-input irreps and gate layout for an output irreps list: scalars, one
/// gate scalar per non-scalar copy, then the gated blocks.
fn gate_layout(out: &Irreps) -> (Irreps, Gate) {
    let n_scalars: usize = out
        .blocks
        .iter()
        .filter(|b| b.ir.l == 0)
        .map(|b| b.mul)
        .sum();
    let gated: Vec<(usize, usize)> = out
        .blocks
        .iter()
        .filter(|b| b.ir.l > 0)
        .map(|b| (b.mul, b.ir.l))
        .collect();
    let gate = Gate { n_scalars, gated };
    let mut s = format!("{}x0e", n_scalars + gate.n_gates());
    for &(m, l) in &gate.gated {
        s.push_str(&format!("+{m}x{l}e"));
    }
    // The string is built from valid parts, so parsing cannot fail.
    (Irreps::parse(&s).unwrap_or_default(), gate)
}

impl SevenNetWeights {
    /// Builds the weights from a state dict given as `(name, shape, values)`
    /// (row-major, strides already applied), applying sevenn's fix-ups for
    /// this pre-0.11 checkpoint: the last radial-MLP layer's columns are
    /// permuted from creation to sorted path order, and paths whose stored
    /// `_w3j_*` buffer equals −wigner_3j get their columns and CG negated.
    /// Missing tensors or other shapes are reported as
    /// [`E3nnError::Checkpoint`].
    pub fn from_state_dict(entries: &[(String, Vec<usize>, Vec<f32>)]) -> Result<Self, E3nnError> {
        let dict = Dict {
            map: entries
                .iter()
                .map(|(n, s, d)| (n.as_str(), (s.as_slice(), d.as_slice())))
                .collect(),
        };
        let bessel_freqs = dict.get("edge_embedding.basis_function.coeffs", &[N_BASIS])?;
        let onehot = dict.get("onehot_to_feature_x.linear.weight", &[N_SPECIES * FEATURES])?;
        let mut layers = Vec::with_capacity(N_LAYERS);
        for t in 0..N_LAYERS {
            layers.push(Self::layer(&dict, t)?);
        }
        let readout_hidden = dict.get("reduce_input_to_hidden.linear.weight", &[FEATURES * 64])?;
        let readout_energy = dict.get("reduce_hidden_to_energy.linear.weight", &[64])?;
        let shift = dict.get("rescale_atomic_energy.shift", &[N_SPECIES])?;
        let scale = dict.get("rescale_atomic_energy.scale", &[N_SPECIES])?;
        Ok(Self {
            bessel_freqs,
            onehot,
            layers,
            readout_hidden,
            readout_energy,
            shift,
            scale,
        })
    }

    /// Reads a SevenNet-0 checkpoint file (`checkpoint_sevennet_0.pth`) and
    /// builds the weights as [`SevenNetWeights::from_state_dict`] does. When
    /// the config holds `_type_map`, it must agree with [`SPECIES`].
    pub fn from_checkpoint(path: impl AsRef<std::path::Path>) -> Result<Self, E3nnError> {
        let ckpt = ddmlip_checkpoint::load(path)?;
        if let Ok(map) = ckpt.config_int_map("_type_map") {
            for (z, idx) in map {
                let ours = u32::try_from(z).ok().and_then(|z| type_index(z).ok());
                if ours != usize::try_from(idx).ok() {
                    return Err(E3nnError::Checkpoint(format!(
                        "config _type_map sends Z={z} to {idx}, SevenNet-0 uses {ours:?}"
                    )));
                }
            }
        }
        let entries: Vec<(String, Vec<usize>, Vec<f32>)> = ckpt
            .state_dict()?
            .into_iter()
            .map(|(name, t)| (name, t.shape, t.data))
            .collect();
        Self::from_state_dict(&entries)
    }

    fn layer(dict: &Dict, t: usize) -> Result<LayerWeights, E3nnError> {
        let parse = |s: &str| Irreps::parse(s);
        let irreps_in = parse(NODE_IRREPS[t])?;
        let irreps_out = parse(NODE_IRREPS[t + 1])?;
        let (irreps_gate_in, _) = gate_layout(&irreps_out);
        let lmax_out = irreps_out.lmax();
        let prefix = format!("{t}_convolution");
        let buffer_name = |l1: usize, l2: usize, l3: usize| {
            format!("{prefix}.convolution._compiled_main_left_right._w3j_{l1}_{l2}_{l3}")
        };
        // CG per path: the stored buffer (sign-fixed) when the checkpoint has
        // one (paths with every l > 0), exact wigner_3j otherwise.
        let mut flipped = Vec::new();
        let mut signs = Vec::new();
        let (paths, irreps_msg, order) = uvu_sorted_paths(
            &irreps_in,
            LMAX_SH,
            |_| 1,
            |l| l <= lmax_out,
            |l1, l2, l3| {
                let exact = wigner_3j(l1, l2, l3)?;
                let shape = [2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1];
                let stored = if l1 > 0 && l2 > 0 && l3 > 0 {
                    dict.opt(&buffer_name(l1, l2, l3), &shape)?
                } else {
                    None
                };
                let Some(stored) = stored else {
                    signs.push(1.0);
                    return Ok(exact);
                };
                if allclose(&stored, &exact) {
                    signs.push(1.0);
                    return Ok(stored);
                }
                let neg: Vec<f64> = stored.iter().map(|v| -v).collect();
                if allclose(&neg, &exact) {
                    signs.push(-1.0);
                    flipped.push((l1, l2, l3));
                    Ok(neg)
                } else {
                    Err(E3nnError::Checkpoint(format!(
                        "{} matches neither +wigner_3j nor -wigner_3j",
                        buffer_name(l1, l2, l3)
                    )))
                }
            },
        )?;
        let w_total: usize = paths.iter().map(|p| p.mul).sum();
        // Stored columns are in creation order; move them to sorted order.
        let raw2 = dict.get(
            &format!("{prefix}.weight_nn.layer2.weight"),
            &[HIDDEN, w_total],
        )?;
        let mut creation_offset = vec![0usize; order.len()];
        {
            let mut muls = vec![0usize; order.len()];
            for (pos, &k) in order.iter().enumerate() {
                muls[k] = paths[pos].mul;
            }
            let mut acc = 0;
            for k in 0..order.len() {
                creation_offset[k] = acc;
                acc += muls[k];
            }
        }
        let mut layer2 = vec![0.0; HIDDEN * w_total];
        for (pos, &k) in order.iter().enumerate() {
            let p = &paths[pos];
            for row in 0..HIDDEN {
                for u in 0..p.mul {
                    layer2[row * w_total + p.weight_offset + u] =
                        signs[pos] * raw2[row * w_total + creation_offset[k] + u];
                }
            }
        }
        let msg_simple = irreps_msg.simplify();
        let n_lin = |a: &Irreps, b: &Irreps| -> usize {
            a.blocks
                .iter()
                .map(|x| {
                    b.blocks
                        .iter()
                        .filter(|y| y.ir == x.ir)
                        .map(|y| x.mul * y.mul)
                        .sum::<usize>()
                })
                .sum()
        };
        let denominator = dict.get(&format!("{prefix}.denominator"), &[1])?[0];
        Ok(LayerWeights {
            self_connection: dict.get(
                &format!("{t}_self_connection_intro.linear.weight"),
                &[n_lin(&irreps_in, &irreps_gate_in)],
            )?,
            linear_1: dict.get(
                &format!("{t}_self_interaction_1.linear.weight"),
                &[n_lin(&irreps_in, &irreps_in)],
            )?,
            radial: [
                dict.get(
                    &format!("{prefix}.weight_nn.layer0.weight"),
                    &[N_BASIS, HIDDEN],
                )?,
                dict.get(
                    &format!("{prefix}.weight_nn.layer1.weight"),
                    &[HIDDEN, HIDDEN],
                )?,
                layer2,
            ],
            linear_2: dict.get(
                &format!("{t}_self_interaction_2.linear.weight"),
                &[n_lin(&msg_simple, &irreps_gate_in)],
            )?,
            denominator,
            irreps_in,
            irreps_out,
            irreps_gate_in,
            irreps_msg,
            paths,
            flipped,
        })
    }
}

/// One interaction block's kernels in precision `T`.
#[derive(Clone, Debug)]
pub struct InteractionBlock<T> {
    /// sc = Linear(x), x → gate_in.
    pub self_connection: IrrepsLinear<T>,
    /// h = Linear_1(x), x → x.
    pub linear_1: IrrepsLinear<T>,
    /// Per-edge TP weights from the radial embedding.
    pub radial: RadialMlp<T>,
    /// Tensor-product paths of the convolution.
    pub conv: ConvPaths<T>,
    /// Message divisor.
    pub denominator: f64,
    /// y = Linear_2(A) + sc, simplified message irreps → gate_in.
    pub linear_2: IrrepsLinear<T>,
    /// Gate producing the block output.
    pub gate: Gate,
}

/// Values of a block's forward that its backward needs.
#[derive(Clone, Debug)]
pub struct BlockCache<T> {
    /// Linear_1 output (N × dim_x_in), the features the convolution reads.
    pub h: Vec<T>,
    /// Gate input (N × dim_gate_in).
    pub y: Vec<T>,
}

/// Wall time spent per kind of work (seconds), for profiling.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Edge embedding and spherical harmonics, forward and backward.
    pub edge_features: f64,
    /// Radial MLP GEMMs run on their own. The blocks run the radial MLP
    /// inside the fused convolution kernels, so it is counted under `conv`.
    pub radial_mlp: f64,
    /// Tensor-product convolution forward and backward (with the fused radial MLP).
    pub conv: f64,
    /// Linears (self-connection, Linear_1, Linear_2, readout), forward and backward.
    pub linear: f64,
    /// Gates and the rest.
    pub other: f64,
}

fn timed<R>(slot: &mut f64, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    *slot += t.elapsed().as_secs_f64();
    r
}

impl<T: Real> InteractionBlock<T> {
    fn new(w: &LayerWeights) -> Result<Self, E3nnError> {
        let dim_w: usize = w.paths.iter().map(|p| p.mul).sum();
        let (_, gate) = gate_layout(&w.irreps_out);
        Ok(Self {
            self_connection: IrrepsLinear::new(
                &w.irreps_in,
                &w.irreps_gate_in,
                &w.self_connection,
            )?,
            linear_1: IrrepsLinear::new(&w.irreps_in, &w.irreps_in, &w.linear_1)?,
            radial: RadialMlp::new(&[N_BASIS, HIDDEN, HIDDEN, dim_w], &w.radial)?,
            conv: ConvPaths::new(
                w.irreps_in.dim(),
                LMAX_SH,
                dim_w,
                w.irreps_msg.dim(),
                w.paths.clone(),
            )?,
            denominator: w.denominator,
            linear_2: IrrepsLinear::new(&w.irreps_msg.simplify(), &w.irreps_gate_in, &w.linear_2)?,
            gate,
        })
    }

    /// Width of the block input rows.
    pub fn dim_in(&self) -> usize {
        self.linear_1.irreps_in().dim()
    }
    /// Width of the block output rows.
    pub fn dim_out(&self) -> usize {
        self.gate.dim_out()
    }

    /// Forward over `graph.n_rows()` rows: `x` (N × dim_in), `emb` (E × 8),
    /// `sh` (E × 9). Returns the block output (N × dim_out) and its cache.
    pub fn forward(
        &self,
        graph: &ConvGraph,
        x: &[T],
        emb: &[T],
        sh: &[T],
    ) -> Result<(Vec<T>, BlockCache<T>), E3nnError> {
        self.forward_timed(graph, x, emb, sh, &mut Timings::default())
    }

    fn forward_timed(
        &self,
        graph: &ConvGraph,
        x: &[T],
        emb: &[T],
        sh: &[T],
        tm: &mut Timings,
    ) -> Result<(Vec<T>, BlockCache<T>), E3nnError> {
        let n = graph.n_rows();
        let dg = self.gate.dim_in();
        let mut sc = vec![T::ZERO; n * dg];
        let mut h = vec![T::ZERO; n * self.dim_in()];
        timed(&mut tm.linear, || -> Result<(), E3nnError> {
            self.self_connection.forward(x, n, &mut sc)?;
            self.linear_1.forward(x, n, &mut h)
        })?;
        let mut a = vec![T::ZERO; n * self.conv.dim_msg()];
        // The radial MLP runs inside the fused kernel, so its time counts as conv.
        timed(&mut tm.conv, || {
            radial_conv_forward(
                &self.conv,
                &self.radial,
                self.denominator,
                graph,
                &h,
                emb,
                sh,
                &mut a,
            )
        })?;
        let mut y = vec![T::ZERO; n * dg];
        timed(&mut tm.linear, || self.linear_2.forward(&a, n, &mut y))?;
        let mut out = vec![T::ZERO; n * self.dim_out()];
        timed(&mut tm.other, || -> Result<(), E3nnError> {
            y.par_iter_mut()
                .zip(sc.par_iter())
                .for_each(|(v, s)| *v += *s);
            self.gate.forward(&y, n, &mut out)
        })?;
        Ok((out, BlockCache { h, y }))
    }

    /// Backward: from `grad_out` (N × dim_out) returns the gradient w.r.t. the
    /// block input (N × dim_in) and **adds** into `grad_emb` (E × 8) and
    /// `grad_sh` (E × 9). Recomputes the radial MLP instead of storing it.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        graph: &ConvGraph,
        emb: &[T],
        sh: &[T],
        cache: &BlockCache<T>,
        grad_out: &[T],
        grad_emb: &mut [T],
        grad_sh: &mut [T],
    ) -> Result<Vec<T>, E3nnError> {
        self.backward_timed(
            graph,
            emb,
            sh,
            cache,
            grad_out,
            grad_emb,
            grad_sh,
            &mut Timings::default(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_timed(
        &self,
        graph: &ConvGraph,
        emb: &[T],
        sh: &[T],
        cache: &BlockCache<T>,
        grad_out: &[T],
        grad_emb: &mut [T],
        grad_sh: &mut [T],
        tm: &mut Timings,
    ) -> Result<Vec<T>, E3nnError> {
        let (n, ne) = (graph.n_rows(), graph.n_edges());
        let (dg, di) = (self.gate.dim_in(), self.dim_in());
        check_len("block grad_emb", ne * N_BASIS, grad_emb.len())?;
        check_len("block grad_sh", ne * sh_dim(LMAX_SH), grad_sh.len())?;
        let mut gy = vec![T::ZERO; n * dg];
        timed(&mut tm.other, || {
            self.gate.backward(&cache.y, grad_out, n, &mut gy)
        })?;
        let mut ga = vec![T::ZERO; n * self.conv.dim_msg()];
        timed(&mut tm.linear, || self.linear_2.backward(&gy, n, &mut ga))?;
        let mut gh = vec![T::ZERO; n * di];
        let mut gsh = vec![T::ZERO; grad_sh.len()];
        let mut gemb = vec![T::ZERO; grad_emb.len()];
        timed(&mut tm.conv, || {
            radial_conv_backward(
                &self.conv,
                &self.radial,
                self.denominator,
                graph,
                &cache.h,
                emb,
                sh,
                &ga,
                &mut gh,
                &mut gemb,
                &mut gsh,
            )
        })?;
        timed(&mut tm.other, || {
            grad_emb
                .par_iter_mut()
                .zip(gemb.par_iter())
                .for_each(|(a, b)| *a += *b);
            grad_sh
                .par_iter_mut()
                .zip(gsh.par_iter())
                .for_each(|(a, b)| *a += *b);
        });
        let mut gx = vec![T::ZERO; n * di];
        let mut gx_sc = vec![T::ZERO; n * di];
        timed(&mut tm.linear, || -> Result<(), E3nnError> {
            self.linear_1.backward(&gh, n, &mut gx)?;
            self.self_connection.backward(&gy, n, &mut gx_sc)
        })?;
        gx.par_iter_mut()
            .zip(gx_sc.par_iter())
            .for_each(|(a, b)| *a += *b);
        Ok(gx)
    }
}

/// SevenNet-0 in precision `T`.
#[derive(Clone, Debug)]
pub struct SevenNet<T> {
    /// Radial embedding (trained Bessel frequencies, XPLOR switch).
    pub embedding: EdgeEmbedding,
    /// One-hot Linear rows, 89 × 128, already scaled by 1/√89.
    onehot: Vec<T>,
    /// The 5 interaction blocks.
    pub blocks: Vec<InteractionBlock<T>>,
    /// Readout Linear 128 → 64.
    pub readout_hidden: IrrepsLinear<T>,
    /// Readout Linear 64 → 1.
    pub readout_energy: IrrepsLinear<T>,
    shift: Vec<T>,
    scale: Vec<T>,
}

/// Edge inputs of the network: lengths, radial embedding and SH.
#[derive(Clone, Debug)]
pub struct EdgeFeatures<T> {
    /// |r_e| (Å), E.
    pub lengths: Vec<T>,
    /// Radial embedding, E × 8.
    pub emb: Vec<T>,
    /// Spherical harmonics l ≤ 2, E × 9.
    pub sh: Vec<T>,
}

impl<T: Real> SevenNet<T> {
    /// Builds the kernels from the loaded weights.
    pub fn new(w: &SevenNetWeights) -> Result<Self, E3nnError> {
        let s = 1.0 / (N_SPECIES as f64).sqrt();
        let scalars = |n: usize| Irreps::parse(&format!("{n}x0e"));
        Ok(Self {
            embedding: EdgeEmbedding {
                freqs: w.bessel_freqs.clone(),
                cutoff: CUTOFF,
                cutoff_on: CUTOFF_ON,
            },
            onehot: w.onehot.iter().map(|&v| T::from_f64(v * s)).collect(),
            blocks: w
                .layers
                .iter()
                .map(InteractionBlock::new)
                .collect::<Result<_, _>>()?,
            readout_hidden: IrrepsLinear::new(
                &scalars(FEATURES)?,
                &scalars(64)?,
                &w.readout_hidden,
            )?,
            readout_energy: IrrepsLinear::new(&scalars(64)?, &scalars(1)?, &w.readout_energy)?,
            shift: w.shift.iter().map(|&v| T::from_f64(v)).collect(),
            scale: w.scale.iter().map(|&v| T::from_f64(v)).collect(),
        })
    }

    /// Cutoff radius of the neighbour list (Å).
    pub fn cutoff(&self) -> f64 {
        CUTOFF
    }

    /// Lengths, radial embedding and SH of the edge vectors (Å).
    pub fn edge_features(&self, vectors: &[[T; 3]]) -> Result<EdgeFeatures<T>, E3nnError> {
        let ne = vectors.len();
        let lengths: Vec<T> = vectors
            .par_iter()
            .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            .collect();
        let mut emb = vec![T::ZERO; ne * N_BASIS];
        self.embedding.forward(&lengths, &mut emb)?;
        let mut sh = vec![T::ZERO; ne * sh_dim(LMAX_SH)];
        sh_forward(vectors, LMAX_SH, &mut sh)?;
        Ok(EdgeFeatures { lengths, emb, sh })
    }

    /// Gradient w.r.t. the edge vectors (E, overwritten into a new vector)
    /// from gradients w.r.t. the embedding (E × 8) and SH (E × 9).
    pub fn edge_features_backward(
        &self,
        vectors: &[[T; 3]],
        feats: &EdgeFeatures<T>,
        grad_emb: &[T],
        grad_sh: &[T],
    ) -> Result<Vec<[T; 3]>, E3nnError> {
        let ne = vectors.len();
        let mut g_len = vec![T::ZERO; ne];
        self.embedding
            .backward(&feats.lengths, grad_emb, &mut g_len)?;
        let mut grad: Vec<[T; 3]> = vectors
            .par_iter()
            .zip(feats.lengths.par_iter())
            .zip(g_len.par_iter())
            .map(|((v, &r), &g)| [g * v[0] / r, g * v[1] / r, g * v[2] / r])
            .collect();
        sh_backward(vectors, LMAX_SH, grad_sh, &mut grad)?;
        Ok(grad)
    }

    /// Initial node features x⁰ (N × 128) from type indices (< 89).
    pub fn initial_features(&self, types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let mut x = vec![T::ZERO; types.len() * FEATURES];
        for (row, &t) in x.chunks_mut(FEATURES).zip(types) {
            if t >= N_SPECIES {
                return Err(E3nnError::Index {
                    what: "types",
                    position: 0,
                    index: t,
                    n_rows: N_SPECIES,
                });
            }
            row.copy_from_slice(&self.onehot[t * FEATURES..(t + 1) * FEATURES]);
        }
        Ok(x)
    }

    /// Atomic energies E_i = scale·e_i + shift (eV) from the last block's
    /// output x (N × 128).
    pub fn readout(&self, x: &[T], types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let n = types.len();
        let mut q = vec![T::ZERO; n * 64];
        self.readout_hidden.forward(x, n, &mut q)?;
        let mut e = vec![T::ZERO; n];
        self.readout_energy.forward(&q, n, &mut e)?;
        for (v, &t) in e.iter_mut().zip(types) {
            let t = t.min(N_SPECIES - 1);
            *v = self.scale[t] * *v + self.shift[t];
        }
        Ok(e)
    }

    /// Gradient of Σ_i grad_e\[i\]·E_i w.r.t. the last block's output (N × 128).
    pub fn readout_backward(&self, grad_e: &[T], types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let n = types.len();
        check_len("readout grad_e", n, grad_e.len())?;
        let ge: Vec<T> = grad_e
            .iter()
            .zip(types)
            .map(|(&g, &t)| g * self.scale[t.min(N_SPECIES - 1)])
            .collect();
        let mut gq = vec![T::ZERO; n * 64];
        self.readout_energy.backward(&ge, n, &mut gq)?;
        let mut gx = vec![T::ZERO; n * FEATURES];
        self.readout_hidden.backward(&gq, n, &mut gx)?;
        Ok(gx)
    }
}

/// Output of [`evaluate`].
#[derive(Clone, Debug)]
pub struct Evaluation<T> {
    /// Per-atom energies E_i (eV), one per row.
    pub atomic_energies: Vec<T>,
    /// ∂(Σ_i E_i)/∂r_e (eV/Å), one per edge.
    pub edge_gradients: Vec<[T; 3]>,
    /// Where the time went.
    pub timings: Timings,
}

/// Single-process reference evaluation: forward and backward through all 5
/// layers. `types` are type indices (see [`types_from_numbers`]), one per
/// row; edges are `(centers[e] ← neighbors[e])` with vectors `r_e` (Å), all
/// within the cutoff. Every row's energy counts towards the gradient.
pub fn evaluate<T: Real>(
    model: &SevenNet<T>,
    types: &[usize],
    centers: &[u32],
    neighbors: &[u32],
    vectors: &[[T; 3]],
) -> Result<Evaluation<T>, E3nnError> {
    let n = types.len();
    if let Some((position, &t)) = types.iter().enumerate().find(|(_, &t)| t >= N_SPECIES) {
        return Err(E3nnError::Index {
            what: "types",
            position,
            index: t,
            n_rows: N_SPECIES,
        });
    }
    check_len("edge vectors", centers.len(), vectors.len())?;
    let graph = ConvGraph::new(n, centers, neighbors)?;
    let mut tm = Timings::default();
    let feats = timed(&mut tm.edge_features, || model.edge_features(vectors))?;
    let mut x = model.initial_features(types)?;
    let mut caches = Vec::with_capacity(model.blocks.len());
    let mut inputs_dims = Vec::new();
    for block in &model.blocks {
        let (out, cache) = block.forward_timed(&graph, &x, &feats.emb, &feats.sh, &mut tm)?;
        inputs_dims.push(block.dim_in());
        caches.push(cache);
        x = out;
    }
    let energies = timed(&mut tm.linear, || model.readout(&x, types))?;
    // Backward of Σ_i E_i.
    let ones = vec![T::ONE; n];
    let mut gx = timed(&mut tm.linear, || model.readout_backward(&ones, types))?;
    let ne = centers.len();
    let mut grad_emb = vec![T::ZERO; ne * N_BASIS];
    let mut grad_sh = vec![T::ZERO; ne * sh_dim(LMAX_SH)];
    for (block, cache) in model.blocks.iter().zip(&caches).rev() {
        gx = block.backward_timed(
            &graph,
            &feats.emb,
            &feats.sh,
            cache,
            &gx,
            &mut grad_emb,
            &mut grad_sh,
            &mut tm,
        )?;
    }
    let edge_gradients = timed(&mut tm.edge_features, || {
        model.edge_features_backward(vectors, &feats, &grad_emb, &grad_sh)
    })?;
    Ok(Evaluation {
        atomic_energies: energies,
        edge_gradients,
        timings: tm,
    })
}

/// Forces `F_i = Σ_{e: center=i} g_e − Σ_{e: neighbor=i} g_e` (eV/Å) from
/// the edge gradients `g_e = ∂E/∂r_e`, accumulated in f64 over `n_atoms` rows.
pub fn forces_from_edge_gradients<T: Real>(
    n_atoms: usize,
    centers: &[u32],
    neighbors: &[u32],
    grads: &[[T; 3]],
) -> Result<Vec<[f64; 3]>, E3nnError> {
    check_len("neighbors", centers.len(), neighbors.len())?;
    check_len("edge gradients", centers.len(), grads.len())?;
    let mut f = vec![[0.0f64; 3]; n_atoms];
    for (e, g) in grads.iter().enumerate() {
        let (i, j) = (centers[e] as usize, neighbors[e] as usize);
        if i >= n_atoms || j >= n_atoms {
            return Err(E3nnError::Index {
                what: "centers/neighbors",
                position: e,
                index: i.max(j),
                n_rows: n_atoms,
            });
        }
        for k in 0..3 {
            f[i][k] += g[k].to_f64();
            f[j][k] -= g[k].to_f64();
        }
    }
    Ok(f)
}

/// Virial `W_ab = Σ_e r_{e,a} g_{e,b}` as ASE-ordered Voigt components
/// (xx, yy, zz, yz, zx, xy) with sevenn's off-diagonal choice
/// (yz = Σ r_y g_z, "xz" = Σ r_z g_x, xy = Σ r_x g_y), in eV.
pub fn virial_from_edge_gradients<T: Real>(
    vectors: &[[T; 3]],
    grads: &[[T; 3]],
) -> Result<[f64; 6], E3nnError> {
    check_len("edge gradients", vectors.len(), grads.len())?;
    let mut w = [0.0f64; 6];
    for (r, g) in vectors.iter().zip(grads) {
        let (r, g) = (
            [r[0].to_f64(), r[1].to_f64(), r[2].to_f64()],
            [g[0].to_f64(), g[1].to_f64(), g[2].to_f64()],
        );
        w[0] += r[0] * g[0];
        w[1] += r[1] * g[1];
        w[2] += r[2] * g[2];
        w[3] += r[1] * g[2];
        w[4] += r[2] * g[0];
        w[5] += r[0] * g[1];
    }
    Ok(w)
}

/// ASE stress (eV/Å³, Voigt xx yy zz yz xz xy, positive = tensile) = W / V,
/// with V floored at 1e-3 Å³ as sevenn does.
pub fn stress_from_virial(virial: &[f64; 6], volume: f64) -> [f64; 6] {
    let v = volume.abs().max(1e-3);
    virial.map(|w| w / v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_map_is_alphabetical_and_complete() {
        let syms: Vec<&str> = SPECIES.iter().map(|s| s.0).collect();
        let mut sorted = syms.clone();
        sorted.sort();
        assert_eq!(syms, sorted);
        assert_eq!(type_index(14).unwrap(), 69);
        assert_eq!(type_index(89).unwrap(), 0);
        assert_eq!(type_index(40).unwrap(), 88);
        assert_eq!(type_index(1).unwrap(), 28);
        let err = type_index(118).unwrap_err().to_string();
        assert!(err.contains("118"), "{err}");
    }

    #[test]
    fn gate_layout_matches_guide() {
        let (g, gate) = gate_layout(&Irreps::parse(NODE_IRREPS[1]).unwrap());
        assert_eq!(g.to_string(), "224x0e+64x1e+32x2e");
        assert_eq!(gate.dim_in(), 576);
        assert_eq!(gate.dim_out(), 480);
        let (g, _) = gate_layout(&Irreps::parse("128x0e").unwrap());
        assert_eq!(g.to_string(), "128x0e");
    }
}
