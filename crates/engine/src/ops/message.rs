//! Fused message passing: one kernel reads node rows at each edge's
//! neighbour, combines them with edge rows, and sums the messages onto each
//! edge's centre — without materialising per-edge messages. The dispatcher
//! sees it as a gather (node inputs) plus a scatter (output), so under
//! decomposition it gets exactly those handlers. Also row-wise custom ops:
//! kernels that act on each row independently, which need no exchange.

use crate::device::{DeviceBackend, DeviceError, DeviceMessageKernel};
use crate::graph::{NodeSpec, OpRecord};
use crate::ops::index::scatter_handler;
use crate::{EngineError, Graph, Index, KernelError, OpaqueKernel, RowDomain, Scalar, Tensor};
use ddmlip_spec::GatherMode;
use std::sync::Arc;

/// The slices a message kernel works on.
pub struct MessageInputs<'a, T> {
    /// Node tensors (n_rows × width each), read at `neighbor[e]`.
    pub nodes: Vec<&'a [T]>,
    /// Edge tensors (n_edges × width each).
    pub edges: Vec<&'a [T]>,
    /// Receiver row of each edge.
    pub center: &'a [u32],
    /// Sender row of each edge.
    pub neighbor: &'a [u32],
    /// Rows of the node tensors and of the output.
    pub n_rows: usize,
}

/// A fused gather → per-edge message → scatter-sum kernel.
pub trait MessageKernel<T: Scalar>: Send + Sync {
    /// Op name in traces.
    fn name(&self) -> &str;
    /// Output row width.
    fn out_cols(&self) -> usize;
    /// `out[i] = Σ_{e: center[e] = i} msg(nodes[neighbor[e]], edges[e])`;
    /// `out` is zeroed, unless [`Self::overwrites`] says the kernel writes
    /// every element itself.
    fn forward(&self, inputs: &MessageInputs<'_, T>, out: &mut [T]) -> Result<(), KernelError>;
    /// Adds gradients into `grad_nodes` / `grad_edges` (zeroed, one per
    /// input, unless [`Self::overwrites`]).
    fn backward(
        &self,
        inputs: &MessageInputs<'_, T>,
        grad_out: &[T],
        grad_nodes: &mut [Vec<T>],
        grad_edges: &mut [Vec<T>],
    ) -> Result<(), KernelError>;
    /// Whether `forward` writes every element of `out` and `backward` every
    /// element of each gradient, whatever they held: the engine then hands
    /// over recycled buffers without zeroing them first (a message of
    /// thousands of columns per atom is megabytes per call). Default
    /// `false`: the buffers are zeroed.
    fn overwrites(&self) -> bool {
        false
    }

    /// This kernel's implementation on `backend`'s device for these edges
    /// (`center`/`neighbor` rows of each edge, `n_rows` node rows), when it
    /// has one: on a graph with a device the op then runs there, forward
    /// and backward, traced as the same op. `None` (the default): the host.
    fn device_kernel(
        &self,
        _backend: &dyn DeviceBackend<T>,
        _edges: &MessageEdges<'_>,
    ) -> Result<Option<Arc<dyn DeviceMessageKernel<T>>>, DeviceError> {
        Ok(None)
    }
}

/// The edges a message kernel's device side is made for.
pub struct MessageEdges<'a> {
    /// Receiver row of each edge.
    pub center: &'a [u32],
    /// Sender row of each edge.
    pub neighbor: &'a [u32],
    /// Rows of the node inputs and of the output.
    pub n_rows: usize,
}

impl<T: Scalar> Graph<T> {
    /// Runs a fused message-passing kernel. Decomposed, node inputs are read
    /// like a gather (`halo_read` refreshes stale ghost rows first) and the
    /// output is combined like a scatter-add (the spec's scatter mode).
    pub fn message_passing(
        &mut self,
        kernel: Arc<dyn MessageKernel<T>>,
        nodes: &[Tensor],
        edges: &[Tensor],
        center: Index,
        neighbor: Index,
    ) -> Result<Tensor, EngineError> {
        let name = kernel.name().to_string();
        let n_rows = self.indices[center.id].target_rows;
        let n_edges = self.indices[center.id].values.len();
        if self.indices[neighbor.id].values.len() != n_edges
            || self.indices[neighbor.id].target_rows != n_rows
        {
            return Err(EngineError::shape(
                &name,
                "center and neighbor indices disagree",
            ));
        }
        for &t in nodes {
            if self.nodes[t.id].rows != n_rows {
                return Err(EngineError::shape(
                    &name,
                    format!(
                        "node input has {} rows, expected {n_rows}",
                        self.nodes[t.id].rows
                    ),
                ));
            }
        }
        for &t in edges {
            if self.nodes[t.id].rows != n_edges {
                return Err(EngineError::shape(
                    &name,
                    format!(
                        "edge input has {} rows, expected {n_edges}",
                        self.nodes[t.id].rows
                    ),
                ));
            }
        }
        let (gather_mode, scatter_mode) = match &self.dist {
            Some(d) if n_rows == d.n_local() => {
                (Some(d.spec().policy.gather), Some(d.spec().policy.scatter))
            }
            _ => (None, None),
        };
        let mut node_ins = nodes.to_vec();
        if gather_mode == Some(GatherMode::HaloRead) {
            for t in node_ins.iter_mut() {
                if !self.nodes[t.id].fresh {
                    *t = self.halo_refresh(*t, "gather:halo_read(refresh)")?;
                }
            }
        }
        let handler = scatter_mode.map(scatter_handler);
        if let Some(backend) = self.device_for_op() {
            let message_edges = MessageEdges {
                center: &self.indices[center.id].values,
                neighbor: &self.indices[neighbor.id].values,
                n_rows,
            };
            let on_device = kernel
                .device_kernel(backend.as_ref(), &message_edges)
                .map_err(|e| EngineError::device(&name, e))?;
            if let Some(dk) = on_device {
                let y = self.message_on_device(
                    backend,
                    dk,
                    (&name, kernel.out_cols()),
                    (&node_ins, edges),
                    (center, neighbor, n_rows),
                    (handler, scatter_mode.is_none()),
                )?;
                return match scatter_mode {
                    Some(mode) => self.land_scatter(y, center, mode),
                    None => Ok(y),
                };
            }
        }
        self.ensure_host(&node_ins)?;
        self.ensure_host(edges)?;
        let cols = kernel.out_cols();
        let overwrites = kernel.overwrites();
        let mut out = if overwrites {
            self.pool.for_overwrite(n_rows * cols)
        } else {
            self.pool.zeroed(n_rows * cols)
        };
        {
            let inputs = MessageInputs {
                nodes: node_ins
                    .iter()
                    .map(|t| self.nodes[t.id].value.as_slice())
                    .collect(),
                edges: edges
                    .iter()
                    .map(|t| self.nodes[t.id].value.as_slice())
                    .collect(),
                center: &self.indices[center.id].values,
                neighbor: &self.indices[neighbor.id].values,
                n_rows,
            };
            kernel
                .forward(&inputs, &mut out)
                .map_err(|source| EngineError::Kernel {
                    op: name.clone(),
                    source,
                })?;
        }
        let all: Vec<Tensor> = node_ins.iter().chain(edges).copied().collect();
        let n_nodes = node_ins.len();
        let spec = NodeSpec {
            op: format!("message:{name}"),
            rows: n_rows,
            cols,
            domain: RowDomain::Atom,
            fresh: scatter_mode.is_none(),
            replicated: false,
        };
        let k = kernel.clone();
        let all_in = all.clone();
        let y = self.push_op(
            spec,
            out,
            &all_in,
            &[neighbor, center],
            handler,
            Box::new(move |ctx, g| {
                let inputs = MessageInputs {
                    nodes: all[..n_nodes].iter().map(|&t| ctx.value(t)).collect(),
                    edges: all[n_nodes..].iter().map(|&t| ctx.value(t)).collect(),
                    center: ctx.index(center),
                    neighbor: ctx.index(neighbor),
                    n_rows,
                };
                let mut buffer = |len: usize| {
                    if overwrites {
                        ctx.for_overwrite(len)
                    } else {
                        ctx.zeroed(len)
                    }
                };
                let mut gn: Vec<Vec<T>> = inputs.nodes.iter().map(|s| buffer(s.len())).collect();
                let mut ge: Vec<Vec<T>> = inputs.edges.iter().map(|s| buffer(s.len())).collect();
                k.backward(&inputs, g, &mut gn, &mut ge)
                    .map_err(|source| EngineError::Kernel {
                        op: k.name().to_string(),
                        source,
                    })?;
                for (&t, gt) in all.iter().zip(gn.into_iter().chain(ge)) {
                    ctx.accumulate(t, gt);
                }
                Ok(())
            }),
        )?;
        // Every output row is a centre's (the kernel contract), so the
        // centre index says which rows the sums land on.
        match scatter_mode {
            Some(mode) => self.land_scatter(y, center, mode),
            None => Ok(y),
        }
    }

    /// [`Graph::message_passing`]'s op on the device: the same node (name,
    /// shape, handler), its value and backward there.
    fn message_on_device(
        &mut self,
        backend: Arc<dyn DeviceBackend<T>>,
        dk: Arc<dyn DeviceMessageKernel<T>>,
        (name, cols): (&str, usize),
        (nodes, edges): (&[Tensor], &[Tensor]),
        (center, neighbor, n_rows): (Index, Index, usize),
        (handler, fresh): (Option<&str>, bool),
    ) -> Result<Tensor, EngineError> {
        let all: Vec<Tensor> = nodes.iter().chain(edges).copied().collect();
        for &t in &all {
            self.ensure_device(&backend, t)?;
        }
        let dev_err = |e| EngineError::device(name, e);
        let mut out = backend.alloc(n_rows * cols).map_err(dev_err)?;
        {
            let (nv, ev) = (self.device_values(nodes)?, self.device_values(edges)?);
            dk.forward(backend.as_ref(), &nv, &ev, &mut out)
                .map_err(dev_err)?;
        }
        let spec = NodeSpec {
            op: format!("message:{name}"),
            rows: n_rows,
            cols,
            domain: RowDomain::Atom,
            fresh,
            replicated: false,
        };
        let n_nodes = nodes.len();
        let op = name.to_string();
        let record = OpRecord {
            inputs: &all,
            indices: &[neighbor, center],
            handler,
            reads: &all,
        };
        let all_b = all.clone();
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(&op)?;
                let values = all_b
                    .iter()
                    .map(|&t| ctx.device_value(t))
                    .collect::<Result<Vec<_>, _>>()?;
                let wants: Vec<bool> = all_b.iter().map(|&t| ctx.wants(t)).collect();
                let backend = ctx.backend(&op)?;
                let grads = dk
                    .backward(backend, &values[..n_nodes], &values[n_nodes..], g, &wants)
                    .map_err(|e| EngineError::device(&op, e))?;
                for (&t, grad) in all_b.iter().zip(grads) {
                    if let Some(grad) = grad {
                        ctx.device_add(&op, t, grad)?;
                    }
                }
                Ok(())
            }),
        )
    }

    /// Runs a kernel that maps each input row to an output row independently
    /// (a linear layer on irreps, a gate, edge features…). Row-local, so it
    /// needs no exchange: ghost rows stay as fresh as the inputs were.
    pub fn rowwise(
        &mut self,
        kernel: Arc<dyn OpaqueKernel<T>>,
        inputs: &[Tensor],
    ) -> Result<Tensor, EngineError> {
        let op = format!("rowwise:{}", kernel.name());
        self.push_kernel(kernel, inputs, op, None, true)
    }
}
