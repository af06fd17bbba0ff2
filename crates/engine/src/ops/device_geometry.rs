//! The geometry ops on the device (see [`crate::device`]): strained rows
//! and edge vectors or lengths, with their gradients — so that a model's
//! inputs, from the strained positions to each edge's length, stay on the
//! device.

use crate::device::{DeviceBackend, DeviceEdges, DeviceError, DeviceMem, GeometrySource};
use crate::graph::{BackwardCtx, NodeSpec, OpRecord};
use crate::ops::edge_geometry::EdgeGeometry;
use crate::{EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use std::sync::Arc;

type Backend<T> = Arc<dyn DeviceBackend<T>>;

fn dev_err(op: &str) -> impl Fn(DeviceError) -> EngineError + '_ {
    move |e| EngineError::device(op, e)
}

/// What an edge op's backward keeps of its geometry on the device: the
/// periodic shifts and, for an f32 graph with exact values, the f64
/// positions and cell.
pub(crate) struct DeviceGeometry {
    positions: Tensor,
    cell: Option<Tensor>,
    /// Edge → system (periodic edges).
    pub(crate) edge_system: Option<Index>,
    shifts: Option<Arc<DeviceMem>>,
    exact: Option<(Arc<DeviceMem>, Option<Arc<DeviceMem>>)>,
    count: usize,
}

impl DeviceGeometry {
    /// The edges' device arrays, read through `index` (the graph's or a
    /// backward context's device copy of an index).
    pub(crate) fn edges<'a>(
        &'a self,
        (center, neighbor): (&'a DeviceMem, &'a DeviceMem),
        system: Option<&'a DeviceMem>,
    ) -> DeviceEdges<'a> {
        DeviceEdges {
            center,
            neighbor,
            periodic: self.shifts.as_deref().zip(system),
            count: self.count,
        }
    }

    /// The source of the vectors: the exact f64 arrays when kept, else the
    /// tensors' device values (`value`).
    pub(crate) fn source<'a>(
        &'a self,
        value: impl Fn(Tensor) -> Result<&'a DeviceMem, EngineError>,
    ) -> Result<GeometrySource<'a>, EngineError> {
        Ok(match &self.exact {
            Some((p, c)) => GeometrySource {
                positions: p,
                cell: c.as_deref(),
                exact: true,
            },
            None => GeometrySource {
                positions: value(self.positions)?,
                cell: self.cell.map(&value).transpose()?,
                exact: false,
            },
        })
    }
}

impl<T: Scalar> Graph<T> {
    /// The periodic shifts on the device (uploaded once per array).
    fn device_shifts(
        &mut self,
        backend: &Backend<T>,
        shifts: &Arc<Vec<[i32; 3]>>,
    ) -> Result<Arc<DeviceMem>, EngineError> {
        if let Some((_, m)) = self
            .device_shifts
            .iter()
            .find(|(s, _)| Arc::ptr_eq(s, shifts))
        {
            return Ok(Arc::clone(m));
        }
        // Two's complement: the kernels read the bits back as `i32`.
        let bits: Vec<u32> = shifts.iter().flatten().map(|&s| s as u32).collect();
        let m = Arc::new(
            backend
                .upload_indices(&bits)
                .map_err(dev_err("periodic shifts"))?,
        );
        self.device_shifts
            .push((Arc::clone(shifts), Arc::clone(&m)));
        Ok(m)
    }

    /// An edge op's geometry on the device: its positions and cell there,
    /// the shifts uploaded (once per array), an f32 graph's exact f64
    /// positions and cell uploaded.
    pub(crate) fn device_geometry(
        &mut self,
        backend: &Backend<T>,
        geo: &EdgeGeometry,
        op: &str,
    ) -> Result<DeviceGeometry, EngineError> {
        self.ensure_device(backend, geo.positions)?;
        let (cell, edge_system, shifts) = match &geo.periodic {
            Some(p) => {
                self.ensure_device(backend, p.cell)?;
                let shifts = self.device_shifts(backend, &p.shifts)?;
                (Some(p.cell), Some(p.edge_system), Some(shifts))
            }
            None => (None, None, None),
        };
        let exact = match &geo.exact {
            Some(x) => {
                let up = |v: &[f64]| backend.upload_f64(v).map(Arc::new).map_err(dev_err(op));
                let cell = x.cell.as_deref().map(|c| up(c)).transpose()?;
                Some((up(&x.positions)?, cell))
            }
            None => None,
        };
        Ok(DeviceGeometry {
            positions: geo.positions,
            cell,
            edge_system,
            shifts,
            exact,
            count: geo.ci.len(),
        })
    }

    /// Edge vectors and/or lengths of `dg`'s edges into device memory.
    pub(crate) fn run_edge_geometry(
        &self,
        backend: &Backend<T>,
        dg: &DeviceGeometry,
        (center, neighbor): (Index, Index),
        vectors: Option<&mut DeviceMem>,
        lengths: Option<&mut DeviceMem>,
    ) -> Result<(), EngineError> {
        let ends = (
            self.device_index(backend, center)?,
            self.device_index(backend, neighbor)?,
        );
        let system = dg
            .edge_system
            .map(|s| self.device_index(backend, s))
            .transpose()?;
        let edges = dg.edges(ends, system);
        let source = dg.source(|t| self.device_value(t))?;
        backend
            .edge_geometry(&edges, source, vectors, lengths)
            .map_err(dev_err("edge geometry"))
    }

    /// [`Graph::edge_vectors`] (`lengths` false) and [`Graph::edge_lengths`]
    /// on the device, after the halo handling `geo` carries.
    pub(crate) fn edge_op_device(
        &mut self,
        backend: Backend<T>,
        geo: EdgeGeometry,
        (center, neighbor): (Index, Index),
        lengths: bool,
    ) -> Result<Tensor, EngineError> {
        let op = if lengths {
            "edge_lengths"
        } else {
            "edge_vectors"
        };
        let count = geo.ci.len();
        let dg = self.device_geometry(&backend, &geo, op)?;
        let cols = if lengths { 1 } else { 3 };
        let mut out = backend.alloc(count * cols).map_err(dev_err(op))?;
        {
            let (vectors, lengths_out) = if lengths {
                (None, Some(&mut out))
            } else {
                (Some(&mut out), None)
            };
            self.run_edge_geometry(&backend, &dg, (center, neighbor), vectors, lengths_out)?;
        }
        let spec = NodeSpec {
            op: op.into(),
            rows: count,
            cols,
            domain: RowDomain::Edge,
            fresh: true,
            replicated: false,
        };
        let (inputs, idxs) = geo.inputs(center, neighbor);
        let output = Tensor {
            id: self.nodes.len(),
        };
        let mut reads = inputs.clone();
        reads.push(output);
        let record = OpRecord {
            inputs: &inputs,
            indices: &idxs,
            handler: geo.handler,
            reads: &reads,
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(op)?;
                let backend = ctx.backend(op)?;
                let ends = (ctx.device_index(center)?, ctx.device_index(neighbor)?);
                let system = dg.edge_system.map(|s| ctx.device_index(s)).transpose()?;
                let edges = dg.edges(ends, system);
                // Each edge's vector gradient (edges × 3).
                let rows_mem;
                let rows = if lengths {
                    let source = dg.source(|t| ctx.device_value(t))?;
                    let mut r = backend.alloc(count * 3).map_err(dev_err(op))?;
                    backend
                        .length_gradient_rows(&edges, source, g, ctx.device_value(output)?, &mut r)
                        .map_err(dev_err(op))?;
                    rows_mem = r;
                    &rows_mem
                } else {
                    g
                };
                edge_rows_backward(ctx, &dg, (center, neighbor), &edges, rows, op)
            }),
        )
    }

    /// [`Graph::apply_strain`] on the device.
    pub(crate) fn apply_strain_device(
        &mut self,
        backend: Backend<T>,
        x: Tensor,
        eps: Tensor,
        idx: Index,
    ) -> Result<Tensor, EngineError> {
        let op = "apply_strain";
        let rows = self.nodes[x.id].rows;
        // The f64 values behind the output are strained on the host (from
        // the strain's host value), as the host op does.
        let exact = if self.exact_values_of(x).is_some() {
            self.ensure_host(&[eps])?;
            let ids = self.indices[idx.id].values.clone();
            self.strained_exact_values(x, eps, &ids)
        } else {
            None
        };
        self.ensure_device(&backend, x)?;
        self.ensure_device(&backend, eps)?;
        let mut out = backend.alloc(rows * 3).map_err(dev_err(op))?;
        backend
            .strain_rows(
                self.device_value(x)?,
                self.device_value(eps)?,
                self.device_index(&backend, idx)?,
                &mut out,
            )
            .map_err(dev_err(op))?;
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: op.into(),
            rows,
            cols: 3,
            domain: nx.domain,
            fresh: nx.fresh,
            replicated: nx.replicated,
        };
        let output = Tensor {
            id: self.nodes.len(),
        };
        let record = OpRecord {
            inputs: &[x, eps],
            indices: &[idx],
            handler: None,
            reads: &[x, eps, output],
        };
        let t = self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(op)?;
                let system = ctx.device_index(idx)?;
                let ev = ctx.device_value(eps)?;
                if ctx.wants(x) {
                    ctx.device_accumulate(op, x, |d, acc, add| {
                        d.strain_rows_grad(ev, system, g, acc, add)
                    })?;
                }
                if ctx.wants(eps) {
                    let backend = ctx.backend(op)?;
                    let mut terms = backend.alloc(rows * 9).map_err(dev_err(op))?;
                    backend
                        .row_outer(ctx.device_value(x)?, g, &mut terms)
                        .map_err(dev_err(op))?;
                    let csr = ctx.device_csr(idx)?;
                    ctx.device_accumulate(op, eps, |d, acc, add| {
                        d.sum_rows_csr(&terms, 9, csr, acc, add)
                    })?;
                }
                Ok(())
            }),
        )?;
        if let Some(exact) = exact {
            self.exact_values.push((t.id, Arc::new(exact)));
        }
        Ok(t)
    }
}

/// Lands edge vectors' gradient `rows` (edges × 3): + at each edge's
/// neighbour, − at its centre (sums over the two inverse maps), and
/// `S ⊗ row` into its system's cell.
pub(crate) fn edge_rows_backward<T: Scalar>(
    ctx: &mut BackwardCtx<'_, T>,
    dg: &DeviceGeometry,
    (center, neighbor): (Index, Index),
    edges: &DeviceEdges<'_>,
    rows: &DeviceMem,
    op: &str,
) -> Result<(), EngineError> {
    let backend = ctx.backend(op)?;
    if ctx.wants(dg.positions) {
        let (as_neighbor, as_center) = (ctx.device_csr(neighbor)?, ctx.device_csr(center)?);
        let n_rows = as_center.targets;
        let mut outgoing = backend.alloc(n_rows * 3).map_err(dev_err(op))?;
        backend
            .sum_rows_csr(rows, 3, as_center, &mut outgoing, false)
            .map_err(dev_err(op))?;
        ctx.device_accumulate(op, dg.positions, |d, acc, add| {
            d.sum_rows_csr(rows, 3, as_neighbor, acc, add)?;
            d.axpy(-1.0, &outgoing, acc, true)
        })?;
    }
    if let (Some(cell), Some(system)) = (dg.cell, dg.edge_system) {
        if ctx.wants(cell) {
            let mut terms = backend.alloc(dg.count * 9).map_err(dev_err(op))?;
            backend
                .shift_outer(edges, rows, &mut terms)
                .map_err(dev_err(op))?;
            let csr = ctx.device_csr(system)?;
            ctx.device_accumulate(op, cell, |d, acc, add| {
                d.sum_rows_csr(&terms, 9, csr, acc, add)
            })?;
        }
    }
    Ok(())
}
