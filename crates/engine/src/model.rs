//! The model interface: what a model receives, what it returns, and how the
//! runtime calls it in either precision.

use crate::ops::PeriodicShifts;
use crate::{EngineError, Graph, Index, Scalar, Tensor};
use ddmlip_spec::MLIPSpec;
use std::any::Any;
use std::sync::Arc;

/// The neighbour graph the runtime built within the model's cutoff, made by
/// [`Graph::edges`]. Nothing per edge is computed until a model asks:
/// lengths ([`Edges::lengths`]), vectors ([`Edges::vectors`]) or per-atom
/// sums of a function of the lengths ([`Graph::pair_sum`]), so a model
/// stores only the per-edge arrays it reads.
#[derive(Debug, Clone, Copy)]
pub struct Edges {
    /// Edge → Atom: the centre / receiver i.
    pub center: Index,
    /// Edge → Atom: the neighbour / sender j.
    pub neighbor: Index,
    /// Edge → System.
    pub system: Index,
    /// Positions (Atom×3) the edges are measured on.
    pub(crate) positions: Tensor,
    /// For periodic images, what rebuilds the shifts.
    pub(crate) periodic: Option<EdgeShiftSource>,
}

/// The cell tensor, each edge's system for it and the graph's slot of the
/// shifts (`Graph::shift_arrays`).
pub(crate) type EdgeShiftSource = (Tensor, Index, usize);

impl Edges {
    /// `|r_j + S·cell − r_i|` (Edge×1, Å), differentiable w.r.t. positions
    /// and strain. Made on the first call and the same tensor afterwards.
    pub fn lengths<T: Scalar>(&self, g: &mut Graph<T>) -> Result<Tensor, EngineError> {
        let key = self.key();
        if let Some(&(_, t)) = g.lengths_memo.iter().find(|(k, _)| *k == key) {
            return Ok(t);
        }
        let periodic = self.periodic_shifts(g);
        let t = g.edge_lengths(self.positions, self.center, self.neighbor, periodic)?;
        g.lengths_memo.push((key, t));
        Ok(t)
    }

    /// `r_j + S·cell − r_i` (Edge×3, Å), differentiable w.r.t. positions and
    /// strain, with the same values the lengths are computed from. Each
    /// call adds an op to `g`: call once and keep the tensor.
    pub fn vectors<T: Scalar>(&self, g: &mut Graph<T>) -> Result<Tensor, EngineError> {
        let periodic = self.periodic_shifts(g);
        g.edge_vectors(self.positions, self.center, self.neighbor, periodic)
    }

    /// What tells these edges' lengths apart in the graph's memo.
    pub(crate) fn key(&self) -> [usize; 3] {
        [self.positions.id, self.center.id, self.neighbor.id]
    }

    pub(crate) fn periodic_shifts<T: Scalar>(&self, g: &Graph<T>) -> Option<PeriodicShifts> {
        self.periodic
            .map(|(cell, edge_system, slot)| PeriodicShifts {
                cell,
                shifts: g.shift_arrays[slot].clone(),
                edge_system,
            })
    }
}

/// Everything a model's forward pass receives.
#[derive(Debug, Clone)]
pub struct ModelInputs {
    /// Atom×3 positions (Å) after the strain, owned rows first then ghosts.
    pub positions: Tensor,
    /// (3·n_systems)×3 strained cell, rows are lattice vectors.
    pub cell: Tensor,
    /// Atomic numbers per local atom.
    pub numbers: Arc<Vec<u32>>,
    /// Atom → System.
    pub atom_system: Index,
    /// Systems in the batch (rows of per-system outputs).
    pub n_systems: usize,
    /// Periodicity per system as this process sees it (all false when
    /// decomposed: ghost images are explicit atoms).
    pub pbc: Vec<[bool; 3]>,
    /// The runtime's neighbour graph, when the model asked for one.
    pub edges: Option<Edges>,
}

/// What a model returns.
#[derive(Debug, Clone)]
pub struct ModelOutputs {
    /// Per-system energy (System×1, eV).
    pub energy: Tensor,
    /// Per-atom energies (Atom×1, eV), when the model has them.
    pub atomic_energies: Option<Tensor>,
    /// Further named outputs (charges, …).
    pub extra: Vec<(String, Tensor)>,
}

/// Which elements a model has parameters for.
#[derive(Debug, Clone, PartialEq)]
pub enum SpeciesSupport {
    /// Every Z from 1 to the given maximum.
    UpTo(u32),
    /// Exactly these Z.
    Listed(Vec<u32>),
}

impl SpeciesSupport {
    /// True when `z` is supported.
    pub fn contains(&self, z: u32) -> bool {
        match self {
            SpeciesSupport::UpTo(max) => (1..=*max).contains(&z),
            SpeciesSupport::Listed(list) => list.contains(&z),
        }
    }
}

/// Static facts about a model.
pub trait ModelInfo {
    /// Registry name (e.g. `schnet-demo`).
    fn name(&self) -> String;
    /// One line for `ddmlip models`.
    fn description(&self) -> String;
    /// Interaction cutoff (Å) of one message-passing step / the runtime graph.
    fn cutoff(&self) -> f64;
    /// Elements the model has parameters for.
    fn species(&self) -> SpeciesSupport;
    /// The distribution spec the model declares, if any.
    fn declared_spec(&self) -> Option<MLIPSpec> {
        None
    }
    /// Whether the runtime should build the neighbour graph (false for
    /// models that build their own inside `forward`).
    fn uses_runtime_graph(&self) -> bool {
        true
    }
    /// How many cutoffs of ghosts the model needs with its declared spec
    /// (message-passing models with per-layer exchange need 1).
    fn receptive_layers(&self) -> usize {
        1
    }
}

/// The forward pass, written once for both precisions.
pub trait ModelForward {
    /// Records the model on `g` from `inputs` and returns the output
    /// tensors: energy per system (eV) and, when the model has them, per-atom
    /// energies; forces and stress come from differentiating the energy.
    /// A model that reads values on the host while recording (its own
    /// neighbour search, say) calls [`Graph::ensure_host`] on them first:
    /// on a graph with a device they may live there only.
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError>;
}

/// An object-safe model (what registries hold).
pub trait Model: ModelInfo + Send + Sync {
    /// [`ModelForward::forward`] on an f64 graph.
    fn forward_f64(
        &self,
        g: &mut Graph<f64>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError>;
    /// [`ModelForward::forward`] on an f32 graph.
    fn forward_f32(
        &self,
        g: &mut Graph<f32>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError>;
}

impl<M: ModelInfo + ModelForward + Send + Sync> Model for M {
    fn forward_f64(
        &self,
        g: &mut Graph<f64>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        self.forward(g, inputs)
    }
    fn forward_f32(
        &self,
        g: &mut Graph<f32>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        self.forward(g, inputs)
    }
}

impl<'a> dyn Model + 'a {
    /// Runs the forward pass in the graph's precision.
    pub fn forward_any<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let any: &mut dyn Any = g;
        if let Some(g64) = any.downcast_mut::<Graph<f64>>() {
            return self.forward_f64(g64, inputs);
        }
        if let Some(g32) = any.downcast_mut::<Graph<f32>>() {
            return self.forward_f32(g32, inputs);
        }
        Err(EngineError::Input("unsupported element type".into()))
    }
}
