//! SevenNet potentials on the fused kernels of this crate: weight loading
//! for any checkpoint whose architecture [`SevenNetConfig`] accepts (the
//! wheel's SevenNet-0 11Jul2024 and 22May2024, SevenNet-l3i5 and the
//! multi-fidelity SevenNet-MF-0 among them) with sevenn's load-time fix-ups,
//! every layer's forward and hand-written backward, and a single-process
//! reference evaluation.
//!
//! Conventions: edge e goes from receiver `centers[e]` = i to sender
//! `neighbors[e]` = j with vector `r_e = r_j + S·cell − r_i` (Å); energies in
//! eV; `∂E/∂r_e` per edge is what [`evaluate`] returns.

use crate::affine::AffineLinear;
use crate::conv::{
    radial_conv_backward, radial_conv_forward, uvu_sorted_paths, ConvGraph, ConvPaths, TpPath,
};
use crate::error::{check_len, E3nnError};
use crate::gate::Gate;
use crate::irreps::{Irrep, Irreps, IrrepsLinear, MulIr};
use crate::radial::{EdgeEmbedding, RadialMlp};
use crate::real::Real;
pub use crate::sevennet_config::{ModalInputs, SevenNetConfig};
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
/// Degree of SevenNet-0's edge spherical harmonics.
pub const LMAX_SH: usize = 2;

/// SevenNet-0's type index (one-hot row) of atomic number `z`.
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
    /// Flat Linear_1 weights (x [+ modality one-hot] → x).
    pub linear_1: Vec<f64>,
    /// Radial MLP matrices `[n_basis×h₁, …, h_k×W]`, (in, out) row-major; the
    /// last one with its columns in sorted path order and flipped paths negated.
    pub radial: Vec<Vec<f64>>,
    /// Flat Linear_2 weights (simplified message irreps [+ modality one-hot] → gate_in).
    pub linear_2: Vec<f64>,
    /// Message divisor.
    pub denominator: f64,
    /// Tensor-product paths in sorted order; CG tensors are the checkpoint's
    /// (sign-fixed) buffers where it stores one, exact `wigner_3j` otherwise.
    pub paths: Vec<TpPath>,
    /// `(l1, l2, l3)` of the paths whose sign was flipped at load.
    pub flipped: Vec<(usize, usize, usize)>,
}

/// All weights of a SevenNet checkpoint as f64, independent of the
/// evaluation precision and of the modality chosen later.
#[derive(Clone, Debug)]
pub struct SevenNetWeights {
    /// The architecture.
    pub config: SevenNetConfig,
    /// Bessel frequencies (1/Å), `n_basis`.
    pub bessel_freqs: Vec<f64>,
    /// Flat species-embedding Linear (`n_species x 0e` [+ modalities] → first node irreps).
    pub onehot: Vec<f64>,
    /// The interaction blocks.
    pub layers: Vec<LayerWeights>,
    /// Readout Linear, last node irreps [+ modalities] → `dim/2 x 0e`, flat (unscaled).
    pub readout_hidden: Vec<f64>,
    /// Readout Linear `dim/2 x 0e` → `1x0e`, flat (unscaled).
    pub readout_energy: Vec<f64>,
    /// Energy shift (eV) per type index: one row, or one row per modality.
    pub shift: Vec<Vec<f64>>,
    /// Energy scale per type index: one row, or one row per modality.
    pub scale: Vec<Vec<f64>>,
}

struct Dict<'a> {
    map: HashMap<&'a str, (&'a [usize], &'a [f32])>,
}

impl<'a> Dict<'a> {
    fn raw(&self, name: &str) -> Result<(&'a [usize], &'a [f32]), E3nnError> {
        self.map
            .get(name)
            .copied()
            .ok_or_else(|| E3nnError::Checkpoint(format!("tensor {name:?} is missing")))
    }
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, E3nnError> {
        let (s, d) = self.raw(name)?;
        let numel: usize = shape.iter().product();
        let same = s == shape
            || (s.iter().product::<usize>() == numel && s.len() <= 1 && shape.len() <= 1);
        if !same || d.len() != numel {
            return Err(E3nnError::Checkpoint(format!(
                "tensor {name:?} has shape {s:?} ({} values), the config needs {shape:?}",
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
    /// A shift or scale tensor as rows of `n_types`: a scalar broadcasts, a
    /// vector is one row, a matrix one row per modality (when `per_modal`).
    fn rescale(
        &self,
        name: &str,
        n_types: usize,
        n_modals: usize,
        per_modal: bool,
    ) -> Result<Vec<Vec<f64>>, E3nnError> {
        let (s, d) = self.raw(name)?;
        let v: Vec<f64> = d.iter().map(|&x| x as f64).collect();
        let bad = || {
            E3nnError::Checkpoint(format!(
                "tensor {name:?} has shape {s:?}; expected (), (1,), ({n_types},){}",
                if per_modal {
                    format!(" or ({n_modals}, {n_types})")
                } else {
                    String::new()
                }
            ))
        };
        match (s.len(), v.len()) {
            (0 | 1, 1) => Ok(vec![vec![v[0]; n_types]]),
            (1, n) if n == n_types && !per_modal => Ok(vec![v]),
            (2, _) if per_modal && s[0] == n_modals && s[1] == n_types => {
                Ok(v.chunks(n_types).map(<[f64]>::to_vec).collect())
            }
            (1, n) if per_modal && n == n_modals => {
                Ok(v.iter().map(|&x| vec![x; n_types]).collect())
            }
            _ => Err(bad()),
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

/// Number of weights of an e3nn Linear `a → b` (pairs of equal irreps).
fn linear_numel(a: &Irreps, b: &Irreps) -> usize {
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
}

/// `irreps` with `n` extra scalars appended as their own block when
/// `extra` (sevenn's modality inputs).
fn with_modal_inputs(irreps: &Irreps, n: usize, extra: bool) -> Irreps {
    let mut out = irreps.clone();
    if extra {
        out.blocks.push(MulIr {
            mul: n,
            ir: Irrep { l: 0, p: 1 },
        });
    }
    out
}

/// sevenn ≤ 0.9 module names (`map_old_model`) → current names.
fn current_tensor_name(name: &str) -> String {
    let (head, rest) = name.split_once('.').unwrap_or((name, ""));
    let rest = rest.replace("denumerator", "denominator");
    let head = match head {
        "EdgeEmbedding" => "edge_embedding".to_string(),
        "reducing nn input to hidden" => "reduce_input_to_hidden".to_string(),
        "reducing nn hidden to energy" => "reduce_hidden_to_energy".to_string(),
        "rescale atomic energy" => "rescale_atomic_energy".to_string(),
        h => {
            let mut out = h.to_string();
            for kind in [
                "self connection intro",
                "convolution",
                "self interaction 2",
                "equivariant gate",
            ] {
                if let Some(t) = h.strip_suffix(&format!(" {kind}")) {
                    if t.len() == 1 && t.chars().all(|c| c.is_ascii_digit()) {
                        out = format!("{t}_{}", kind.replace(' ', "_"));
                    }
                }
            }
            out
        }
    };
    if rest.is_empty() {
        head
    } else {
        format!("{head}.{rest}")
    }
}

impl SevenNetWeights {
    /// Builds SevenNet-0's weights from a state dict given as `(name,
    /// shape, values)` (row-major, strides already applied); see
    /// [`SevenNetWeights::from_parts`].
    pub fn from_state_dict(entries: &[(String, Vec<usize>, Vec<f32>)]) -> Result<Self, E3nnError> {
        Self::from_parts(SevenNetConfig::sevennet_0(), entries)
    }

    /// Builds the weights of the architecture `config` from a state dict,
    /// applying sevenn's fix-ups for checkpoints written before 0.11: the
    /// last radial-MLP layer's columns are permuted from creation to sorted
    /// path order, and paths whose stored `_w3j_*` buffer equals −wigner_3j
    /// get their columns and CG negated. Missing tensors or other shapes are
    /// reported as [`E3nnError::Checkpoint`].
    pub fn from_parts(
        config: SevenNetConfig,
        entries: &[(String, Vec<usize>, Vec<f32>)],
    ) -> Result<Self, E3nnError> {
        let renamed: Vec<(String, &[usize], &[f32])> = entries
            .iter()
            .map(|(n, s, d)| (current_tensor_name(n), s.as_slice(), d.as_slice()))
            .collect();
        let dict = Dict {
            map: renamed
                .iter()
                .map(|(n, s, d)| (n.as_str(), (*s, *d)))
                .collect(),
        };
        let c = &config;
        let n_types = c.species.len();
        let n_modals = c.modals.len();
        let bessel_freqs = if c.trainable_bessel {
            dict.get("edge_embedding.basis_function.coeffs", &[c.n_basis])?
        } else {
            // torch.FloatTensor([n·π/r_c]): float32-rounded.
            (1..=c.n_basis)
                .map(|n| (n as f64 * std::f64::consts::PI / c.cutoff) as f32 as f64)
                .collect()
        };
        let onehot_in = with_modal_inputs(
            &Irreps::parse(&format!("{n_types}x0e"))?,
            n_modals,
            c.modal_inputs.node_embedding,
        );
        let onehot = dict.get(
            "onehot_to_feature_x.linear.weight",
            &[linear_numel(&onehot_in, &c.node_irreps[0])],
        )?;
        let mut layers = Vec::with_capacity(c.n_layers());
        for t in 0..c.n_layers() {
            layers.push(Self::layer(&dict, c, t)?);
        }
        let last = &c.node_irreps[c.n_layers()];
        let hidden = Irreps::parse(&format!("{}x0e", last.dim() / 2))?;
        let readout_in = with_modal_inputs(last, n_modals, c.modal_inputs.output_block);
        let readout_hidden = dict.get(
            "reduce_input_to_hidden.linear.weight",
            &[linear_numel(&readout_in, &hidden)],
        )?;
        let readout_energy = dict.get("reduce_hidden_to_energy.linear.weight", &[hidden.dim()])?;
        let shift = dict.rescale(
            "rescale_atomic_energy.shift",
            n_types,
            n_modals,
            c.modal_wise_shift,
        )?;
        let scale = dict.rescale(
            "rescale_atomic_energy.scale",
            n_types,
            n_modals,
            c.modal_wise_scale,
        )?;
        Ok(Self {
            config,
            bessel_freqs,
            onehot,
            layers,
            readout_hidden,
            readout_energy,
            shift,
            scale,
        })
    }

    /// Reads a SevenNet checkpoint (`*.pth` as sevenn writes it): its config
    /// ([`SevenNetConfig::from_checkpoint`], refusing what is not
    /// implemented) and its state dict ([`SevenNetWeights::from_parts`]).
    pub fn from_checkpoint(path: impl AsRef<std::path::Path>) -> Result<Self, E3nnError> {
        let ckpt = ddmlip_checkpoint::load(path)?;
        let config = SevenNetConfig::from_checkpoint(&ckpt)?;
        let entries: Vec<(String, Vec<usize>, Vec<f32>)> = ckpt
            .state_dict()?
            .into_iter()
            .map(|(name, t)| (name, t.shape, t.data))
            .collect();
        Self::from_parts(config, &entries)
    }

    fn layer(dict: &Dict, c: &SevenNetConfig, t: usize) -> Result<LayerWeights, E3nnError> {
        let irreps_in = c.node_irreps[t].clone();
        let irreps_out = c.node_irreps[t + 1].clone();
        let (irreps_gate_in, _) = gate_layout(&irreps_out);
        let lmax_out = irreps_out.lmax();
        let prefix = format!("{t}_convolution");
        let old = c.is_pre_0_11();
        let buffer_name = |l1: usize, l2: usize, l3: usize| {
            format!("{prefix}.convolution._compiled_main_left_right._w3j_{l1}_{l2}_{l3}")
        };
        // CG per path: the stored buffer (sign-fixed) when the checkpoint has
        // one (paths with every l > 0), exact wigner_3j otherwise.
        let mut flipped = Vec::new();
        let mut signs = Vec::new();
        let (paths, irreps_msg, order) = uvu_sorted_paths(
            &irreps_in,
            c.lmax_sh,
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
                if !old || allclose(&stored, &exact) {
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
        let widths: Vec<usize> = std::iter::once(c.n_basis)
            .chain(c.radial_hidden.iter().copied())
            .chain(std::iter::once(w_total))
            .collect();
        let n_mats = widths.len() - 1;
        let mut radial = Vec::with_capacity(n_mats);
        for k in 0..n_mats - 1 {
            radial.push(dict.get(
                &format!("{prefix}.weight_nn.layer{k}.weight"),
                &[widths[k], widths[k + 1]],
            )?);
        }
        let hidden = widths[n_mats - 1];
        let raw_last = dict.get(
            &format!("{prefix}.weight_nn.layer{}.weight", n_mats - 1),
            &[hidden, w_total],
        )?;
        // Old checkpoints store the columns in creation order; move them to
        // sorted order. Newer ones are sorted already.
        let last = if old {
            let mut creation_offset = vec![0usize; order.len()];
            let mut muls = vec![0usize; order.len()];
            for (pos, &k) in order.iter().enumerate() {
                muls[k] = paths[pos].mul;
            }
            let mut acc = 0;
            for k in 0..order.len() {
                creation_offset[k] = acc;
                acc += muls[k];
            }
            let mut m = vec![0.0; hidden * w_total];
            for (pos, &k) in order.iter().enumerate() {
                let p = &paths[pos];
                for row in 0..hidden {
                    for u in 0..p.mul {
                        m[row * w_total + p.weight_offset + u] =
                            signs[pos] * raw_last[row * w_total + creation_offset[k] + u];
                    }
                }
            }
            m
        } else {
            raw_last
        };
        radial.push(last);
        let n_modals = c.modals.len();
        let lin1_in = with_modal_inputs(&irreps_in, n_modals, c.modal_inputs.self_inter_intro);
        let lin2_in = with_modal_inputs(
            &irreps_msg.simplify(),
            n_modals,
            c.modal_inputs.self_inter_outro,
        );
        let denominator = dict.get(&format!("{prefix}.denominator"), &[1])?[0];
        // Messages are divided by it: a zero is a broken checkpoint, caught
        // here rather than as a kernel failure at the first evaluation.
        if !(denominator.is_finite() && denominator != 0.0) {
            return Err(E3nnError::Checkpoint(format!(
                "tensor \"{prefix}.denominator\" is {denominator}; it divides every message \
                 and must be finite and non-zero"
            )));
        }
        Ok(LayerWeights {
            self_connection: dict.get(
                &format!("{t}_self_connection_intro.linear.weight"),
                &[linear_numel(&irreps_in, &irreps_gate_in)],
            )?,
            linear_1: dict.get(
                &format!("{t}_self_interaction_1.linear.weight"),
                &[linear_numel(&lin1_in, &irreps_in)],
            )?,
            radial,
            linear_2: dict.get(
                &format!("{t}_self_interaction_2.linear.weight"),
                &[linear_numel(&lin2_in, &irreps_gate_in)],
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

/// A Linear of the network: with the modality's one-hot as extra input
/// when `modal_input`, plain otherwise.
fn network_linear<T: Real>(
    irreps_in: &Irreps,
    irreps_out: &Irreps,
    flat: &[f64],
    modal_input: bool,
    n_modals: usize,
    modal: Option<usize>,
) -> Result<AffineLinear<T>, E3nnError> {
    match (modal_input, modal) {
        (true, Some(m)) => AffineLinear::with_modal(irreps_in, irreps_out, flat, n_modals, m),
        (true, None) => Err(E3nnError::Config(
            "a modality input without a modality".into(),
        )),
        (false, _) => AffineLinear::plain(irreps_in, irreps_out, flat),
    }
}

/// One interaction block's kernels in precision `T`.
#[derive(Clone, Debug)]
pub struct InteractionBlock<T> {
    /// sc = Linear(x), x → gate_in.
    pub self_connection: IrrepsLinear<T>,
    /// h = Linear_1(x) [+ modality row], x → x.
    pub linear_1: AffineLinear<T>,
    /// Per-edge TP weights from the radial embedding.
    pub radial: RadialMlp<T>,
    /// Tensor-product paths of the convolution.
    pub conv: ConvPaths<T>,
    /// Message divisor.
    pub denominator: f64,
    /// y = Linear_2(A) [+ modality row] + sc, simplified message irreps → gate_in.
    pub linear_2: AffineLinear<T>,
    /// Gate producing the block output.
    pub gate: Gate,
    /// Degree of the edge spherical harmonics the convolution reads.
    pub lmax_sh: usize,
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
    fn new(w: &LayerWeights, c: &SevenNetConfig, modal: Option<usize>) -> Result<Self, E3nnError> {
        let dim_w: usize = w.paths.iter().map(|p| p.mul).sum();
        let (_, gate) = gate_layout(&w.irreps_out);
        let widths: Vec<usize> = std::iter::once(c.n_basis)
            .chain(c.radial_hidden.iter().copied())
            .chain(std::iter::once(dim_w))
            .collect();
        let n_modals = c.modals.len();
        Ok(Self {
            self_connection: IrrepsLinear::new(
                &w.irreps_in,
                &w.irreps_gate_in,
                &w.self_connection,
            )?,
            linear_1: network_linear(
                &w.irreps_in,
                &w.irreps_in,
                &w.linear_1,
                c.modal_inputs.self_inter_intro,
                n_modals,
                modal,
            )?,
            radial: RadialMlp::new(&widths, &w.radial)?,
            conv: ConvPaths::new(
                w.irreps_in.dim(),
                c.lmax_sh,
                dim_w,
                w.irreps_msg.dim(),
                w.paths.clone(),
            )?,
            denominator: w.denominator,
            linear_2: network_linear(
                &w.irreps_msg.simplify(),
                &w.irreps_gate_in,
                &w.linear_2,
                c.modal_inputs.self_inter_outro,
                n_modals,
                modal,
            )?,
            gate,
            lmax_sh: c.lmax_sh,
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
        check_len("block grad_emb", ne * self.radial.dim_in(), grad_emb.len())?;
        check_len("block grad_sh", ne * sh_dim(self.lmax_sh), grad_sh.len())?;
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

/// A SevenNet network in precision `T`, for one modality of a
/// multi-fidelity checkpoint.
#[derive(Clone, Debug)]
pub struct SevenNet<T> {
    /// Radial embedding (Bessel basis, cutoff function).
    pub embedding: EdgeEmbedding,
    /// Degree of the edge spherical harmonics.
    pub lmax_sh: usize,
    /// Whether the SH read unit vectors (else `|r|^l·Y_l(r̂)`, sevenn ≤ 0.9
    /// checkpoints without `_normalize_sh`).
    pub normalize_sh: bool,
    /// Atomic numbers in type-index order.
    species: Vec<u32>,
    /// Species embedding rows, n_species × dim₀ (the one-hot Linear applied
    /// to each one-hot, modality row included), f64 and in `T`.
    embedding_table: Vec<f64>,
    onehot: Vec<T>,
    /// The interaction blocks.
    pub blocks: Vec<InteractionBlock<T>>,
    /// Readout Linear, last node irreps → dim/2 scalars [+ modality row].
    pub readout_hidden: AffineLinear<T>,
    /// Readout Linear dim/2 → 1.
    pub readout_energy: IrrepsLinear<T>,
    shift: Vec<f64>,
    scale: Vec<f64>,
    shift_t: Vec<T>,
    scale_t: Vec<T>,
    /// The modality this network evaluates, if the checkpoint has several.
    modal: Option<String>,
}

/// Edge inputs of the network: lengths, radial embedding and SH.
#[derive(Clone, Debug)]
pub struct EdgeFeatures<T> {
    /// |r_e| (Å), E.
    pub lengths: Vec<T>,
    /// Radial embedding, E × n_basis.
    pub emb: Vec<T>,
    /// Spherical harmonics l ≤ lmax_sh, E × (lmax_sh+1)².
    pub sh: Vec<T>,
}

impl<T: Real> SevenNet<T> {
    /// Builds the kernels of a checkpoint without modalities (a
    /// multi-fidelity one gives [`E3nnError::Modal`]; use [`SevenNet::for_modal`]).
    pub fn new(w: &SevenNetWeights) -> Result<Self, E3nnError> {
        Self::for_modal(w, None)
    }

    /// Builds the kernels for modality `modal` (by name) of a multi-fidelity
    /// checkpoint; `None` for other checkpoints. A missing, unknown or
    /// superfluous name is [`E3nnError::Modal`] with the valid names.
    pub fn for_modal(w: &SevenNetWeights, modal: Option<&str>) -> Result<Self, E3nnError> {
        let c = &w.config;
        let m = c.modal_index(modal)?;
        let n_types = c.species.len();
        let n_modals = c.modals.len();
        let onehot_in = Irreps::parse(&format!("{n_types}x0e"))?;
        let emb_lin = network_linear::<f64>(
            &onehot_in,
            &c.node_irreps[0],
            &w.onehot,
            c.modal_inputs.node_embedding,
            n_modals,
            m,
        )?;
        let mut identity = vec![0.0; n_types * n_types];
        for t in 0..n_types {
            identity[t * n_types + t] = 1.0;
        }
        let mut embedding_table = vec![0.0; n_types * c.node_irreps[0].dim()];
        emb_lin.forward(&identity, n_types, &mut embedding_table)?;
        let last = &c.node_irreps[c.n_layers()];
        let hidden = Irreps::parse(&format!("{}x0e", last.dim() / 2))?;
        let row = |rows: &[Vec<f64>]| -> Vec<f64> {
            match m {
                Some(i) if rows.len() > 1 => rows[i].clone(),
                _ => rows[0].clone(),
            }
        };
        let (shift, scale) = (row(&w.shift), row(&w.scale));
        Ok(Self {
            embedding: EdgeEmbedding {
                freqs: w.bessel_freqs.clone(),
                cutoff: c.cutoff,
                envelope: c.envelope,
            },
            lmax_sh: c.lmax_sh,
            normalize_sh: c.normalize_sh,
            species: c.species.clone(),
            onehot: embedding_table.iter().map(|&v| T::from_f64(v)).collect(),
            embedding_table,
            blocks: w
                .layers
                .iter()
                .map(|l| InteractionBlock::new(l, c, m))
                .collect::<Result<_, _>>()?,
            readout_hidden: network_linear(
                last,
                &hidden,
                &w.readout_hidden,
                c.modal_inputs.output_block,
                n_modals,
                m,
            )?,
            readout_energy: IrrepsLinear::new(&hidden, &Irreps::parse("1x0e")?, &w.readout_energy)?,
            shift_t: shift.iter().map(|&v| T::from_f64(v)).collect(),
            scale_t: scale.iter().map(|&v| T::from_f64(v)).collect(),
            shift,
            scale,
            modal: m.map(|i| c.modals[i].clone()),
        })
    }

    /// Cutoff radius of the neighbour list (Å).
    pub fn cutoff(&self) -> f64 {
        self.embedding.cutoff
    }

    /// Atomic numbers the network knows, in type-index order.
    pub fn species(&self) -> &[u32] {
        &self.species
    }

    /// The modality this network evaluates (multi-fidelity checkpoints).
    pub fn modal(&self) -> Option<&str> {
        self.modal.as_deref()
    }

    /// Type index of atomic number `z`.
    pub fn type_index(&self, z: u32) -> Result<usize, E3nnError> {
        self.species
            .iter()
            .position(|&s| s == z)
            .ok_or(E3nnError::UnknownElement(z))
    }

    /// Type indices of a list of atomic numbers; the first unknown one is an error.
    pub fn types_from_numbers(&self, numbers: &[u32]) -> Result<Vec<usize>, E3nnError> {
        numbers.iter().map(|&z| self.type_index(z)).collect()
    }

    /// Species embedding rows (n_species × [`SevenNet::dim_node_in`], f64):
    /// the initial node features of each type.
    pub fn embedding_table(&self) -> &[f64] {
        &self.embedding_table
    }

    /// Width of the initial node features.
    pub fn dim_node_in(&self) -> usize {
        self.blocks
            .first()
            .map_or(self.readout_hidden.irreps_in().dim(), |b| b.dim_in())
    }

    /// Energy shift (eV) per type index, for this network's modality.
    pub fn shift(&self) -> &[f64] {
        &self.shift
    }

    /// Energy scale per type index, for this network's modality.
    pub fn scale(&self) -> &[f64] {
        &self.scale
    }

    /// Number of radial basis functions (columns of `emb`).
    pub fn n_basis(&self) -> usize {
        self.embedding.n_basis()
    }

    /// Number of SH components (columns of `sh`).
    pub fn sh_dim(&self) -> usize {
        sh_dim(self.lmax_sh)
    }

    /// Lengths, radial embedding and SH of the edge vectors (Å).
    pub fn edge_features(&self, vectors: &[[T; 3]]) -> Result<EdgeFeatures<T>, E3nnError> {
        let ne = vectors.len();
        let lengths: Vec<T> = vectors
            .par_iter()
            .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            .collect();
        let mut emb = vec![T::ZERO; ne * self.n_basis()];
        self.embedding.forward(&lengths, &mut emb)?;
        let d = self.sh_dim();
        let mut sh = vec![T::ZERO; ne * d];
        sh_forward(vectors, self.lmax_sh, &mut sh)?;
        if !self.normalize_sh {
            // e3nn without normalisation: the degree-l polynomial of the raw
            // vector, |r|^l · Y_l(r̂).
            let lmax = self.lmax_sh;
            sh.par_chunks_mut(d.max(1))
                .zip(lengths.par_iter())
                .for_each(|(row, &r)| {
                    let mut rl = T::ONE;
                    for l in 1..=lmax {
                        rl *= r;
                        for v in &mut row[l * l..(l + 1) * (l + 1)] {
                            *v *= rl;
                        }
                    }
                });
        }
        Ok(EdgeFeatures { lengths, emb, sh })
    }

    /// Gradient w.r.t. the edge vectors (E, overwritten into a new vector)
    /// from gradients w.r.t. the embedding (E × n_basis) and SH (E × sh_dim).
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
        let d = self.sh_dim();
        let scaled;
        let grad_sh = if self.normalize_sh {
            grad_sh
        } else {
            // S_l = r^l Y_l(r̂): ∂S_l/∂v = r^l ∂Y_l(r̂)/∂v + l r^(l−1) Y_l(r̂) v/r.
            // The first term is the unit-vector SH's backward of g·r^l, the
            // second a radial term added to the length gradient.
            check_len("grad_sh", ne * d, grad_sh.len())?;
            let mut unit = vec![T::ZERO; ne * d];
            sh_forward(vectors, self.lmax_sh, &mut unit)?;
            let mut g = grad_sh.to_vec();
            let lmax = self.lmax_sh;
            g.par_chunks_mut(d.max(1))
                .zip(unit.par_chunks(d.max(1)))
                .zip(feats.lengths.par_iter())
                .zip(g_len.par_iter_mut())
                .for_each(|(((gr, yr), &r), gl)| {
                    let mut rl = T::ONE; // r^(l−1)
                    for l in 1..=lmax {
                        let mut dot = T::ZERO;
                        for k in l * l..(l + 1) * (l + 1) {
                            dot += gr[k] * yr[k];
                        }
                        *gl += T::from_f64(l as f64) * rl * dot;
                        rl *= r;
                        for v in &mut gr[l * l..(l + 1) * (l + 1)] {
                            *v *= rl;
                        }
                    }
                });
            scaled = g;
            &scaled[..]
        };
        let mut grad: Vec<[T; 3]> = vectors
            .par_iter()
            .zip(feats.lengths.par_iter())
            .zip(g_len.par_iter())
            .map(|((v, &r), &g)| [g * v[0] / r, g * v[1] / r, g * v[2] / r])
            .collect();
        sh_backward(vectors, self.lmax_sh, grad_sh, &mut grad)?;
        Ok(grad)
    }

    /// Initial node features x⁰ (N × dim₀) from type indices.
    pub fn initial_features(&self, types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let (f, n_types) = (self.dim_node_in(), self.species.len());
        let mut x = vec![T::ZERO; types.len() * f];
        for (position, (row, &t)) in x.chunks_mut(f.max(1)).zip(types).enumerate() {
            if t >= n_types {
                return Err(E3nnError::Index {
                    what: "types",
                    position,
                    index: t,
                    n_rows: n_types,
                });
            }
            row.copy_from_slice(&self.onehot[t * f..(t + 1) * f]);
        }
        Ok(x)
    }

    /// Atomic energies E_i = scale·e_i + shift (eV) from the last block's
    /// output x (N × dim).
    pub fn readout(&self, x: &[T], types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let n = types.len();
        let mut q = vec![T::ZERO; n * self.readout_hidden.irreps_out().dim()];
        self.readout_hidden.forward(x, n, &mut q)?;
        let mut e = vec![T::ZERO; n];
        self.readout_energy.forward(&q, n, &mut e)?;
        let last = self.species.len() - 1;
        for (v, &t) in e.iter_mut().zip(types) {
            let t = t.min(last);
            *v = self.scale_t[t] * *v + self.shift_t[t];
        }
        Ok(e)
    }

    /// Gradient of Σ_i grad_e\[i\]·E_i w.r.t. the last block's output (N × 128).
    pub fn readout_backward(&self, grad_e: &[T], types: &[usize]) -> Result<Vec<T>, E3nnError> {
        let n = types.len();
        check_len("readout grad_e", n, grad_e.len())?;
        let last = self.species.len() - 1;
        let ge: Vec<T> = grad_e
            .iter()
            .zip(types)
            .map(|(&g, &t)| g * self.scale_t[t.min(last)])
            .collect();
        let mut gq = vec![T::ZERO; n * self.readout_hidden.irreps_out().dim()];
        self.readout_energy.backward(&ge, n, &mut gq)?;
        let mut gx = vec![T::ZERO; n * self.readout_hidden.irreps_in().dim()];
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
    let n_types = model.species().len();
    if let Some((position, &t)) = types.iter().enumerate().find(|(_, &t)| t >= n_types) {
        return Err(E3nnError::Index {
            what: "types",
            position,
            index: t,
            n_rows: n_types,
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
    let mut grad_emb = vec![T::ZERO; ne * model.n_basis()];
    let mut grad_sh = vec![T::ZERO; ne * model.sh_dim()];
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
            f[i][k] += g[k].to_f64_lossless();
            f[j][k] -= g[k].to_f64_lossless();
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
            [
                r[0].to_f64_lossless(),
                r[1].to_f64_lossless(),
                r[2].to_f64_lossless(),
            ],
            [
                g[0].to_f64_lossless(),
                g[1].to_f64_lossless(),
                g[2].to_f64_lossless(),
            ],
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
