//! The architecture of a SevenNet checkpoint, read from its `config` dict as
//! sevenn 0.13's `build_E3_equivariant_model` reads it (with the
//! back-compatibility patches of `patch_old_config`), and refused with
//! [`E3nnError::UnsupportedConfig`] naming the key where this crate does not
//! implement the choice.

use crate::activation::Activation;
use crate::error::E3nnError;
use crate::irreps::{Irrep, Irreps, MulIr};
use crate::radial::CutoffFunction;
use crate::sh::SH_LMAX;
use ddmlip_checkpoint::{Checkpoint, PyValue};

/// Which e3nn Linears take the modality one-hot as extra `n_modals x 0e`
/// inputs (sevenn's `use_modal_*` keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModalInputs {
    /// `use_modal_node_embedding`: the species embedding Linear.
    pub node_embedding: bool,
    /// `use_modal_self_inter_intro`: every `{t}_self_interaction_1`.
    pub self_inter_intro: bool,
    /// `use_modal_self_inter_outro`: every `{t}_self_interaction_2`.
    pub self_inter_outro: bool,
    /// `use_modal_output_block`: `reduce_input_to_hidden`.
    pub output_block: bool,
}

/// How an interaction block computes the self-connection term that is
/// added to the convolution's output before the gate (sevenn's
/// `self_connection_type`, per layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfConnectionKind {
    /// `linear`: an e3nn Linear of the block input.
    Linear,
    /// `nequip`: a fully connected tensor product of the block input with
    /// the species one-hot, i.e. one Linear per species.
    Nequip,
}

/// The gate activations of the interaction blocks (sevenn's `act_scalar`
/// and `act_gate`, by the parity of the scalar they act on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateActivations {
    /// `act_scalar.e`: even scalars (0e), `silu` or `ssp`.
    pub scalar_even: Activation,
    /// `act_scalar.o`: odd scalars (0o), `tanh` or `abs`.
    pub scalar_odd: Activation,
    /// `act_gate.e`: the gates when the layer has even scalars, `silu` or `ssp`.
    pub gate_even: Activation,
    /// `act_gate.o`: the gates when it has none (odd gates), `tanh` or `abs`.
    pub gate_odd: Activation,
}

impl Default for GateActivations {
    /// sevenn's defaults: `{e: silu, o: tanh}` for both.
    fn default() -> Self {
        Self {
            scalar_even: Activation::Silu,
            scalar_odd: Activation::Tanh,
            gate_even: Activation::Silu,
            gate_odd: Activation::Tanh,
        }
    }
}

/// How the last block's scalars become the scaled atomic energy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadoutKind {
    /// Two e3nn Linears, dim → dim/2 → 1 (sevenn's default).
    Linears,
    /// `readout_as_fcn`: an e3nn FullyConnectedNet dim → hidden… → 1
    /// (`readout_fcn_hidden_neurons`) with `readout_fcn_activation`.
    Mlp {
        /// Hidden widths.
        hidden: Vec<usize>,
        /// Activation after every hidden layer.
        activation: Activation,
    },
}

/// Everything needed to build a SevenNet network of sevenn's `nequip`
/// interaction type (SO(3) or O(3) irreps, `linear` or `nequip`
/// self-connections, any gate activations, biases or not) with either
/// readout.
#[derive(Clone, Debug, PartialEq)]
pub struct SevenNetConfig {
    /// sevenn version that wrote the checkpoint (`version`).
    pub version: String,
    /// Atomic numbers in type-index order (inverse of `_type_map`).
    pub species: Vec<u32>,
    /// Neighbour cutoff r_c (Å), `cutoff`.
    pub cutoff: f64,
    /// Cutoff function of the radial embedding (`cutoff_function`).
    pub envelope: CutoffFunction,
    /// Number of Bessel functions (`radial_basis.bessel_basis_num`).
    pub n_basis: usize,
    /// Whether the Bessel frequencies are trained (stored) or nπ/r_c.
    pub trainable_bessel: bool,
    /// Hidden widths of the radial MLP (`weight_nn_hidden_neurons`).
    pub radial_hidden: Vec<usize>,
    /// Degree of the edge spherical harmonics (`lmax`, or `lmax_edge` > 0).
    pub lmax_sh: usize,
    /// Whether edge vectors are normalised before the SH (`_normalize_sph`;
    /// checkpoints of sevenn ≤ 0.9 without the key use raw vectors).
    pub normalize_sh: bool,
    /// Node irreps: entry t is the input of layer t, entry t+1 its output.
    pub node_irreps: Vec<Irreps>,
    /// `is_parity`: O(3) irreps, the edge SH of degree l having parity
    /// (−1)^l; SO(3) (all even) when false.
    pub parity: bool,
    /// Self-connection of every layer (`self_connection_type`).
    pub self_connections: Vec<SelfConnectionKind>,
    /// Modality names by modality index (`_modal_map`); empty when the
    /// checkpoint is not multi-fidelity.
    pub modals: Vec<String>,
    /// Which Linears read the modality one-hot.
    pub modal_inputs: ModalInputs,
    /// `use_modal_wise_shift`: the shift has one row per modality.
    pub modal_wise_shift: bool,
    /// `use_modal_wise_scale`: the scale has one row per modality.
    pub modal_wise_scale: bool,
    /// Gate activations (`act_scalar`, `act_gate`).
    pub gate_activations: GateActivations,
    /// `use_bias_in_linear`: every network Linear (species embedding,
    /// `self_interaction_1/2`, the readout Linears) adds a trained bias to
    /// its `0e` outputs; self-connections never have one.
    pub linear_bias: bool,
    /// The readout (`readout_as_fcn`).
    pub readout: ReadoutKind,
}

fn unsupported(key: &str, value: impl std::fmt::Display, reason: &str) -> E3nnError {
    E3nnError::UnsupportedConfig {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn show(v: &PyValue) -> String {
    match v {
        PyValue::Str(s) => format!("{s:?}"),
        PyValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        PyValue::Int(i) => i.to_string(),
        PyValue::Float(x) => x.to_string(),
        other => other.type_name(),
    }
}

/// Reads config keys with sevenn's model defaults for absent ones.
struct Cfg<'a> {
    root: &'a PyValue,
}

impl<'a> Cfg<'a> {
    fn get(&self, key: &str) -> Option<&'a PyValue> {
        self.root.get(key)
    }
    fn required(&self, key: &str) -> Result<&'a PyValue, E3nnError> {
        self.get(key)
            .ok_or_else(|| unsupported(key, "missing", "the config has no such key"))
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, E3nnError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| unsupported(key, show(v), "expected True or False")),
        }
    }
    fn int(&self, key: &str) -> Result<i64, E3nnError> {
        let v = self.required(key)?;
        v.as_i64()
            .ok_or_else(|| unsupported(key, show(v), "expected an integer"))
    }
    fn int_or(&self, key: &str, default: i64) -> Result<i64, E3nnError> {
        if self.get(key).is_some() {
            self.int(key)
        } else {
            Ok(default)
        }
    }
    fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str, E3nnError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| unsupported(key, show(v), "expected a string")),
        }
    }
}

/// `(major, minor, patch)` of a sevenn version string like `0.9.1` or `0.11.0.dev0`.
fn version_triple(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

impl SevenNetConfig {
    /// The configuration of SevenNet-0 (11Jul2024), for state dicts given
    /// without a config.
    pub fn sevennet_0() -> Self {
        let parse = |s: &str| Irreps::parse(s).unwrap_or_default();
        Self {
            version: "0.9.1".into(),
            species: crate::sevennet::SPECIES.iter().map(|s| s.1).collect(),
            cutoff: crate::sevennet::CUTOFF,
            envelope: CutoffFunction::Xplor {
                cutoff_on: crate::sevennet::CUTOFF_ON,
            },
            n_basis: 8,
            trainable_bessel: true,
            radial_hidden: vec![64, 64],
            lmax_sh: 2,
            normalize_sh: true,
            node_irreps: crate::sevennet::NODE_IRREPS
                .iter()
                .map(|s| parse(s))
                .collect(),
            parity: false,
            self_connections: vec![
                SelfConnectionKind::Linear;
                crate::sevennet::NODE_IRREPS.len() - 1
            ],
            modals: Vec::new(),
            modal_inputs: ModalInputs::default(),
            modal_wise_shift: false,
            modal_wise_scale: false,
            gate_activations: GateActivations::default(),
            linear_bias: false,
            readout: ReadoutKind::Linears,
        }
    }

    /// Number of interaction layers.
    pub fn n_layers(&self) -> usize {
        self.node_irreps.len() - 1
    }

    /// True for checkpoints written before sevenn 0.11, whose radial-MLP
    /// output columns are in TP creation order and whose CG buffers may
    /// carry the old e3nn sign (`sort_old_convolution`).
    pub fn is_pre_0_11(&self) -> bool {
        match version_triple(&self.version) {
            Some(v) => v < (0, 11, 0) || (v == (0, 11, 0) && self.version.ends_with("dev0")),
            None => false,
        }
    }

    /// Index of a modality name, or [`E3nnError::Modal`] listing the valid
    /// names (also when `modal` is `None` on a multi-fidelity model, or given
    /// to a model without modalities).
    pub fn modal_index(&self, modal: Option<&str>) -> Result<Option<usize>, E3nnError> {
        match (modal, self.modals.is_empty()) {
            (None, true) => Ok(None),
            (Some(m), false) => match self.modals.iter().position(|x| x == m) {
                Some(i) => Ok(Some(i)),
                None => Err(E3nnError::Modal {
                    given: Some(m.to_string()),
                    valid: self.modals.clone(),
                }),
            },
            (given, _) => Err(E3nnError::Modal {
                given: given.map(str::to_string),
                valid: self.modals.clone(),
            }),
        }
    }

    /// Reads and checks the `config` of a SevenNet checkpoint.
    pub fn from_checkpoint(ckpt: &Checkpoint) -> Result<Self, E3nnError> {
        let root = ckpt.config()?;
        if root.as_dict().is_none() {
            return Err(unsupported("config", root.type_name(), "expected a dict"));
        }
        let c = Cfg { root };
        let version = c.str_or("version", "")?.to_string();
        if version.is_empty() {
            return Err(unsupported(
                "version",
                "missing",
                "sevenn refuses configs without a version",
            ));
        }
        let old = version_triple(&version).is_some_and(|v| v < (0, 10, 0));
        let model_type = c.str_or("_model_type", "E3_equivariant_model")?;
        if model_type != "E3_equivariant_model" {
            return Err(unsupported(
                "_model_type",
                model_type,
                "only E3_equivariant_model exists in sevenn 0.13",
            ));
        }
        let interaction = c.str_or("interaction_type", "nequip")?;
        if interaction != "nequip" {
            return Err(unsupported(
                "interaction_type",
                interaction,
                "only `nequip` is implemented",
            ));
        }
        let parity = c.bool_or("is_parity", true)?;
        let linear_bias = c.bool_or("use_bias_in_linear", false)?;
        let readout = if c.bool_or("readout_as_fcn", false)? {
            let hidden = match c.get("readout_fcn_hidden_neurons") {
                None => vec![30, 30],
                Some(v) => positive_ints(v).ok_or_else(|| {
                    unsupported(
                        "readout_fcn_hidden_neurons",
                        show(v),
                        "expected a list of positive integers",
                    )
                })?,
            };
            let name = c.str_or("readout_fcn_activation", "relu")?;
            let activation = Activation::from_name(name).ok_or_else(|| {
                unsupported(
                    "readout_fcn_activation",
                    name,
                    "sevenn's activations are relu, silu, tanh, abs, ssp, sigmoid, elu",
                )
            })?;
            ReadoutKind::Mlp { hidden, activation }
        } else {
            ReadoutKind::Linears
        };
        let act_radial = c.str_or("act_radial", "silu")?;
        if act_radial != "silu" {
            return Err(unsupported(
                "act_radial",
                act_radial,
                "only `silu` is implemented in the radial MLP",
            ));
        }
        let gate_activations = gate_activations(&c)?;
        // Species: `_type_map` (Z → index) is what sevenn's graph uses.
        let type_map = ckpt.config_int_map("_type_map").map_err(|_| {
            unsupported(
                "_type_map",
                c.get("_type_map").map_or("missing".into(), show),
                "expected a dict of atomic number to type index",
            )
        })?;
        let n_species = type_map.len();
        let mut species = vec![0u32; n_species];
        let mut seen = vec![false; n_species];
        for &(z, idx) in &type_map {
            let (Ok(z), Ok(idx)) = (u32::try_from(z), usize::try_from(idx)) else {
                return Err(unsupported(
                    "_type_map",
                    format!("{z}: {idx}"),
                    "atomic numbers and indices must be non-negative",
                ));
            };
            if idx >= n_species || seen[idx] || z == 0 || z > 118 {
                return Err(unsupported(
                    "_type_map",
                    format!("{z}: {idx}"),
                    "type indices must be 0..n without repeats, atomic numbers 1..=118",
                ));
            }
            seen[idx] = true;
            species[idx] = z;
        }
        if let Some(n) = c.get("_number_of_species").and_then(PyValue::as_i64) {
            if usize::try_from(n).ok() != Some(n_species) {
                return Err(unsupported(
                    "_number_of_species",
                    n,
                    "does not match `_type_map`",
                ));
            }
        }
        let cutoff = c.required("cutoff")?;
        let cutoff = cutoff
            .as_f64()
            .filter(|r| r.is_finite() && *r > 0.0)
            .ok_or_else(|| unsupported("cutoff", show(cutoff), "expected a positive number (Å)"))?;
        // Radial basis.
        let rb = c.required("radial_basis")?;
        let rb_name = rb
            .get("radial_basis_name")
            .and_then(PyValue::as_str)
            .unwrap_or("missing");
        if rb_name != "bessel" {
            return Err(unsupported(
                "radial_basis.radial_basis_name",
                rb_name,
                "only `bessel` exists in sevenn 0.13",
            ));
        }
        let n_basis = match rb.get("bessel_basis_num") {
            None => 8,
            Some(v) => v
                .as_i64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    unsupported(
                        "radial_basis.bessel_basis_num",
                        show(v),
                        "expected a positive integer",
                    )
                })?,
        };
        let trainable_bessel = match rb.get("trainable_coeff") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                unsupported(
                    "radial_basis.trainable_coeff",
                    show(v),
                    "expected True or False",
                )
            })?,
        };
        // Cutoff function.
        let cf = c.required("cutoff_function")?;
        let cf_name = cf
            .get("cutoff_function_name")
            .and_then(PyValue::as_str)
            .unwrap_or("missing");
        let envelope = match cf_name {
            "XPLOR" => {
                let on = cf.get("cutoff_on");
                let r_on = on
                    .and_then(PyValue::as_f64)
                    .filter(|&r| r > 0.0 && r < cutoff)
                    .ok_or_else(|| {
                        unsupported(
                            "cutoff_function.cutoff_on",
                            on.map_or("missing".into(), show),
                            "XPLOR needs 0 < cutoff_on < cutoff",
                        )
                    })?;
                CutoffFunction::Xplor { cutoff_on: r_on }
            }
            "poly_cut" => {
                let p = match cf.get("poly_cut_p_value") {
                    None => 6,
                    Some(v) => v
                        .as_f64()
                        .filter(|p| p.fract() == 0.0 && *p >= 1.0 && *p <= 64.0)
                        .map(|p| p as u32)
                        .ok_or_else(|| {
                            unsupported(
                                "cutoff_function.poly_cut_p_value",
                                show(v),
                                "only integer exponents 1..=64 are implemented",
                            )
                        })?,
                };
                CutoffFunction::Polynomial { p }
            }
            other => {
                return Err(unsupported(
                    "cutoff_function.cutoff_function_name",
                    other,
                    "implemented: `poly_cut`, `XPLOR`",
                ));
            }
        };
        let radial_hidden: Vec<usize> = match c.get("weight_nn_hidden_neurons") {
            None => vec![64, 64],
            Some(v) => positive_ints(v).ok_or_else(|| {
                unsupported(
                    "weight_nn_hidden_neurons",
                    show(v),
                    "expected a list of positive integers",
                )
            })?,
        };
        // Degrees.
        let lmax = c.int("lmax")?;
        let lmax_edge = c.int_or("lmax_edge", -1)?;
        let lmax_node = c.int_or("lmax_node", -1)?;
        let lmax_sh = if lmax_edge > 0 { lmax_edge } else { lmax };
        let lmax_node = if lmax_node > 0 { lmax_node } else { lmax };
        let lmax_sh = usize::try_from(lmax_sh)
            .ok()
            .filter(|&l| l <= SH_LMAX)
            .ok_or_else(|| {
                unsupported(
                    if lmax_edge > 0 { "lmax_edge" } else { "lmax" },
                    lmax_sh,
                    "spherical harmonics of degree 0..=3 are implemented",
                )
            })?;
        let lmax_node = usize::try_from(lmax_node)
            .ok()
            .filter(|&l| l <= SH_LMAX)
            .ok_or_else(|| {
                unsupported(
                    "lmax_node",
                    lmax_node,
                    "node irreps of degree 0..=3 are implemented",
                )
            })?;
        let normalize_sh = if old {
            c.bool_or("_normalize_sph", false)?
        } else {
            c.bool_or("_normalize_sph", true)?
        };
        let n_layers = c.int("num_convolution_layer")?;
        let n_layers = usize::try_from(n_layers)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| unsupported("num_convolution_layer", n_layers, "expected at least 1"))?;
        let node_irreps = match c.get("irreps_manual") {
            None | Some(PyValue::Bool(false)) => {
                let channel = c.int("channel")?;
                let channel = usize::try_from(channel)
                    .ok()
                    .filter(|&m| m > 0)
                    .ok_or_else(|| {
                        unsupported("channel", channel, "expected a positive integer")
                    })?;
                inferred_irreps(channel, n_layers, lmax_sh, lmax_node, parity)
            }
            Some(v) => {
                let list = v
                    .as_seq()
                    .and_then(|s| s.iter().map(|x| x.as_str()).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| {
                        unsupported(
                            "irreps_manual",
                            show(v),
                            "expected a list of irreps strings",
                        )
                    })?;
                if list.len() != n_layers + 1 {
                    return Err(unsupported(
                        "irreps_manual",
                        format!("{} entries", list.len()),
                        "needs num_convolution_layer + 1 entries",
                    ));
                }
                let mut out = Vec::with_capacity(list.len());
                for s in list {
                    let ir = Irreps::parse(s)
                        .map_err(|e| unsupported("irreps_manual", s, &e.to_string()))?;
                    if !parity && ir.blocks.iter().any(|b| b.ir.p != 1) {
                        return Err(unsupported(
                            "irreps_manual",
                            s,
                            "odd irreps need is_parity: True",
                        ));
                    }
                    if ir.lmax() > SH_LMAX {
                        return Err(unsupported(
                            "irreps_manual",
                            s,
                            "node irreps of degree 0..=3 are implemented",
                        ));
                    }
                    out.push(ir);
                }
                out
            }
        };
        if node_irreps[0].blocks.iter().any(|b| b.ir.l != 0) {
            return Err(unsupported(
                "irreps_manual",
                node_irreps[0].to_string(),
                "the first entry must be scalars",
            ));
        }
        let last = &node_irreps[n_layers];
        if last.blocks.iter().any(|b| b.ir.l != 0) {
            return Err(unsupported(
                "irreps_manual",
                last.to_string(),
                "the last layer must output scalars",
            ));
        }
        let self_connections = self_connection_kinds(c.get("self_connection_type"), n_layers)?;
        // Modalities.
        let use_modality = c.bool_or("use_modality", false)?;
        let mut modals = Vec::new();
        let mut modal_inputs = ModalInputs::default();
        let (mut modal_wise_shift, mut modal_wise_scale) = (false, false);
        if use_modality {
            let map = c.required("_modal_map")?;
            let items = map.as_dict().ok_or_else(|| {
                unsupported("_modal_map", show(map), "expected a dict of name to index")
            })?;
            modals = vec![String::new(); items.len()];
            for (k, v) in items {
                let (Some(name), Some(idx)) =
                    (k.as_str(), v.as_i64().and_then(|i| usize::try_from(i).ok()))
                else {
                    return Err(unsupported(
                        "_modal_map",
                        show(k),
                        "expected a dict of name to index",
                    ));
                };
                if idx >= modals.len() || !modals[idx].is_empty() {
                    return Err(unsupported(
                        "_modal_map",
                        format!("{name}: {idx}"),
                        "indices must be 0..n without repeats",
                    ));
                }
                modals[idx] = name.to_string();
            }
            if let Some(n) = c.get("_number_of_modalities").and_then(PyValue::as_i64) {
                if usize::try_from(n).ok() != Some(modals.len()) {
                    return Err(unsupported(
                        "_number_of_modalities",
                        n,
                        "does not match `_modal_map`",
                    ));
                }
            }
            if modals.len() > 1 {
                modal_inputs = ModalInputs {
                    node_embedding: c.bool_or("use_modal_node_embedding", false)?,
                    self_inter_intro: c.bool_or("use_modal_self_inter_intro", false)?,
                    self_inter_outro: c.bool_or("use_modal_self_inter_outro", false)?,
                    output_block: c.bool_or("use_modal_output_block", false)?,
                };
            }
            modal_wise_shift = c.bool_or("use_modal_wise_shift", false)?;
            modal_wise_scale = c.bool_or("use_modal_wise_scale", false)?;
        }
        Ok(Self {
            version,
            species,
            cutoff,
            envelope,
            n_basis,
            trainable_bessel,
            radial_hidden,
            lmax_sh,
            normalize_sh,
            node_irreps,
            parity,
            self_connections,
            modals,
            modal_inputs,
            modal_wise_shift,
            modal_wise_scale,
            gate_activations,
            linear_bias,
            readout,
        })
    }
}

/// A list of positive integers, or `None`.
fn positive_ints(v: &PyValue) -> Option<Vec<usize>> {
    v.as_seq()?
        .iter()
        .map(|x| {
            x.as_i64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
        })
        .collect()
}

/// `act_scalar` and `act_gate`: dicts `{e: NAME, o: NAME}` with sevenn's
/// choices per parity (even: `silu`, `ssp`; odd: `tanh`, `abs`); a missing
/// key or entry takes sevenn's default (`silu`, `tanh`).
fn gate_activations(c: &Cfg<'_>) -> Result<GateActivations, E3nnError> {
    let d = GateActivations::default();
    let pick = |key: &str, parity: &str, default: Activation| -> Result<Activation, E3nnError> {
        let Some(dict) = c.get(key) else {
            return Ok(default);
        };
        if dict.as_dict().is_none() {
            return Err(unsupported(
                key,
                show(dict),
                "expected a dict {e: NAME, o: NAME}",
            ));
        }
        let Some(v) = dict.get(parity) else {
            return Ok(default);
        };
        let allowed: &[Activation] = if parity == "e" {
            &[Activation::Silu, Activation::Ssp]
        } else {
            &[Activation::Tanh, Activation::Abs]
        };
        v.as_str()
            .and_then(Activation::from_name)
            .filter(|a| allowed.contains(a))
            .ok_or_else(|| {
                unsupported(
                    &format!("{key}.{parity}"),
                    show(v),
                    if parity == "e" {
                        "sevenn's even activations are `silu`, `ssp`"
                    } else {
                        "sevenn's odd activations are `tanh`, `abs`"
                    },
                )
            })
    };
    Ok(GateActivations {
        scalar_even: pick("act_scalar", "e", d.scalar_even)?,
        scalar_odd: pick("act_scalar", "o", d.scalar_odd)?,
        gate_even: pick("act_gate", "e", d.gate_even)?,
        gate_odd: pick("act_gate", "o", d.gate_odd)?,
    })
}

/// sevenn's `self_connection_type`: one name for every layer or a list of
/// `num_convolution_layer` names; absent means sevenn's default `nequip`.
fn self_connection_kinds(
    value: Option<&PyValue>,
    n_layers: usize,
) -> Result<Vec<SelfConnectionKind>, E3nnError> {
    const KEY: &str = "self_connection_type";
    let kind = |v: &PyValue| match v.as_str() {
        Some("linear") => Ok(SelfConnectionKind::Linear),
        Some("nequip") => Ok(SelfConnectionKind::Nequip),
        _ => Err(unsupported(
            KEY,
            show(v),
            "expected `linear` or `nequip` (or a list of them, one per layer)",
        )),
    };
    match value {
        None => Ok(vec![SelfConnectionKind::Nequip; n_layers]),
        Some(v) => match v.as_seq() {
            Some(list) => {
                if list.len() != n_layers {
                    return Err(unsupported(
                        KEY,
                        format!("{} entries", list.len()),
                        "a list needs one entry per convolution layer",
                    ));
                }
                list.iter().map(kind).collect()
            }
            None => Ok(vec![kind(v)?; n_layers]),
        },
    }
}

/// sevenn's `infer_irreps_out` for models without `irreps_manual`: layer
/// outputs carry `channel` copies of every irrep of degree ≤ `lmax_node`
/// that the product of the input with the SH reaches (SH of degree l odd
/// for l odd when `parity`), sorted as e3nn sorts (by l, odd before even);
/// the last layer keeps `channel x 0e`.
fn inferred_irreps(
    channel: usize,
    n_layers: usize,
    lmax_sh: usize,
    lmax_node: usize,
    parity: bool,
) -> Vec<Irreps> {
    let scalar = |m: usize| Irreps {
        blocks: vec![MulIr {
            mul: m,
            ir: Irrep { l: 0, p: 1 },
        }],
    };
    let sh_parity = |l: usize| if parity && l % 2 == 1 { -1i8 } else { 1 };
    let mut out = vec![scalar(channel)];
    let mut irs = vec![(0usize, 1i8)];
    for t in 0..n_layers {
        if t + 1 == n_layers {
            out.push(scalar(channel));
            break;
        }
        let mut reach: Vec<(usize, i8)> = Vec::new();
        for &(l1, p1) in &irs {
            for l2 in 0..=lmax_sh {
                for l3 in l1.abs_diff(l2)..=l1 + l2 {
                    let ir = (l3, p1 * sh_parity(l2));
                    if l3 <= lmax_node && !reach.contains(&ir) {
                        reach.push(ir);
                    }
                }
            }
        }
        reach.sort_unstable();
        out.push(Irreps {
            blocks: reach
                .iter()
                .map(|&(l, p)| MulIr {
                    mul: channel,
                    ir: Irrep { l, p },
                })
                .collect(),
        });
        irs = reach;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inferred_irreps_follow_sevenn() {
        let ir = inferred_irreps(32, 3, 2, 2, false);
        let s: Vec<String> = ir.iter().map(|i| i.to_string()).collect();
        assert_eq!(
            s,
            ["32x0e", "32x0e+32x1e+32x2e", "32x0e+32x1e+32x2e", "32x0e"]
        );
        let ir = inferred_irreps(8, 1, 1, 1, false);
        assert_eq!(ir.len(), 2);
        assert_eq!(ir[1].to_string(), "8x0e");
        // O(3), checked by hand against e3nn's FullTensorProduct: layer 1
        // reaches 1e from 1o⊗1o and 2o from 2e⊗1o; layer 2 reaches 0o
        // from 1e⊗1o.
        let ir = inferred_irreps(8, 4, 2, 2, true);
        let s: Vec<String> = ir.iter().map(|i| i.to_string()).collect();
        assert_eq!(
            s,
            [
                "8x0e",
                "8x0e+8x1o+8x2e",
                "8x0e+8x1o+8x1e+8x2o+8x2e",
                "8x0o+8x0e+8x1o+8x1e+8x2o+8x2e",
                "8x0e"
            ]
        );
    }

    #[test]
    fn version_order() {
        assert_eq!(version_triple("0.9.1"), Some((0, 9, 1)));
        assert_eq!(version_triple("0.11.0.dev0"), Some((0, 11, 0)));
        let mut c = SevenNetConfig::sevennet_0();
        assert!(c.is_pre_0_11());
        c.version = "0.11.2".into();
        assert!(!c.is_pre_0_11());
        c.version = "0.11.0.dev0".into();
        assert!(c.is_pre_0_11());
    }

    #[test]
    fn modal_lookup_lists_valid_names() {
        let mut c = SevenNetConfig::sevennet_0();
        assert_eq!(c.modal_index(None).unwrap(), None);
        let e = c.modal_index(Some("PBE")).unwrap_err().to_string();
        assert!(e.contains("PBE") && e.contains("no modal"), "{e}");
        c.modals = vec!["R2SCAN".into(), "PBE".into()];
        assert_eq!(c.modal_index(Some("PBE")).unwrap(), Some(1));
        let e = c.modal_index(None).unwrap_err().to_string();
        assert!(e.contains("R2SCAN, PBE"), "{e}");
        let e = c.modal_index(Some("HSE")).unwrap_err().to_string();
        assert!(e.contains("HSE") && e.contains("R2SCAN, PBE"), "{e}");
    }
}
