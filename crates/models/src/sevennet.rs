//! SevenNet checkpoints on the op engine: the `ddmlip-e3nn` kernels wrapped
//! as row-wise ops and one fused message-passing op per interaction layer,
//! so the dispatcher sees each layer's gather (neighbour features `h`) and
//! scatter (messages onto centres) and can run it decomposed.

use crate::registry::ModelError;
use crate::sevennet_device::{sevennet_device, SevenNetSource};
use ddmlip_e3nn::phases::{timed, Pass};
use ddmlip_e3nn::radial_table::{F32_TABLE_TOLERANCE, LENGTH_COLUMNS};
use ddmlip_e3nn::sevennet::{
    InteractionBlock, RadialInput, RadialInputGrad, Readout, SelfConnection, SevenNet,
    SevenNetWeights,
};
use ddmlip_e3nn::species_linear::SpeciesLinear;
use ddmlip_e3nn::{
    radial_conv_backward_with, radial_conv_forward_with, AffineLinear, BlockLayout, ConvGraph,
    E3nnError, EdgeRadial, FullyConnectedNet, Gate, RadialTable, Real,
};
use ddmlip_engine::device::{
    DeviceBackend, DeviceError, DeviceKernel, DeviceMessageKernel, RowAffine,
};
use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{DType, MessageEdges};
use ddmlip_engine::{
    EngineError, Graph, KernelError, MessageInputs, MessageKernel, Model, ModelInfo, ModelInputs,
    ModelOutputs, OpaqueKernel, RowDomain, Scalar, SpeciesSupport,
};
use ddmlip_spec::{GatherMode, MLIPSpec, ScatterMode};
use rayon::prelude::*;
use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// How a precision's path computes each layer's per-edge weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RadialEvaluation {
    /// The radial MLP on each edge's embedding (the network as written).
    Network,
    /// A table of quintic pieces of the whole radial network `r ↦ W(r)`,
    /// built from the network in f64 to within f32's rounding
    /// (`ddmlip_e3nn::radial_table::F32_TABLE_TOLERANCE`), read per edge
    /// length (`ddmlip_e3nn::RadialTable`).
    Table,
}

/// Per layer, the radial network's table in precision `T`.
type Tables<T> = Arc<Vec<RadialTable<T>>>;

/// A SevenNet potential read from its PyTorch checkpoint (any architecture
/// `ddmlip_e3nn::sevennet::SevenNetConfig` accepts), for one modality of a
/// multi-fidelity checkpoint.
pub struct SevenNetModel {
    name: String,
    description: String,
    f64_net: Arc<SevenNet<f64>>,
    f32_net: Arc<SevenNet<f32>>,
    /// The f32 path's radial evaluation (f64 always runs the network).
    f32_radial: RadialEvaluation,
    /// The f32 tables, built from the f64 network on first use.
    f32_tables: OnceLock<Result<Tables<f32>, String>>,
    /// The checkpoint, for devices that run SevenNet's kernels themselves.
    source: Arc<SevenNetSource>,
    /// The irreps linears' matrices, read off on a device's first use.
    dense: Arc<DenseCache>,
}

/// Per linear kernel (by name and precision), its matrix and bias: what
/// the linear runs as on a device. Read off the host kernel once
/// ([`RowAffine::probe`]) and kept for every later evaluation.
#[derive(Default)]
struct DenseCache(Mutex<HashMap<(String, DType), Arc<dyn Any + Send + Sync>>>);

impl DenseCache {
    fn get_or_probe<T: Scalar>(
        &self,
        name: &str,
        probe: impl FnOnce() -> Result<RowAffine<T>, E3nnError>,
    ) -> Result<Arc<RowAffine<T>>, DeviceError> {
        let key = (name.to_string(), T::DTYPE);
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = map
            .get(&key)
            .and_then(|a| a.clone().downcast::<RowAffine<T>>().ok())
        {
            return Ok(a);
        }
        let a = Arc::new(probe().map_err(|e| DeviceError(format!("{name}: {e}")))?);
        map.insert(key, a.clone());
        Ok(a)
    }
}

impl SevenNetModel {
    /// Loads and fixes up the checkpoint (sevenn's load-time patches
    /// included). `modal` picks the fidelity of a multi-fidelity checkpoint
    /// and must be `None` for others. Errors name the file and the config
    /// key, tensor or modality at fault.
    pub fn load(path: &Path, name: &str, modal: Option<&str>) -> Result<Self, ModelError> {
        let wrap = |source| ModelError::SevenNet {
            path: path.display().to_string(),
            source,
        };
        let weights = Arc::new(SevenNetWeights::from_checkpoint(path).map_err(wrap)?);
        let f64_net = SevenNet::<f64>::for_modal(&weights, modal).map_err(wrap)?;
        let f32_net = SevenNet::<f32>::for_modal(&weights, modal).map_err(wrap)?;
        let c = &weights.config;
        let lmax = c.node_irreps.iter().map(|i| i.lmax()).max().unwrap_or(0);
        let mut description = format!(
            "SevenNet checkpoint (sevenn {}): {} layers, l_max {lmax}, cutoff {} Å, {} elements",
            c.version,
            c.n_layers(),
            c.cutoff,
            c.species.len()
        );
        if let Some(m) = f64_net.modal() {
            description.push_str(&format!(", modal {m} of {}", c.modals.join("/")));
        }
        Ok(Self {
            name: name.to_string(),
            description,
            f64_net: Arc::new(f64_net),
            f32_net: Arc::new(f32_net),
            f32_radial: RadialEvaluation::Table,
            f32_tables: OnceLock::new(),
            source: Arc::new(SevenNetSource {
                weights,
                modal: modal.map(str::to_string),
            }),
            dense: Arc::default(),
        })
    }

    /// This model with the f32 path's per-edge weights computed by
    /// `radial` ([`RadialEvaluation::Table`] unless changed). The f64 path
    /// always evaluates the network.
    pub fn with_f32_radial(mut self, radial: RadialEvaluation) -> Self {
        self.f32_radial = radial;
        self
    }

    /// The f32 path's radial evaluation.
    pub fn f32_radial(&self) -> RadialEvaluation {
        self.f32_radial
    }

    /// The f32 tables of every layer (built on the first call, from the
    /// f64 network). Where they cannot be built (a radial network that is
    /// not finite on `[0, r_c]`, or that 256 intervals per cell do not
    /// follow closely enough) this says why, and the f32 path runs the
    /// network instead.
    pub fn f32_tables(&self) -> Result<Tables<f32>, EngineError> {
        self.f32_tables
            .get_or_init(|| {
                let emb = &self.f64_net.embedding;
                let tables: Result<Vec<_>, _> = self
                    .f64_net
                    .blocks
                    .par_iter()
                    .map(|b| RadialTable::<f32>::build(emb, &b.radial, F32_TABLE_TOLERANCE))
                    .collect();
                tables.map(Arc::new).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| EngineError::Input(format!("{}: {e}", self.name)))
    }

    /// The graph of one evaluation; `tables` (one per layer) replace the
    /// radial MLPs, the edges then carrying their lengths instead of the
    /// radial embedding.
    fn forward_impl<T: Scalar + Real>(
        &self,
        net: &Arc<SevenNet<T>>,
        tables: Option<Tables<T>>,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = inputs.edges.ok_or_else(|| {
            EngineError::Input(format!("{} needs the runtime neighbour graph", self.name))
        })?;
        let types: Vec<u32> = inputs
            .numbers
            .iter()
            .map(|&z| {
                net.type_index(z)
                    .map(|t| t as u32)
                    .map_err(|e| EngineError::Input(format!("{}: {e}", self.name)))
            })
            .collect::<Result<_, _>>()?;
        let n_types = net.species().len();
        let type_idx = g.index(
            Arc::new(types),
            RowDomain::Atom,
            RowDomain::None,
            n_types,
            "species_type",
        )?;
        g.push_scope("edge_embedding");
        let vectors = edges.vectors(g)?;
        let radial_input = if tables.is_some() {
            RadialInput::Length
        } else {
            RadialInput::Embedding
        };
        let feats = g.rowwise(
            Arc::new(EdgeFeaturesKernel {
                net: net.clone(),
                radial_input,
                source: self.source.clone(),
            }),
            &[vectors],
        )?;
        let (nb, nsh) = (net.radial_input_width(radial_input), net.sh_dim());
        let emb = g.slice_cols(feats, 0, nb)?;
        let sh = g.slice_cols(feats, nb, nb + nsh)?;
        g.pop_scope();
        let table = g.param(net.embedding_table(), n_types, net.dim_node_in())?;
        let mut x = g.gather(table, type_idx)?;
        // sevenn's node attribute, the species one-hot, read by `nequip`
        // self-connections.
        let needs_onehot = net
            .blocks
            .iter()
            .any(|b| matches!(b.self_connection, SelfConnection::Species(_)));
        let onehot = if needs_onehot {
            let mut identity = vec![0.0; n_types * n_types];
            for k in 0..n_types {
                identity[k * n_types + k] = 1.0;
            }
            let table = g.param(&identity, n_types, n_types)?;
            Some(g.gather(table, type_idx)?)
        } else {
            None
        };
        // The layers' convolutions run on the same edges: one CSR for all.
        let conv_graph = Arc::new(ConvGraphCache::default());
        for (t, block) in net.blocks.iter().enumerate() {
            g.push_scope(format!("interaction_{t}"));
            let sc = match (&block.self_connection, onehot) {
                (SelfConnection::Linear(linear), _) => g.rowwise(
                    Arc::new(LinearKernel {
                        dense: self.dense.clone(),
                        name: format!("{t}_self_connection"),
                        lin: AffineLinear {
                            linear: linear.clone(),
                            bias: None,
                        },
                        input_parts: None,
                    }),
                    &[x],
                )?,
                (SelfConnection::Species(species), Some(onehot)) => g.rowwise(
                    Arc::new(SpeciesLinearKernel {
                        name: format!("{t}_self_connection"),
                        lin: species.clone(),
                    }),
                    &[x, onehot],
                )?,
                (SelfConnection::Species(_), None) => {
                    return Err(EngineError::Input(format!(
                        "{}: the species one-hot was not built",
                        self.name
                    )))
                }
            };
            let h = g.rowwise(
                Arc::new(LinearKernel {
                    dense: self.dense.clone(),
                    name: format!("{t}_self_interaction_1"),
                    lin: block.linear_1.clone(),
                    input_parts: None,
                }),
                &[x],
            )?;
            // The message stays in the kernels' component-major layout from
            // the convolution to the linear that reads it (no transposed copy
            // of it, or of its gradient: 100 MB per layer at 8,000 atoms of
            // SevenNet-0) where the paths' output blocks tile the linear's
            // input blocks.
            let (message_layout, message_parts) =
                if block.conv.tiles_blocks_of(block.linear_2.irreps_in()) {
                    (
                        BlockLayout::ComponentMajor,
                        Some(block.conv.out_blocks().to_vec()),
                    )
                } else {
                    (BlockLayout::CopyMajor, None)
                };
            let conv = Arc::new(ConvKernel {
                name: format!("{t}_convolution"),
                net: net.clone(),
                layer: t,
                graph: conv_graph.clone(),
                message_layout,
                tables: tables.clone(),
                source: self.source.clone(),
            });
            let a = g.message_passing(conv, &[h], &[emb, sh], edges.center, edges.neighbor)?;
            let y = g.rowwise(
                Arc::new(LinearKernel {
                    dense: self.dense.clone(),
                    name: format!("{t}_self_interaction_2"),
                    lin: block.linear_2.clone(),
                    input_parts: message_parts,
                }),
                &[a],
            )?;
            let y = g.add(y, sc)?;
            x = g.rowwise(
                Arc::new(GateKernel {
                    name: format!("{t}_equivariant_gate"),
                    gate: block.gate.clone(),
                    source: self.source.clone(),
                    layer: t,
                }),
                &[y],
            )?;
            g.pop_scope();
        }
        g.push_scope("readout");
        let e = match &net.readout {
            Readout::Linears { hidden, energy } => {
                let q = g.rowwise(
                    Arc::new(LinearKernel {
                        dense: self.dense.clone(),
                        name: "reduce_input_to_hidden".into(),
                        lin: hidden.clone(),
                        input_parts: None,
                    }),
                    &[x],
                )?;
                g.rowwise(
                    Arc::new(LinearKernel {
                        dense: self.dense.clone(),
                        name: "reduce_hidden_to_energy".into(),
                        lin: energy.clone(),
                        input_parts: None,
                    }),
                    &[q],
                )?
            }
            Readout::Mlp(mlp) => g.rowwise(
                Arc::new(FcnKernel {
                    name: "readout_FCN".into(),
                    net: mlp.clone(),
                }),
                &[x],
            )?,
        };
        let scale_t = g.param(net.scale(), n_types, 1)?;
        let shift_t = g.param(net.shift(), n_types, 1)?;
        let s = g.gather(scale_t, type_idx)?;
        let b = g.gather(shift_t, type_idx)?;
        let e = g.mul(e, s)?;
        let atomic = g.add(e, b)?;
        g.pop_scope();
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

impl ModelInfo for SevenNetModel {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn description(&self) -> String {
        self.description.clone()
    }
    fn cutoff(&self) -> f64 {
        self.f64_net.cutoff()
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::Listed(self.f64_net.species().to_vec())
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        // Owned-centre edges make owned messages complete; ghosts' features
        // are refreshed where the next convolution reads them (h, ≤ 480 wide)
        // instead of after each scatter (messages, up to 3136 wide).
        let mut s = MLIPSpec::standard_energy_model();
        s.policy.scatter = ScatterMode::Local;
        s.policy.gather = GatherMode::HaloRead;
        Some(s)
    }
    fn receptive_layers(&self) -> usize {
        self.f64_net.blocks.len()
    }
}

impl Model for SevenNetModel {
    fn forward_f64(
        &self,
        g: &mut Graph<f64>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        self.forward_impl(&self.f64_net, None, g, inputs)
    }
    fn forward_f32(
        &self,
        g: &mut Graph<f32>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        // A network the tables cannot follow runs as it is (`f32_tables`
        // reports why): slower, never less exact. A device with SevenNet's
        // kernels evaluates the network itself.
        let on_device = g
            .device_backend()
            .is_some_and(|b| sevennet_device(b.as_ref()).is_some());
        let tables = match self.f32_radial {
            RadialEvaluation::Table if !on_device => self.f32_tables().ok(),
            _ => None,
        };
        self.forward_impl(&self.f32_net, tables, g, inputs)
    }
}

fn kernel_err(e: E3nnError) -> KernelError {
    KernelError::failed(e)
}

/// Edges per parallel chunk of the edge-features kernel.
const EDGE_ROWS: usize = 2048;

/// Edge vectors (E×3) → radial input (the embedding, n_basis columns, or
/// the length as `LENGTH_COLUMNS`) ‖ spherical harmonics ((l_max+1)²).
struct EdgeFeaturesKernel<T> {
    net: Arc<SevenNet<T>>,
    radial_input: RadialInput,
    source: Arc<SevenNetSource>,
}

fn as_vec3<T: Copy>(v: &[T]) -> Vec<[T; 3]> {
    v.chunks(3).map(|c| [c[0], c[1], c[2]]).collect()
}

impl<T: Scalar + Real> OpaqueKernel<T> for EdgeFeaturesKernel<T> {
    // Every row of the output is written (the radial input, then the
    // SH), and every element of the vectors' gradient assigned.
    fn writes_every_output(&self) -> bool {
        true
    }
    fn backward_assigns(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        "sevennet_edge_features"
    }
    // The device's kernel computes the embedding (not the tables' lengths).
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<T>,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        match (self.radial_input, sevennet_device(backend)) {
            (RadialInput::Embedding, Some(d)) => d.edge_features(&self.source),
            _ => Ok(None),
        }
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        Ok((
            RowDomain::Edge,
            inputs[0].1,
            self.net.radial_input_width(self.radial_input) + self.net.sh_dim(),
        ))
    }
    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        timed(self.name(), Pass::Forward, 0.0, || {
            let (nb, nsh) = (
                self.net.radial_input_width(self.radial_input),
                self.net.sh_dim(),
            );
            let width = nb + nsh;
            // Chunk by chunk over the threads: each edge's features depend
            // on its vector alone, and each chunk writes its own rows.
            out.par_chunks_mut(EDGE_ROWS * width.max(1))
                .zip(inputs[0].par_chunks(EDGE_ROWS * 3))
                .try_for_each(|(rows, v)| {
                    let f = self
                        .net
                        .edge_inputs(&as_vec3(v), self.radial_input)
                        .map_err(kernel_err)?;
                    for (e, row) in rows.chunks_exact_mut(width.max(1)).enumerate() {
                        match self.radial_input {
                            RadialInput::Embedding => {
                                row[..nb].copy_from_slice(&f.emb[e * nb..(e + 1) * nb])
                            }
                            // The length as the table reads it: rounded, and the rest.
                            RadialInput::Length => {
                                row[..nb].copy_from_slice(&[f.lengths[e], f.lengths_lo[e]])
                            }
                        }
                        row[nb..].copy_from_slice(&f.sh[e * nsh..(e + 1) * nsh]);
                    }
                    Ok(())
                })
        })
    }
    fn backward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let (nb, nsh) = (
            self.net.radial_input_width(self.radial_input),
            self.net.sh_dim(),
        );
        let width = nb + nsh;
        let run = || -> Result<(), KernelError> {
            grads[0]
                .par_chunks_mut(EDGE_ROWS * 3)
                .zip(inputs[0].par_chunks(EDGE_ROWS * 3))
                .zip(g.par_chunks(EDGE_ROWS * width.max(1)))
                .try_for_each(|((grad, v), g)| {
                    let v = as_vec3(v);
                    let mut ge = Vec::with_capacity(v.len() * nb);
                    let mut gs = Vec::with_capacity(v.len() * nsh);
                    for row in g.chunks_exact(width.max(1)) {
                        ge.extend_from_slice(&row[..nb]);
                        gs.extend_from_slice(&row[nb..]);
                    }
                    // A table's gradient is the length's, in the hi column.
                    let g_len: Vec<T>;
                    let ge = match self.radial_input {
                        RadialInput::Embedding => RadialInputGrad::Embedding(&ge[..]),
                        RadialInput::Length => {
                            g_len = ge.iter().step_by(LENGTH_COLUMNS).copied().collect();
                            RadialInputGrad::Length(&g_len[..])
                        }
                    };
                    let gv = self
                        .net
                        .edge_inputs_backward(&v, ge, &gs)
                        .map_err(kernel_err)?;
                    for (dst, src) in grad.chunks_exact_mut(3).zip(gv) {
                        dst.copy_from_slice(&src);
                    }
                    Ok(())
                })
        };
        Some(timed(self.name(), Pass::Backward, 0.0, run))
    }
}

/// An e3nn `Linear` on irreps (plus a modality's constant row), row by row.
struct LinearKernel<T> {
    /// Where the matrices read off for devices are kept.
    dense: Arc<DenseCache>,
    name: String,
    lin: AffineLinear<T>,
    /// `None`: the input rows in e3nn's layout. `Some(parts)`: stored
    /// component-major by these `(offset, mul, dim)` parts, as the
    /// convolution writes its message (`ConvPaths::out_blocks`).
    input_parts: Option<Vec<(usize, usize, usize)>>,
}

impl<T: Scalar + Real> OpaqueKernel<T> for LinearKernel<T> {
    // The e3nn kernel assigns every element of its output and of the
    // input's gradient: no zeroing pass over either (node features are
    // megabytes per layer).
    fn writes_every_output(&self) -> bool {
        true
    }
    fn backward_assigns(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        &self.name
    }
    // On a device: one GEMM with the matrix this kernel's own forward
    // gives on the unit rows (in its input layout), plus its bias row.
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<T>,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        let (din, dout) = (self.lin.irreps_in().dim(), self.lin.irreps_out().dim());
        let affine = self.dense.get_or_probe(&self.name, || {
            RowAffine::probe(din, dout, |x: &[T], n, out: &mut [T]| {
                match &self.input_parts {
                    None => self.lin.forward(x, n, out),
                    Some(parts) => self.lin.forward_component_major(x, parts, n, out),
                }
            })
        })?;
        Ok(Some(Arc::new(affine.to_device(backend)?)))
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        if inputs[0].2 != self.lin.irreps_in().dim() {
            return Err(KernelError::Columns {
                expected: self.lin.irreps_in().dim(),
                got: inputs[0].2,
            });
        }
        Ok((inputs[0].0, inputs[0].1, self.lin.irreps_out().dim()))
    }
    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        let flops = (self.lin.linear.flops_per_row() * shapes[0].1) as f64;
        timed(&self.name, Pass::Forward, flops, || {
            match &self.input_parts {
                None => self.lin.forward(inputs[0], shapes[0].1, out),
                Some(parts) => self
                    .lin
                    .forward_component_major(inputs[0], parts, shapes[0].1, out),
            }
            .map_err(kernel_err)
        })
    }
    fn backward(
        &self,
        _inputs: &[&[T]],
        shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let flops = (self.lin.linear.flops_per_row() * shapes[0].1) as f64;
        Some(timed(&self.name, Pass::Backward, flops, || {
            match &self.input_parts {
                None => self.lin.backward(g, shapes[0].1, &mut grads[0]),
                Some(parts) => {
                    self.lin
                        .backward_component_major(g, shapes[0].1, &mut grads[0], parts)
                }
            }
            .map_err(kernel_err)
        }))
    }
}

/// The `nequip` self-connection: inputs the features and the species
/// one-hot (N × n_types), one e3nn Linear per species. The one-hot is a
/// constant of the structure, so its gradient is left at zero.
struct SpeciesLinearKernel<T> {
    name: String,
    lin: SpeciesLinear<T>,
}

impl<T: Scalar + Real> OpaqueKernel<T> for SpeciesLinearKernel<T> {
    // The features' gradient and the output are assigned element by
    // element by the e3nn kernel; the one-hot's gradient (a constant of
    // the structure) is left zero, as the default protocol has it.
    fn writes_every_output(&self) -> bool {
        true
    }
    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        for (grad, _) in grads.iter_mut().zip(fresh).skip(1).filter(|(_, &f)| f) {
            grad.fill(T::ZERO);
        }
        self.backward(inputs, shapes, g, grads)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let (dx, dt) = (self.lin.irreps_in().dim(), self.lin.n_types());
        if inputs.len() != 2 || inputs[0].2 != dx || inputs[1].2 != dt || inputs[0].1 != inputs[1].1
        {
            return Err(KernelError::Inputs {
                expected: format!("features (N × {dx}) and a species one-hot (N × {dt})"),
            });
        }
        Ok((inputs[0].0, inputs[0].1, self.lin.irreps_out().dim()))
    }
    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        let flops = (self.lin.flops_per_row() * shapes[0].1) as f64;
        timed(&self.name, Pass::Forward, flops, || {
            let types = self
                .lin
                .types_of(inputs[1], shapes[1].1)
                .map_err(kernel_err)?;
            self.lin.forward(inputs[0], &types, out).map_err(kernel_err)
        })
    }
    fn backward(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        let run = || -> Result<(), KernelError> {
            let types = self
                .lin
                .types_of(inputs[1], shapes[1].1)
                .map_err(kernel_err)?;
            self.lin
                .backward(g, &types, &mut grads[0])
                .map_err(kernel_err)
        };
        let flops = (self.lin.flops_per_row() * shapes[0].1) as f64;
        Some(timed(&self.name, Pass::Backward, flops, run))
    }
}

/// The fully connected readout (`readout_as_fcn`): N × dim → N × 1.
struct FcnKernel<T> {
    name: String,
    net: FullyConnectedNet<T>,
}

impl<T: Scalar + Real> OpaqueKernel<T> for FcnKernel<T> {
    // The e3nn kernel assigns every element of its output and of the
    // input's gradient: no zeroing pass over either (node features are
    // megabytes per layer).
    fn writes_every_output(&self) -> bool {
        true
    }
    fn backward_assigns(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        if inputs[0].2 != self.net.dim_in() {
            return Err(KernelError::Columns {
                expected: self.net.dim_in(),
                got: inputs[0].2,
            });
        }
        Ok((inputs[0].0, inputs[0].1, self.net.dim_out()))
    }
    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        timed(&self.name, Pass::Forward, 0.0, || {
            self.net
                .forward(inputs[0], shapes[0].1, out)
                .map_err(kernel_err)
        })
    }
    fn backward(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        Some(timed(&self.name, Pass::Backward, 0.0, || {
            self.net
                .backward(inputs[0], g, shapes[0].1, &mut grads[0])
                .map_err(kernel_err)
        }))
    }
}

/// The e3nn gate (normalised activations on scalars and gates).
struct GateKernel {
    name: String,
    gate: Gate,
    source: Arc<SevenNetSource>,
    layer: usize,
}

impl<T: Scalar + Real> OpaqueKernel<T> for GateKernel {
    // The e3nn kernel assigns every element of its output and of the
    // input's gradient: no zeroing pass over either (node features are
    // megabytes per layer).
    fn writes_every_output(&self) -> bool {
        true
    }
    fn backward_assigns(&self) -> bool {
        true
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        Ok((inputs[0].0, inputs[0].1, self.gate.dim_out()))
    }
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<T>,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        match sevennet_device(backend) {
            Some(d) => d.gate(&self.source, self.layer),
            None => Ok(None),
        }
    }
    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        timed(&self.name, Pass::Forward, 0.0, || {
            self.gate
                .forward(inputs[0], shapes[0].1, out)
                .map_err(kernel_err)
        })
    }
    fn backward(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        g: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        Some(timed(&self.name, Pass::Backward, 0.0, || {
            self.gate
                .backward(inputs[0], g, shapes[0].1, &mut grads[0])
                .map_err(kernel_err)
        }))
    }
}

/// The receiver- and sender-sorted views of the edges, built by the first
/// convolution of an evaluation and reused by the other layers' forward and
/// backward (building them is serial, O(edges), and was repeated ten times
/// a step). Every call checks that its edges are the cached ones, so a call
/// on other rows or edges builds (and caches) its own.
#[derive(Default)]
struct ConvGraphCache(Mutex<Option<Arc<ConvGraph>>>);

impl ConvGraphCache {
    fn get(
        &self,
        n_rows: usize,
        center: &[u32],
        neighbor: &[u32],
    ) -> Result<Arc<ConvGraph>, KernelError> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = slot.as_ref() {
            if g.n_rows() == n_rows && g.centers() == center && g.neighbors() == neighbor {
                return Ok(g.clone());
            }
        }
        let g = Arc::new(ConvGraph::new(n_rows, center, neighbor).map_err(kernel_err)?);
        *slot = Some(g.clone());
        Ok(g)
    }
}

/// Radial MLP + uvu tensor product + aggregation of one layer, fused.
struct ConvKernel<T> {
    name: String,
    net: Arc<SevenNet<T>>,
    layer: usize,
    graph: Arc<ConvGraphCache>,
    /// How the message rows' blocks are stored (see the linear reading them).
    message_layout: BlockLayout,
    /// Per layer, the radial tables that replace the MLPs (the edges then
    /// carry lengths).
    tables: Option<Tables<T>>,
    source: Arc<SevenNetSource>,
}

impl<T: Scalar + Real> ConvKernel<T> {
    fn block(&self) -> &InteractionBlock<T> {
        &self.net.blocks[self.layer]
    }

    /// The layer's per-edge weights: its table, or its radial MLP.
    fn radial(&self) -> EdgeRadial<'_, T> {
        match &self.tables {
            Some(t) => EdgeRadial::Table(&t[self.layer]),
            None => EdgeRadial::Network(&self.block().radial),
        }
    }

    /// FLOPs per edge of the radial MLP's GEMMs (or of the table's quintic,
    /// 6 multiply-adds per weight) and of the tensor products' forward, as
    /// `bench/sevennet0_flops.py` counts them.
    fn flops_per_edge(&self) -> (f64, f64) {
        let b = self.block();
        let radial = match self.radial() {
            EdgeRadial::Network(m) => m.flops_per_row(),
            EdgeRadial::Table(t) => 12 * t.dim_out(),
        };
        (radial as f64, b.conv.flops_per_edge() as f64)
    }
}

impl<T: Scalar + Real> MessageKernel<T> for ConvKernel<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn out_cols(&self) -> usize {
        self.block().conv.dim_msg()
    }
    fn forward(&self, x: &MessageInputs<'_, T>, out: &mut [T]) -> Result<(), KernelError> {
        let (mlp, tp) = self.flops_per_edge();
        let flops = x.center.len() as f64 * (mlp + tp);
        timed(&self.name, Pass::Forward, flops, || {
            let b = self.block();
            let graph = self.graph.get(x.n_rows, x.center, x.neighbor)?;
            radial_conv_forward_with(
                &b.conv,
                self.radial(),
                b.denominator,
                &graph,
                x.nodes[0],
                x.edges[0],
                x.edges[1],
                self.message_layout,
                out,
            )
            .map_err(kernel_err)
        })
    }
    fn backward(
        &self,
        x: &MessageInputs<'_, T>,
        g: &[T],
        gn: &mut [Vec<T>],
        ge: &mut [Vec<T>],
    ) -> Result<(), KernelError> {
        // The backward recomputes the radial MLP's forward, then runs every
        // product again for its input gradients (the weights are constants).
        let (mlp, tp) = self.flops_per_edge();
        let flops = x.center.len() as f64 * (2.0 * mlp + tp);
        timed(&self.name, Pass::Backward, flops, || {
            let b = self.block();
            let graph = self.graph.get(x.n_rows, x.center, x.neighbor)?;
            let (gemb, gsh) = ge.split_at_mut(1);
            radial_conv_backward_with(
                &b.conv,
                self.radial(),
                b.denominator,
                &graph,
                x.nodes[0],
                x.edges[0],
                x.edges[1],
                g,
                self.message_layout,
                &mut gn[0],
                &mut gemb[0],
                &mut gsh[0],
            )
            .map_err(kernel_err)
        })
    }
    /// The fused convolution writes every message row (zero where a row
    /// has no edges) and every row of the feature, embedding and SH
    /// gradients.
    fn overwrites(&self) -> bool {
        true
    }
    // The device's kernels evaluate the radial network (no tables).
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<T>,
        edges: &MessageEdges<'_>,
    ) -> Result<Option<Arc<dyn DeviceMessageKernel<T>>>, DeviceError> {
        match (&self.tables, sevennet_device(backend)) {
            (None, Some(d)) => d.convolution(&self.source, self.layer, self.message_layout, edges),
            _ => Ok(None),
        }
    }
}
