//! Demo models: one per distribution pattern that a real MLIP exhibits.
//! Each accepts every element Z = 1–94 and has deterministic weights.

use crate::init::Weights;
use ddmlip_engine::ops::{Radial, Unary};
use ddmlip_engine::{
    EngineError, Graph, Index, ModelForward, ModelInfo, ModelInputs, ModelOutputs, RowDomain,
    Scalar, SpeciesSupport, Tensor,
};
use ddmlip_spec::{MLIPSpec, OutputKind};

/// Highest atomic number the demo models have parameters for.
pub const DEMO_MAX_Z: u32 = 94;

fn species_index<T: Scalar>(g: &mut Graph<T>, inputs: &ModelInputs) -> Result<Index, EngineError> {
    g.index(
        inputs.numbers.clone(),
        RowDomain::Atom,
        RowDomain::None,
        DEMO_MAX_Z as usize + 1,
        "species",
    )
}

fn need_edges(inputs: &ModelInputs, model: &str) -> Result<ddmlip_engine::Edges, EngineError> {
    inputs
        .edges
        .ok_or_else(|| EngineError::Input(format!("{model} needs the runtime neighbour graph")))
}

/// A per-species column table (95 rows × cols) from a seed, entries `base + spread·u`.
fn species_table(seed: u64, cols: usize, base: f64, spread: f64) -> Vec<f64> {
    let mut w = Weights::new(seed);
    (0..(DEMO_MAX_Z as usize + 1) * cols)
        .map(|_| base + spread * w.uniform())
        .collect()
}

/// One parameter per atom: a one-column [`species_table`] (`seed`, `base`,
/// `spread`) as a graph parameter, gathered by each atom's species index.
fn per_species<T: Scalar>(
    g: &mut Graph<T>,
    species: Index,
    seed: u64,
    base: f64,
    spread: f64,
) -> Result<Tensor, EngineError> {
    let table = g.param(
        &species_table(seed, 1, base, spread),
        DEMO_MAX_Z as usize + 1,
        1,
    )?;
    g.gather(table, species)
}

/// Species-weighted Gaussian radial symmetry functions `G_ik = Σ_j s_Zj exp(−η (r − r_k)²) f_c(r)`.
fn radial_descriptors<T: Scalar>(
    g: &mut Graph<T>,
    inputs: &ModelInputs,
    species: Index,
    cutoff: f64,
    k: usize,
    seed: u64,
) -> Result<Tensor, EngineError> {
    let edges = need_edges(inputs, "descriptor")?;
    let lengths = edges.lengths(g)?;
    let centers: Vec<f64> = (0..k)
        .map(|i| 0.8 + (cutoff - 1.3) * i as f64 / (k - 1).max(1) as f64)
        .collect();
    let rbf = g.radial(
        lengths,
        Radial::Gaussian {
            centers,
            gamma: 2.0,
        },
    )?;
    let fc = g.radial(lengths, Radial::CosineCutoff { cutoff })?;
    let s_atom = per_species(g, species, seed, 1.0, 0.3)?;
    let s_j = g.gather(s_atom, edges.neighbor)?;
    let w = g.mul(fc, s_j)?;
    let terms = g.mul(rbf, w)?;
    g.scatter_add(terms, edges.center)
}

fn standard_spec(extra_per_atom: &[&str]) -> MLIPSpec {
    let mut s = MLIPSpec::standard_energy_model();
    for name in extra_per_atom {
        s.output_kinds.insert(name.to_string(), OutputKind::PerAtom);
    }
    s
}

/// EAM-style two-stage many-body model: a density `ρ_i = Σ_j a_Zj e^{−β(r/r₀−1)} f_c`
/// fed into an embedding `F(ρ) = −c_Zi(√(ρ+0.01) − 0.1)`, plus a pair repulsion.
#[derive(Debug, Clone)]
pub struct EamDemo {
    /// Interaction cutoff (Å): atoms farther apart do not interact.
    pub cutoff: f64,
}

impl Default for EamDemo {
    fn default() -> Self {
        Self { cutoff: 5.0 }
    }
}

impl ModelInfo for EamDemo {
    fn name(&self) -> String {
        "eam-demo".into()
    }
    fn description(&self) -> String {
        "EAM-style density + embedding model (two-stage many-body), cutoff 5 Å".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(DEMO_MAX_Z)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(standard_spec(&[]))
    }
}

impl ModelForward for EamDemo {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = need_edges(inputs, "eam-demo")?;
        let lengths = edges.lengths(g)?;
        let species = species_index(g, inputs)?;
        let r0 = 2.5;
        let fc = g.radial(
            lengths,
            Radial::CosineCutoff {
                cutoff: self.cutoff,
            },
        )?;
        let x = g.unary(lengths, Unary::Scale(1.0 / r0))?;
        let x = g.unary(x, Unary::AddScalar(-1.0))?;
        // Density contribution of neighbour j.
        g.push_scope("density");
        let a_atom = per_species(g, species, 11, 1.0, 0.3)?;
        let a_j = g.gather(a_atom, edges.neighbor)?;
        let f = g.unary(x, Unary::Scale(-3.0))?;
        let f = g.unary(f, Unary::Exp)?;
        let f = g.mul(f, fc)?;
        let f = g.mul(f, a_j)?;
        let rho = g.scatter_add(f, edges.center)?;
        g.pop_scope();
        g.push_scope("embedding");
        let c_atom = per_species(g, species, 12, 1.0, 0.3)?;
        let sq = g.unary(rho, Unary::AddScalar(0.01))?;
        let sq = g.unary(sq, Unary::Sqrt)?;
        let sq = g.unary(sq, Unary::AddScalar(-0.1))?;
        let emb = g.mul(sq, c_atom)?;
        let emb = g.unary(emb, Unary::Neg)?;
        g.pop_scope();
        g.push_scope("pair");
        let b_atom = per_species(g, species, 13, 0.5, 0.2)?;
        let b_i = g.gather(b_atom, edges.center)?;
        let b_j = g.gather(b_atom, edges.neighbor)?;
        let bb = g.mul(b_i, b_j)?;
        let p = g.unary(x, Unary::Scale(-6.0))?;
        let p = g.unary(p, Unary::Exp)?;
        let p = g.mul(p, fc)?;
        let p = g.mul(p, bb)?;
        let p = g.scale(p, 0.5)?;
        let pair = g.scatter_add(p, edges.center)?;
        g.pop_scope();
        let atomic = g.add(emb, pair)?;
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

/// Behler–Parrinello-style model: species-weighted radial symmetry functions
/// into a per-atom network. Strictly local (one scatter, no message passing).
#[derive(Debug, Clone)]
pub struct BpDemo {
    /// Interaction cutoff (Å): atoms farther apart do not interact.
    pub cutoff: f64,
}

impl Default for BpDemo {
    fn default() -> Self {
        Self { cutoff: 5.0 }
    }
}

impl ModelInfo for BpDemo {
    fn name(&self) -> String {
        "bp-demo".into()
    }
    fn description(&self) -> String {
        "Behler–Parrinello-style descriptor network (strictly local), cutoff 5 Å".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(DEMO_MAX_Z)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(standard_spec(&[]))
    }
}

impl ModelForward for BpDemo {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let species = species_index(g, inputs)?;
        g.push_scope("descriptor");
        let desc = radial_descriptors(g, inputs, species, self.cutoff, 8, 21)?;
        let feat = g.unary(desc, Unary::AddScalar(1.0))?;
        let feat = g.unary(feat, Unary::Ln)?;
        g.pop_scope();
        g.push_scope("network");
        let mut w = Weights::new(22);
        let w1 = g.param(&w.matrix(8, 16, 1.5), 8, 16)?;
        let b1 = g.param(&w.matrix(1, 16, 0.5), 1, 16)?;
        let w2 = g.param(&w.matrix(16, 1, 1.0), 16, 1)?;
        let h = g.linear(feat, w1, Some(b1))?;
        let h = g.tanh(h)?;
        let e = g.matmul(h, w2)?;
        let bias_atom = per_species(g, species, 23, -3.0, 1.0)?;
        let atomic = g.add(e, bias_atom)?;
        g.pop_scope();
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

/// SchNet-style message-passing network with continuous filters and
/// `layers` interaction blocks (3 by default): each block reads neighbour
/// features, so ghosts need a fresh copy per layer.
#[derive(Debug, Clone)]
pub struct SchNetDemo {
    /// Interaction cutoff (Å): atoms farther apart do not interact.
    pub cutoff: f64,
    /// Width of the per-atom feature vectors.
    pub features: usize,
    /// Interaction blocks (each needs one fresh ghost exchange).
    pub layers: usize,
    /// Gaussian radial basis functions expanding each distance.
    pub n_rbf: usize,
}

impl Default for SchNetDemo {
    fn default() -> Self {
        Self {
            cutoff: 5.0,
            features: 32,
            layers: 3,
            n_rbf: 16,
        }
    }
}

impl ModelInfo for SchNetDemo {
    fn name(&self) -> String {
        "schnet-demo".into()
    }
    fn description(&self) -> String {
        format!(
            "SchNet-style MPNN, {} interaction layers, {} features, cutoff {} Å",
            self.layers, self.features, self.cutoff
        )
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(DEMO_MAX_Z)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(standard_spec(&[]))
    }
    fn receptive_layers(&self) -> usize {
        self.layers
    }
}

/// The parameters of a [`SchNetDemo`] as its forward pass uses them:
/// row-major matrices (`rows × cols` as named), `f` = features, `k` =
/// radial functions, `Z` = 95 species rows (atomic numbers 0–94).
#[derive(Debug, Clone, PartialEq)]
pub struct SchNetWeights {
    /// Interaction cutoff (Å).
    pub cutoff: f64,
    /// Width `f` of the per-atom features.
    pub features: usize,
    /// Gaussian centres μ (Å), `k` of them, evenly spaced from 0 to the cutoff.
    pub rbf_centers: Vec<f64>,
    /// Gaussian width γ (1/Å²): functions `exp(−γ (r − μ)²)`.
    pub rbf_gamma: f64,
    /// Species embedding, `Z × f`, read by atomic number.
    pub embedding: Vec<f64>,
    /// The interaction blocks, in order.
    pub layers: Vec<SchNetLayerWeights>,
    /// Readout, `f × f/2`, then a shifted softplus.
    pub readout_1: Vec<f64>,
    /// Readout, `f/2 × 1`.
    pub readout_2: Vec<f64>,
    /// Per-species energy offset (eV), `Z` values, read by atomic number.
    pub species_bias: Vec<f64>,
}

/// One SchNet interaction block: filter `W = ssp(rbf·filter_1 + b)·filter_2 ·
/// f_c(r)`, message `Σ_j (x_j·input) ⊙ W_ij`, update `x += ssp(m·output_1 +
/// b)·output_2` (ssp: shifted softplus `ln(½eˣ + ½)`).
#[derive(Debug, Clone, PartialEq)]
pub struct SchNetLayerWeights {
    /// `k × f`.
    pub filter_1: Vec<f64>,
    /// `f`.
    pub filter_1_bias: Vec<f64>,
    /// `f × f`.
    pub filter_2: Vec<f64>,
    /// `f × f`, applied to the features before the message.
    pub input: Vec<f64>,
    /// `f × f`.
    pub output_1: Vec<f64>,
    /// `f`.
    pub output_1_bias: Vec<f64>,
    /// `f × f`.
    pub output_2: Vec<f64>,
}

impl SchNetDemo {
    /// The model's deterministic parameters (the same numbers its forward
    /// pass puts in the graph, from the same seeded streams).
    pub fn weights(&self) -> SchNetWeights {
        let (f, k) = (self.features, self.n_rbf);
        let mut w = Weights::new(31);
        let embedding = w.matrix(1, (DEMO_MAX_Z as usize + 1) * f, 1.0);
        let spacing = self.cutoff / (k - 1) as f64;
        let layers = (0..self.layers)
            .map(|_| SchNetLayerWeights {
                filter_1: w.matrix(k, f, 1.0),
                filter_1_bias: w.matrix(1, f, 0.1),
                filter_2: w.matrix(f, f, 1.0),
                input: w.matrix(f, f, 1.0),
                output_1: w.matrix(f, f, 1.0),
                output_1_bias: w.matrix(1, f, 0.1),
                output_2: w.matrix(f, f, 0.5),
            })
            .collect();
        SchNetWeights {
            cutoff: self.cutoff,
            features: f,
            rbf_centers: (0..k).map(|i| i as f64 * spacing).collect(),
            rbf_gamma: 0.5 / (spacing * spacing),
            embedding,
            layers,
            readout_1: w.matrix(f, f / 2, 1.0),
            readout_2: w.matrix(f / 2, 1, 1.0),
            species_bias: species_table(32, 1, -3.0, 1.0),
        }
    }
}

impl ModelForward for SchNetDemo {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = need_edges(inputs, "schnet-demo")?;
        let lengths = edges.lengths(g)?;
        let species = species_index(g, inputs)?;
        let wts = self.weights();
        let (f, k) = (self.features, self.n_rbf);
        let table = g.param(&wts.embedding, DEMO_MAX_Z as usize + 1, f)?;
        let mut x = g.gather(table, species)?;
        let rbf = g.radial(
            lengths,
            Radial::Gaussian {
                centers: wts.rbf_centers.clone(),
                gamma: wts.rbf_gamma,
            },
        )?;
        let fc = g.radial(
            lengths,
            Radial::CosineCutoff {
                cutoff: self.cutoff,
            },
        )?;
        for (layer, lw) in wts.layers.iter().enumerate() {
            g.push_scope(format!("interaction_{layer}"));
            let wf1 = g.param(&lw.filter_1, k, f)?;
            let bf1 = g.param(&lw.filter_1_bias, 1, f)?;
            let wf2 = g.param(&lw.filter_2, f, f)?;
            let win = g.param(&lw.input, f, f)?;
            let wo1 = g.param(&lw.output_1, f, f)?;
            let bo1 = g.param(&lw.output_1_bias, 1, f)?;
            let wo2 = g.param(&lw.output_2, f, f)?;
            let filt = g.linear(rbf, wf1, Some(bf1))?;
            let filt = g.shifted_softplus(filt)?;
            let filt = g.matmul(filt, wf2)?;
            let filt = g.mul(filt, fc)?;
            let xl = g.matmul(x, win)?;
            let xj = g.gather(xl, edges.neighbor)?;
            let m = g.mul(xj, filt)?;
            let agg = g.scatter_add(m, edges.center)?;
            let v = g.linear(agg, wo1, Some(bo1))?;
            let v = g.shifted_softplus(v)?;
            let v = g.matmul(v, wo2)?;
            x = g.add(x, v)?;
            g.pop_scope();
        }
        g.push_scope("readout");
        let r1 = g.param(&wts.readout_1, f, f / 2)?;
        let r2 = g.param(&wts.readout_2, f / 2, 1)?;
        let h = g.matmul(x, r1)?;
        let h = g.shifted_softplus(h)?;
        let e = g.matmul(h, r2)?;
        let bias_table = g.param(&wts.species_bias, DEMO_MAX_Z as usize + 1, 1)?;
        let bias_atom = g.gather(bias_table, species)?;
        let atomic = g.add(e, bias_atom)?;
        g.pop_scope();
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

/// Charge-equilibration toy: electronegativities from local descriptors,
/// charges `q_i = −(χ_i − ⟨χ⟩_system)/J` through a per-system mean (a system
/// reduction inside the model that feeds back into atom features), then a
/// screened Coulomb-like pair term `½ q_i q_j f_c(r)/√(r²+1)`.
#[derive(Debug, Clone)]
pub struct QeqDemo {
    /// Interaction cutoff (Å): atoms farther apart do not interact.
    pub cutoff: f64,
}

impl Default for QeqDemo {
    fn default() -> Self {
        Self { cutoff: 5.0 }
    }
}

impl ModelInfo for QeqDemo {
    fn name(&self) -> String {
        "qeq-demo".into()
    }
    fn description(&self) -> String {
        "charge-equilibration toy: per-system mean electronegativity feeds back into charges, cutoff 5 Å".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(DEMO_MAX_Z)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(standard_spec(&["charges"]))
    }
}

impl ModelForward for QeqDemo {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = need_edges(inputs, "qeq-demo")?;
        let lengths = edges.lengths(g)?;
        let species = species_index(g, inputs)?;
        let hardness = 2.0;
        g.push_scope("descriptor");
        let desc = radial_descriptors(g, inputs, species, self.cutoff, 6, 41)?;
        let feat = g.unary(desc, Unary::AddScalar(1.0))?;
        let feat = g.unary(feat, Unary::Ln)?;
        g.pop_scope();
        g.push_scope("equilibration");
        let mut w = Weights::new(42);
        let wc = g.param(&w.matrix(6, 1, 1.0), 6, 1)?;
        let chi0_atom = per_species(g, species, 43, 0.0, 1.0)?;
        let chi = g.matmul(feat, wc)?;
        let chi = g.add(chi, chi0_atom)?;
        let n_local = inputs.numbers.len();
        let ones = g.constant(vec![T::one(); n_local], n_local, 1, RowDomain::Atom);
        let count = g.segment_sum(ones, inputs.atom_system)?;
        let total = g.segment_sum(chi, inputs.atom_system)?;
        let mean = g.div(total, count)?;
        let mean_atom = g.gather(mean, inputs.atom_system)?;
        let dev = g.sub(chi, mean_atom)?;
        let q = g.scale(dev, -1.0 / hardness)?;
        g.pop_scope();
        g.push_scope("electrostatics");
        let q2 = g.unary(q, Unary::Square)?;
        let e_self = g.scale(q2, 0.5 * hardness)?;
        let q_i = g.gather(q, edges.center)?;
        let q_j = g.gather(q, edges.neighbor)?;
        let qq = g.mul(q_i, q_j)?;
        let r2 = g.unary(lengths, Unary::Square)?;
        let r2 = g.unary(r2, Unary::AddScalar(1.0))?;
        let kern = g.unary(r2, Unary::Powf(-0.5))?;
        let fc = g.radial(
            lengths,
            Radial::CosineCutoff {
                cutoff: self.cutoff,
            },
        )?;
        let kern = g.mul(kern, fc)?;
        let pair = g.mul(qq, kern)?;
        let pair = g.scale(pair, 0.5)?;
        let e_pair = g.scatter_add(pair, edges.center)?;
        g.pop_scope();
        g.push_scope("network");
        let w1 = g.param(&w.matrix(6, 8, 1.5), 6, 8)?;
        let w2 = g.param(&w.matrix(8, 1, 1.0), 8, 1)?;
        let h = g.matmul(feat, w1)?;
        let h = g.tanh(h)?;
        let e_net = g.matmul(h, w2)?;
        let bias_atom = per_species(g, species, 44, -3.0, 1.0)?;
        let e_net = g.add(e_net, bias_atom)?;
        g.pop_scope();
        let atomic = g.add(e_net, e_self)?;
        let atomic = g.add(atomic, e_pair)?;
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![("charges".into(), q)],
        })
    }
}
