//! Weight loading of a SevenNet checkpoint: the state dict read for the
//! architecture of its config, with sevenn's load-time fix-ups.

use super::*;

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
    /// How the self-connection is computed.
    pub self_connection_kind: SelfConnectionKind,
    /// Flat self-connection weights (x → gate_in): an e3nn Linear's, or
    /// for [`SelfConnectionKind::Nequip`] the species tensor product's
    /// (see [`crate::species_linear`]).
    pub self_connection: Vec<f64>,
    /// Flat Linear_1 weights (x [+ modality one-hot] → x).
    pub linear_1: Vec<f64>,
    /// Linear_1's bias on its `0e` outputs (`use_bias_in_linear`; else empty).
    pub linear_1_bias: Vec<f64>,
    /// Radial MLP matrices `[n_basis×h₁, …, h_k×W]`, (in, out) row-major; the
    /// last one with its columns in sorted path order and flipped paths negated.
    pub radial: Vec<Vec<f64>>,
    /// Flat Linear_2 weights (simplified message irreps [+ modality one-hot] → gate_in).
    pub linear_2: Vec<f64>,
    /// Linear_2's bias on its `0e` outputs (`use_bias_in_linear`; else empty).
    pub linear_2_bias: Vec<f64>,
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
    /// Its bias on the `0e` outputs (`use_bias_in_linear`; else empty).
    pub onehot_bias: Vec<f64>,
    /// The interaction blocks.
    pub layers: Vec<LayerWeights>,
    /// Readout Linear, last node irreps [+ modalities] → `dim/2 x 0e`, flat
    /// (unscaled); empty with the fully connected readout.
    pub readout_hidden: Vec<f64>,
    /// Its bias (`use_bias_in_linear`; else empty).
    pub readout_hidden_bias: Vec<f64>,
    /// Readout Linear `dim/2 x 0e` → `1x0e`, flat (unscaled); empty with the
    /// fully connected readout.
    pub readout_energy: Vec<f64>,
    /// Its bias (`use_bias_in_linear`; else empty).
    pub readout_energy_bias: Vec<f64>,
    /// The fully connected readout's `layer{k}.weight` matrices, row-major
    /// `(h_in, h_out)` (`readout_as_fcn`; else empty).
    pub readout_mlp: Vec<Vec<f64>>,
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
    /// `{module}.linear.bias` of a Linear to `out` when the config has
    /// biases (one value per `0e` output channel), else empty.
    fn bias(&self, module: &str, out: &Irreps, biases: bool) -> Result<Vec<f64>, E3nnError> {
        if !biases {
            return Ok(Vec::new());
        }
        let n = bias_numel(out);
        if n == 0 {
            // e3nn stores an empty tensor when no output is a scalar.
            return Ok(Vec::new());
        }
        self.get(&format!("{module}.linear.bias"), &[n])
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

/// Gate-input irreps and gate layout for a sorted output irreps list, as
/// e3nn's `Gate` sorts and simplifies them: the scalars, one gate scalar
/// per non-scalar copy (even when a `0e` scalar exists, odd otherwise),
/// then the gated blocks.
/// The activations are `acts`' by parity, as sevenn's `EquivariantGate` picks them.
pub(crate) fn gate_layout(out: &Irreps, acts: &GateActivations) -> (Irreps, Gate) {
    let scalars: Vec<MulIr> = out.blocks.iter().filter(|b| b.ir.l == 0).copied().collect();
    let n_scalars: usize = scalars.iter().map(|b| b.mul).sum();
    let gated_blocks: Vec<MulIr> = out.blocks.iter().filter(|b| b.ir.l > 0).copied().collect();
    let gated: Vec<(usize, usize)> = gated_blocks.iter().map(|b| (b.mul, b.ir.l)).collect();
    let mut scalar_activations: Vec<(usize, Activation)> = Vec::new();
    for b in &scalars {
        let act = if b.ir.p == 1 {
            acts.scalar_even
        } else {
            acts.scalar_odd
        };
        match scalar_activations.last_mut() {
            Some((count, last)) if *last == act => *count += b.mul,
            _ => scalar_activations.push((b.mul, act)),
        }
    }
    let gate_parity = if scalars.iter().any(|b| b.ir.p == 1) {
        1
    } else {
        -1
    };
    let gate = Gate {
        n_scalars,
        gated,
        scalar_activations,
        gate_activation: if gate_parity == 1 {
            acts.gate_even
        } else {
            acts.gate_odd
        },
    };
    let mut blocks = scalars;
    blocks.push(MulIr {
        mul: gate.n_gates(),
        ir: Irrep {
            l: 0,
            p: gate_parity,
        },
    });
    blocks.extend(gated_blocks);
    blocks.retain(|b| b.mul > 0);
    (Irreps { blocks }.simplify(), gate)
}

/// Number of bias values of an e3nn Linear with `biases=True` to `b`: one
/// per `0e` output channel.
pub(crate) fn bias_numel(b: &Irreps) -> usize {
    b.blocks
        .iter()
        .filter(|x| x.ir == Irrep { l: 0, p: 1 })
        .map(|x| x.mul)
        .sum()
}

/// Number of weights of an e3nn Linear `a → b` (pairs of equal irreps).
pub(crate) fn linear_numel(a: &Irreps, b: &Irreps) -> usize {
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
pub(crate) fn with_modal_inputs(irreps: &Irreps, n: usize, extra: bool) -> Irreps {
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
        let onehot_bias = dict.bias("onehot_to_feature_x", &c.node_irreps[0], c.linear_bias)?;
        let mut layers = Vec::with_capacity(c.n_layers());
        for t in 0..c.n_layers() {
            layers.push(Self::layer(&dict, c, t)?);
        }
        let last = &c.node_irreps[c.n_layers()];
        let (mut readout_hidden, mut readout_hidden_bias) = (Vec::new(), Vec::new());
        let (mut readout_energy, mut readout_energy_bias) = (Vec::new(), Vec::new());
        let mut readout_mlp = Vec::new();
        match &c.readout {
            ReadoutKind::Linears => {
                let hidden = Irreps::parse(&format!("{}x0e", last.dim() / 2))?;
                let readout_in = with_modal_inputs(last, n_modals, c.modal_inputs.output_block);
                readout_hidden = dict.get(
                    "reduce_input_to_hidden.linear.weight",
                    &[linear_numel(&readout_in, &hidden)],
                )?;
                readout_hidden_bias =
                    dict.bias("reduce_input_to_hidden", &hidden, c.linear_bias)?;
                let energy = Irreps::parse("1x0e")?;
                readout_energy =
                    dict.get("reduce_hidden_to_energy.linear.weight", &[hidden.dim()])?;
                readout_energy_bias =
                    dict.bias("reduce_hidden_to_energy", &energy, c.linear_bias)?;
            }
            ReadoutKind::Mlp { hidden, .. } => {
                let widths: Vec<usize> = std::iter::once(last.dim())
                    .chain(hidden.iter().copied())
                    .chain(std::iter::once(1))
                    .collect();
                for (k, w) in widths.windows(2).enumerate() {
                    readout_mlp.push(
                        dict.get(&format!("readout_FCN.fcn.layer{k}.weight"), &[w[0], w[1]])?,
                    );
                }
            }
        }
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
            onehot_bias,
            layers,
            readout_hidden,
            readout_hidden_bias,
            readout_energy,
            readout_energy_bias,
            readout_mlp,
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
        let (irreps_gate_in, _) = gate_layout(&irreps_out, &c.gate_activations);
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
        // sevenn's `irreps_out_tp`: every product irrep up to the output's
        // degree, only even ones in the last layer.
        let last_layer = t + 1 == c.n_layers();
        let (paths, irreps_msg, order) = uvu_sorted_paths(
            &irreps_in,
            c.lmax_sh,
            |l| if c.parity && l % 2 == 1 { -1 } else { 1 },
            |ir| ir.l <= lmax_out && (!last_layer || ir.p == 1),
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
        let self_connection_kind = c.self_connections[t];
        let self_connection = match self_connection_kind {
            SelfConnectionKind::Linear => dict.get(
                &format!("{t}_self_connection_intro.linear.weight"),
                &[linear_numel(&irreps_in, &irreps_gate_in)],
            )?,
            SelfConnectionKind::Nequip => dict.get(
                &format!("{t}_self_connection_intro.fc_tensor_product.weight"),
                &[linear_numel(&irreps_in, &irreps_gate_in) * c.species.len()],
            )?,
        };
        Ok(LayerWeights {
            self_connection_kind,
            self_connection,
            linear_1: dict.get(
                &format!("{t}_self_interaction_1.linear.weight"),
                &[linear_numel(&lin1_in, &irreps_in)],
            )?,
            linear_1_bias: dict.bias(
                &format!("{t}_self_interaction_1"),
                &irreps_in,
                c.linear_bias,
            )?,
            radial,
            linear_2: dict.get(
                &format!("{t}_self_interaction_2.linear.weight"),
                &[linear_numel(&lin2_in, &irreps_gate_in)],
            )?,
            linear_2_bias: dict.bias(
                &format!("{t}_self_interaction_2"),
                &irreps_gate_in,
                c.linear_bias,
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
