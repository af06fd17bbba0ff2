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

use crate::activation::Activation;
use crate::affine::AffineLinear;
use crate::conv::{
    radial_conv_backward, radial_conv_forward, uvu_sorted_paths, ConvGraph, ConvPaths, TpPath,
};
use crate::error::{check_len, E3nnError};
use crate::fcn::FullyConnectedNet;
use crate::gate::Gate;
use crate::irreps::{Irrep, Irreps, IrrepsLinear, MulIr};
use crate::radial::{EdgeEmbedding, RadialMlp};
use crate::real::Real;
pub use crate::sevennet_config::{
    GateActivations, ModalInputs, ReadoutKind, SelfConnectionKind, SevenNetConfig,
};
use crate::sh::{sh_backward, sh_dim, sh_forward};
use crate::species_linear::SpeciesLinear;
use crate::wigner::wigner_3j;
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

mod block;
mod weights;

pub(crate) use block::{network_linear, timed};
pub use block::{BlockCache, InteractionBlock, SelfConnection, Timings};
pub(crate) use weights::gate_layout;
pub use weights::{LayerWeights, SevenNetWeights};

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
    /// The last block's output → the scaled atomic energy (before shift
    /// and scale).
    pub readout: Readout<T>,
    shift: Vec<f64>,
    scale: Vec<f64>,
    shift_t: Vec<T>,
    scale_t: Vec<T>,
    /// The modality this network evaluates, if the checkpoint has several.
    modal: Option<String>,
}

/// How a SevenNet turns the last block's output (N × dim) into one
/// scaled atomic energy per row (sevenn's `readout_as_fcn`).
#[derive(Clone, Debug)]
pub enum Readout<T> {
    /// sevenn's default: two e3nn Linears, dim → dim/2 scalars [+ modality
    /// row] → 1, with biases under `use_bias_in_linear`.
    Linears {
        /// Last node irreps → `dim/2 x 0e`.
        hidden: AffineLinear<T>,
        /// `dim/2 x 0e` → `1x0e`.
        energy: AffineLinear<T>,
    },
    /// `readout_as_fcn`: an e3nn FullyConnectedNet dim → hidden… → 1.
    Mlp(FullyConnectedNet<T>),
}

impl<T: Real> Readout<T> {
    /// Input width.
    pub fn dim_in(&self) -> usize {
        match self {
            Self::Linears { hidden, .. } => hidden.irreps_in().dim(),
            Self::Mlp(m) => m.dim_in(),
        }
    }

    /// `out` (N, overwritten) from `x` (N × dim_in).
    pub fn forward(&self, x: &[T], n_rows: usize, out: &mut [T]) -> Result<(), E3nnError> {
        match self {
            Self::Linears { hidden, energy } => {
                let mut q = vec![T::ZERO; n_rows * hidden.irreps_out().dim()];
                hidden.forward(x, n_rows, &mut q)?;
                energy.forward(&q, n_rows, out)
            }
            Self::Mlp(m) => m.forward(x, n_rows, out),
        }
    }

    /// `grad_x` (N × dim_in, overwritten) from `x` and `grad_out` (N).
    pub fn backward(
        &self,
        x: &[T],
        grad_out: &[T],
        n_rows: usize,
        grad_x: &mut [T],
    ) -> Result<(), E3nnError> {
        match self {
            Self::Linears { hidden, energy } => {
                let mut gq = vec![T::ZERO; n_rows * hidden.irreps_out().dim()];
                energy.backward(grad_out, n_rows, &mut gq)?;
                hidden.backward(&gq, n_rows, grad_x)
            }
            Self::Mlp(m) => m.backward(x, grad_out, n_rows, grad_x),
        }
    }
}

/// Edges per chunk of the f32 edge features' f64 evaluation.
const EDGE_CHUNK: usize = 2048;

/// |v| of every edge vector (Å): the lengths the features and their
/// gradient are computed from.
fn edge_lengths<U: Real>(vectors: &[[U; 3]]) -> Vec<U> {
    vectors
        .par_iter()
        .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
        .collect()
}

/// Whether `T` is f64 (the [`Real`] types are f32 and f64).
fn is_f64<T: Real>() -> bool {
    std::mem::size_of::<T>() == std::mem::size_of::<f64>()
}

/// `dst[k] = round(src[k])`.
fn round_into<T: Real>(src: &[f64], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(s);
    }
}

/// Edge inputs of the network: lengths, radial embedding and SH.
#[derive(Clone, Debug)]
pub struct EdgeFeatures<T> {
    /// |r_e| (Å), E.
    pub lengths: Vec<T>,
    /// What rounding each length to `T` left out (zero in f64), E: with
    /// `lengths`, the length as exactly as f64 gives it (the columns of
    /// [`crate::radial_table::split_length`]).
    pub lengths_lo: Vec<T>,
    /// Radial embedding, E × n_basis (empty when asked for
    /// [`RadialInput::Length`]).
    pub emb: Vec<T>,
    /// Spherical harmonics l ≤ lmax_sh, E × (lmax_sh+1)².
    pub sh: Vec<T>,
}

/// What the convolutions read as an edge's radial input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RadialInput {
    /// The radial embedding (n_basis columns), for the radial MLP.
    Embedding,
    /// The length as its [`crate::radial_table::LENGTH_COLUMNS`] (the
    /// rounded length and the rest), for a [`crate::RadialTable`].
    Length,
}

/// The gradient of an edge's radial input: per embedding column
/// (E × n_basis) when the radial MLP reads the embedding, per length (E)
/// when a [`crate::RadialTable`] reads the length.
#[derive(Clone, Copy, Debug)]
pub enum RadialInputGrad<'a, T> {
    /// ∂E/∂emb, E × n_basis.
    Embedding(&'a [T]),
    /// ∂E/∂r, E.
    Length(&'a [T]),
}

impl<'a, T> RadialInputGrad<'a, T> {
    fn values(&self) -> &'a [T] {
        match *self {
            Self::Embedding(g) | Self::Length(g) => g,
        }
    }
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
            &w.onehot_bias,
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
        let readout = match &c.readout {
            ReadoutKind::Linears => {
                let hidden = Irreps::parse(&format!("{}x0e", last.dim() / 2))?;
                Readout::Linears {
                    hidden: network_linear(
                        last,
                        &hidden,
                        &w.readout_hidden,
                        &w.readout_hidden_bias,
                        c.modal_inputs.output_block,
                        n_modals,
                        m,
                    )?,
                    energy: AffineLinear::plain(
                        &hidden,
                        &Irreps::parse("1x0e")?,
                        &w.readout_energy,
                    )?
                    .add_scalar_bias(&w.readout_energy_bias)?,
                }
            }
            ReadoutKind::Mlp { hidden, activation } => {
                let widths: Vec<usize> = std::iter::once(last.dim())
                    .chain(hidden.iter().copied())
                    .chain(std::iter::once(1))
                    .collect();
                Readout::Mlp(FullyConnectedNet::new(
                    &widths,
                    &w.readout_mlp,
                    *activation,
                )?)
            }
        };
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
            readout,
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
            .map_or(self.readout.dim_in(), |b| b.dim_in())
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
        self.edge_inputs(vectors, RadialInput::Embedding)
    }

    /// Columns of an edge's radial input of kind `radial`.
    pub fn radial_input_width(&self, radial: RadialInput) -> usize {
        match radial {
            RadialInput::Embedding => self.n_basis(),
            RadialInput::Length => crate::radial_table::LENGTH_COLUMNS,
        }
    }

    /// Lengths, SH and, for [`RadialInput::Embedding`], the radial
    /// embedding of the edge vectors (Å).
    ///
    /// In f32 the features are computed in f64 from the (exactly promoted)
    /// vectors and rounded once: measured against upstream's float64, this
    /// phase in f32 arithmetic (sines of the Bessel basis, SH polynomials,
    /// their gradients) was most of the f32 force error, and it costs
    /// a few flops per edge against the convolution's hundreds.
    pub fn edge_inputs(
        &self,
        vectors: &[[T; 3]],
        radial: RadialInput,
    ) -> Result<EdgeFeatures<T>, E3nnError> {
        if is_f64::<T>() {
            return self.edge_features_in(vectors, radial);
        }
        let d = self.sh_dim();
        let nb = match radial {
            RadialInput::Embedding => self.n_basis(),
            RadialInput::Length => 0,
        };
        let ne = vectors.len();
        let mut out = EdgeFeatures {
            lengths: vec![T::ZERO; ne],
            lengths_lo: vec![T::ZERO; ne],
            emb: vec![T::ZERO; ne * nb],
            sh: vec![T::ZERO; ne * d],
        };
        // Chunks of edges keep the f64 temporaries small. Without an
        // embedding each chunk gets an empty piece of it (a parallel zip
        // with no chunks of an empty vector would end at once).
        let emb_pieces: Vec<&mut [T]> = if nb > 0 {
            out.emb.chunks_mut(EDGE_CHUNK * nb).collect()
        } else {
            (0..ne.div_ceil(EDGE_CHUNK)).map(|_| &mut [][..]).collect()
        };
        out.lengths
            .par_chunks_mut(EDGE_CHUNK)
            .zip(out.lengths_lo.par_chunks_mut(EDGE_CHUNK))
            .zip(emb_pieces)
            .zip(out.sh.par_chunks_mut(EDGE_CHUNK * d.max(1)))
            .zip(vectors.par_chunks(EDGE_CHUNK))
            .try_for_each(|((((l, lo), e), sh), v)| {
                let v64: Vec<[f64; 3]> = v.iter().map(|x| x.map(T::to_f64_lossless)).collect();
                let f = self.edge_features_in::<f64>(&v64, radial)?;
                for ((hi, lo), &r) in l.iter_mut().zip(lo.iter_mut()).zip(&f.lengths) {
                    [*hi, *lo] = crate::radial_table::split_length::<T>(r);
                }
                round_into(&f.emb, e);
                round_into(&f.sh, sh);
                Ok::<(), E3nnError>(())
            })?;
        Ok(out)
    }

    /// Gradient w.r.t. the edge vectors (E, overwritten into a new vector)
    /// from gradients w.r.t. the embedding (E × n_basis) and SH (E × sh_dim).
    /// In f32 computed in f64 and rounded once, like [`Self::edge_features`].
    pub fn edge_features_backward(
        &self,
        vectors: &[[T; 3]],
        grad_emb: &[T],
        grad_sh: &[T],
    ) -> Result<Vec<[T; 3]>, E3nnError> {
        self.edge_inputs_backward(vectors, RadialInputGrad::Embedding(grad_emb), grad_sh)
    }

    /// [`Self::edge_features_backward`] with the radial input's gradient
    /// given either per embedding column or per length (when the weights
    /// come from a [`crate::RadialTable`] of the length).
    pub fn edge_inputs_backward(
        &self,
        vectors: &[[T; 3]],
        grad_radial: RadialInputGrad<'_, T>,
        grad_sh: &[T],
    ) -> Result<Vec<[T; 3]>, E3nnError> {
        if is_f64::<T>() {
            return self.edge_features_backward_in(vectors, grad_radial, grad_sh);
        }
        let d = self.sh_dim();
        let nb = match grad_radial {
            RadialInputGrad::Embedding(_) => self.n_basis(),
            RadialInputGrad::Length(_) => 1,
        };
        let grad_emb = grad_radial.values();
        let ne = vectors.len();
        check_len("grad_emb", ne * nb, grad_emb.len())?;
        check_len("grad_sh", ne * d, grad_sh.len())?;
        let mut grad = vec![[T::ZERO; 3]; ne];
        grad.par_chunks_mut(EDGE_CHUNK)
            .zip(vectors.par_chunks(EDGE_CHUNK))
            .zip(grad_emb.par_chunks(EDGE_CHUNK * nb.max(1)))
            .zip(grad_sh.par_chunks(EDGE_CHUNK * d.max(1)))
            .try_for_each(|(((g, v), ge), gs)| {
                let v64: Vec<[f64; 3]> = v.iter().map(|x| x.map(T::to_f64_lossless)).collect();
                let ge: Vec<f64> = ge.iter().map(|x| x.to_f64_lossless()).collect();
                let gs: Vec<f64> = gs.iter().map(|x| x.to_f64_lossless()).collect();
                let ge = match grad_radial {
                    RadialInputGrad::Embedding(_) => RadialInputGrad::Embedding(&ge[..]),
                    RadialInputGrad::Length(_) => RadialInputGrad::Length(&ge[..]),
                };
                let g64 = self.edge_features_backward_in::<f64>(&v64, ge, &gs)?;
                for (o, x) in g.iter_mut().zip(&g64) {
                    *o = x.map(T::from_f64);
                }
                Ok::<(), E3nnError>(())
            })?;
        Ok(grad)
    }

    /// [`Self::edge_inputs`] computed in precision `U` (`lengths_lo` zero).
    fn edge_features_in<U: Real>(
        &self,
        vectors: &[[U; 3]],
        radial: RadialInput,
    ) -> Result<EdgeFeatures<U>, E3nnError> {
        let ne = vectors.len();
        let lengths = edge_lengths(vectors);
        let emb = match radial {
            RadialInput::Embedding => {
                let mut emb = vec![U::ZERO; ne * self.n_basis()];
                self.embedding.forward(&lengths, &mut emb)?;
                emb
            }
            RadialInput::Length => Vec::new(),
        };
        let d = self.sh_dim();
        let mut sh = vec![U::ZERO; ne * d];
        sh_forward(vectors, self.lmax_sh, &mut sh)?;
        if !self.normalize_sh {
            // e3nn without normalisation: the degree-l polynomial of the raw
            // vector, |r|^l · Y_l(r̂).
            let lmax = self.lmax_sh;
            sh.par_chunks_mut(d.max(1))
                .zip(lengths.par_iter())
                .for_each(|(row, &r)| {
                    let mut rl = U::ONE;
                    for l in 1..=lmax {
                        rl *= r;
                        for v in &mut row[l * l..(l + 1) * (l + 1)] {
                            *v *= rl;
                        }
                    }
                });
        }
        Ok(EdgeFeatures {
            lengths,
            lengths_lo: vec![U::ZERO; ne],
            emb,
            sh,
        })
    }

    /// [`Self::edge_features_backward`] computed in precision `U`.
    fn edge_features_backward_in<U: Real>(
        &self,
        vectors: &[[U; 3]],
        grad_radial: RadialInputGrad<'_, U>,
        grad_sh: &[U],
    ) -> Result<Vec<[U; 3]>, E3nnError> {
        let ne = vectors.len();
        let lengths = edge_lengths(vectors);
        let mut g_len = vec![U::ZERO; ne];
        match grad_radial {
            RadialInputGrad::Embedding(ge) => self.embedding.backward(&lengths, ge, &mut g_len)?,
            RadialInputGrad::Length(gl) => {
                check_len("grad_lengths", ne, gl.len())?;
                g_len.copy_from_slice(gl);
            }
        }
        let d = self.sh_dim();
        let scaled;
        let grad_sh = if self.normalize_sh {
            grad_sh
        } else {
            // S_l = r^l Y_l(r̂): ∂S_l/∂v = r^l ∂Y_l(r̂)/∂v + l r^(l−1) Y_l(r̂) v/r.
            // The first term is the unit-vector SH's backward of g·r^l, the
            // second a radial term added to the length gradient.
            check_len("grad_sh", ne * d, grad_sh.len())?;
            let mut unit = vec![U::ZERO; ne * d];
            sh_forward(vectors, self.lmax_sh, &mut unit)?;
            let mut g = grad_sh.to_vec();
            let lmax = self.lmax_sh;
            g.par_chunks_mut(d.max(1))
                .zip(unit.par_chunks(d.max(1)))
                .zip(lengths.par_iter())
                .zip(g_len.par_iter_mut())
                .for_each(|(((gr, yr), &r), gl)| {
                    let mut rl = U::ONE; // r^(l−1)
                    for l in 1..=lmax {
                        let mut dot = U::ZERO;
                        for k in l * l..(l + 1) * (l + 1) {
                            dot += gr[k] * yr[k];
                        }
                        *gl += U::from_f64(l as f64) * rl * dot;
                        rl *= r;
                        for v in &mut gr[l * l..(l + 1) * (l + 1)] {
                            *v *= rl;
                        }
                    }
                });
            scaled = g;
            &scaled[..]
        };
        let mut grad: Vec<[U; 3]> = vectors
            .par_iter()
            .zip(lengths.par_iter())
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
        let mut e = vec![T::ZERO; n];
        self.readout.forward(x, n, &mut e)?;
        let last = self.species.len() - 1;
        for (v, &t) in e.iter_mut().zip(types) {
            let t = t.min(last);
            *v = self.scale_t[t] * *v + self.shift_t[t];
        }
        Ok(e)
    }

    /// Gradient of Σ_i grad_e\[i\]·E_i w.r.t. the last block's output `x`
    /// (N × dim).
    pub fn readout_backward(
        &self,
        x: &[T],
        grad_e: &[T],
        types: &[usize],
    ) -> Result<Vec<T>, E3nnError> {
        let n = types.len();
        check_len("readout grad_e", n, grad_e.len())?;
        let last = self.species.len() - 1;
        let ge: Vec<T> = grad_e
            .iter()
            .zip(types)
            .map(|(&g, &t)| g * self.scale_t[t.min(last)])
            .collect();
        let mut gx = vec![T::ZERO; n * self.readout.dim_in()];
        self.readout.backward(x, &ge, n, &mut gx)?;
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
        let (out, cache) =
            block.forward_timed(&graph, &x, types, &feats.emb, &feats.sh, &mut tm)?;
        inputs_dims.push(block.dim_in());
        caches.push(cache);
        x = out;
    }
    let energies = timed(&mut tm.linear, || model.readout(&x, types))?;
    // Backward of Σ_i E_i.
    let ones = vec![T::ONE; n];
    let mut gx = timed(&mut tm.linear, || model.readout_backward(&x, &ones, types))?;
    let ne = centers.len();
    let mut grad_emb = vec![T::ZERO; ne * model.n_basis()];
    let mut grad_sh = vec![T::ZERO; ne * model.sh_dim()];
    for (block, cache) in model.blocks.iter().zip(&caches).rev() {
        gx = block.backward_timed(
            &graph,
            types,
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
        model.edge_features_backward(vectors, &grad_emb, &grad_sh)
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
        let acts = GateActivations::default();
        let (g, gate) = gate_layout(&Irreps::parse(NODE_IRREPS[1]).unwrap(), &acts);
        assert_eq!(g.to_string(), "224x0e+64x1e+32x2e");
        assert_eq!(gate.dim_in(), 576);
        assert_eq!(gate.dim_out(), 480);
        let (g, _) = gate_layout(&Irreps::parse("128x0e").unwrap(), &acts);
        assert_eq!(g.to_string(), "128x0e");
    }
}
