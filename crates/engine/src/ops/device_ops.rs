//! The device side of the generic ops (see [`crate::device`]): where a
//! tensor lives, transfers, and the ops that have a device kernel —
//! element-wise maps, binary ops with broadcasting, gathers, scatters,
//! per-system sums, matrix products and radial bases — each with its
//! backward on the device. The host ops next to them define the meaning;
//! these compute the same values (the same op names, shapes and domains on
//! the tape and in traces).

use crate::device::{DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceCsr, DeviceMem};
use crate::device::{DeviceError, GemmShape};
use crate::graph::{NodeSpec, OpRecord};
use crate::ops::{Radial, Unary};
use crate::{EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use std::sync::Arc;

/// What a device op needs to run: its backend.
type Backend<T> = Arc<dyn DeviceBackend<T>>;

fn dev_err(op: &str) -> impl Fn(DeviceError) -> EngineError + '_ {
    move |e| EngineError::device(op, e)
}

impl<T: Scalar> Graph<T> {
    /// Runs, from now on, every op that has a device kernel on `backend`
    /// (see [`crate::device`]); the others stay on the host. Decomposed,
    /// the distributed handlers' exchanges (halo refresh, reverse sums,
    /// all-reduces) run on the host, between device ops.
    pub fn set_device(&mut self, backend: Arc<dyn DeviceBackend<T>>) {
        self.backend = Some(backend);
    }

    /// The device of [`Graph::set_device`], by name (`cuda:0`).
    pub fn device_name(&self) -> Option<String> {
        self.backend.as_ref().map(|b| b.name())
    }

    /// The backend of [`Graph::set_device`], when the graph has one.
    pub fn device_backend(&self) -> Option<Arc<dyn DeviceBackend<T>>> {
        self.backend.clone()
    }

    /// Whether `t`'s value is on the device (it may be on the host too).
    pub fn is_on_device(&self, t: Tensor) -> bool {
        self.nodes[t.id].device.is_some()
    }

    /// The backend when the next op may run on the device.
    pub(crate) fn device_for_op(&self) -> Option<Backend<T>> {
        self.backend.clone()
    }

    /// Makes host copies of the values of `ts` that are only on the device
    /// (downloaded once; the device copy stays): what a host op or a caller
    /// reading [`Graph::value`] needs first. Nothing to do without a device.
    pub fn ensure_host(&mut self, ts: &[Tensor]) -> Result<(), EngineError> {
        let Some(backend) = self.backend.clone() else {
            return Ok(());
        };
        self.check_live(ts)?;
        for t in ts {
            let node = &self.nodes[t.id];
            let len = node.rows * node.cols;
            let Some(mem) = &node.device else { continue };
            if node.value.len() == len {
                continue;
            }
            let mut host = self.pool.for_overwrite(len);
            backend
                .download(mem, &mut host)
                .map_err(dev_err(&node.op))?;
            self.live_bytes += len * std::mem::size_of::<T>();
            self.nodes[t.id].value = host;
        }
        Ok(())
    }

    /// Makes a device copy of `t`'s value when it has none (uploaded once).
    pub(crate) fn ensure_device(
        &mut self,
        backend: &Backend<T>,
        t: Tensor,
    ) -> Result<(), EngineError> {
        self.check_live(&[t])?;
        let node = &self.nodes[t.id];
        if node.device.is_some() {
            return Ok(());
        }
        let mem = backend.upload(&node.value).map_err(dev_err(&node.op))?;
        self.live_bytes += mem.len() * std::mem::size_of::<T>();
        self.nodes[t.id].device = Some(mem);
        Ok(())
    }

    pub(crate) fn device_value(&self, t: Tensor) -> Result<&DeviceMem, EngineError> {
        self.nodes[t.id]
            .device
            .as_ref()
            .ok_or_else(|| EngineError::Device {
                op: self.nodes[t.id].op.clone(),
                message: "the value is not on the device".into(),
            })
    }

    /// The device copies of `ts`' values (each must have one).
    pub(crate) fn device_values(&self, ts: &[Tensor]) -> Result<Vec<&DeviceMem>, EngineError> {
        ts.iter().map(|&t| self.device_value(t)).collect()
    }

    pub(crate) fn device_index(
        &self,
        backend: &Backend<T>,
        i: Index,
    ) -> Result<&DeviceMem, EngineError> {
        self.indices[i.id].device_values(backend.as_ref())
    }

    pub(crate) fn device_csr(
        &self,
        backend: &Backend<T>,
        i: Index,
    ) -> Result<&DeviceCsr, EngineError> {
        self.indices[i.id].device_csr(backend.as_ref(), Vec::new)
    }

    /// Records a device op's output (see [`Graph::push_op_stored`]).
    pub(crate) fn push_device(
        &mut self,
        spec: NodeSpec,
        out: DeviceMem,
        op: OpRecord<'_>,
        backward: crate::graph::BackwardFn<T>,
    ) -> Result<Tensor, EngineError> {
        self.push_op_stored(spec, Vec::new(), Some(out), op, backward)
    }

    /// [`Graph::unary`] on the device.
    pub(crate) fn unary_device(
        &mut self,
        backend: Backend<T>,
        x: Tensor,
        f: Unary,
    ) -> Result<Tensor, EngineError> {
        let op = f.name();
        self.ensure_device(&backend, x)?;
        let n = &self.nodes[x.id];
        let (rows, cols) = (n.rows, n.cols);
        let mut out = backend.alloc(rows * cols).map_err(dev_err(op))?;
        backend
            .unary(f, self.device_value(x)?, &mut out)
            .map_err(dev_err(op))?;
        let n = &self.nodes[x.id];
        let spec = NodeSpec {
            op: op.to_string(),
            rows,
            cols,
            domain: n.domain,
            fresh: n.fresh,
            replicated: n.replicated,
        };
        let y = Tensor {
            id: self.nodes.len(),
        };
        let (reads_x, reads_y) = f.derivative_reads();
        let reads: Vec<Tensor> = [(reads_x, x), (reads_y, y)]
            .into_iter()
            .filter(|&(r, _)| r)
            .map(|(_, t)| t)
            .collect();
        let record = OpRecord {
            inputs: &[x],
            indices: &[],
            handler: None,
            reads: &reads,
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let g = ctx.device_out_grad(op)?;
                // A value the derivative does not read may be released:
                // the gradient stands in for it, unread.
                let xv = if reads_x { ctx.device_value(x)? } else { g };
                let yv = if reads_y { ctx.device_value(y)? } else { g };
                ctx.device_accumulate(op, x, |b, acc, add| b.unary_grad(f, xv, yv, g, acc, add))
            }),
        )
    }

    /// [`Graph::add`], [`Graph::sub`], [`Graph::mul`] on the device, `b`
    /// broadcast by `bc` against the `rows × cols` `a`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn binary_device(
        &mut self,
        backend: Backend<T>,
        (a, b): (Tensor, Tensor),
        kind: DeviceBinary,
        bc: DeviceBroadcast,
        spec: NodeSpec,
    ) -> Result<Tensor, EngineError> {
        let op: &'static str = match kind {
            DeviceBinary::Add => "add",
            DeviceBinary::Sub => "sub",
            DeviceBinary::Mul => "mul",
        };
        self.ensure_device(&backend, a)?;
        self.ensure_device(&backend, b)?;
        let (rows, cols) = (spec.rows, spec.cols);
        let len = rows * cols;
        let mut out = backend.alloc(len).map_err(dev_err(op))?;
        backend
            .binary(
                kind,
                self.device_value(a)?,
                self.device_value(b)?,
                bc,
                rows,
                cols,
                &mut out,
                false,
            )
            .map_err(dev_err(op))?;
        let (wants_a, wants_b) = (
            self.nodes[a.id].requires_grad,
            self.nodes[b.id].requires_grad,
        );
        let mul = kind == DeviceBinary::Mul;
        let reads: Vec<Tensor> = [(mul && wants_b, a), (mul && wants_a, b)]
            .into_iter()
            .filter(|&(r, _)| r)
            .map(|(_, t)| t)
            .collect();
        let record = OpRecord {
            inputs: &[a, b],
            indices: &[],
            handler: None,
            reads: &reads,
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(op)?;
                if ctx.wants(a) {
                    if mul {
                        let bv = ctx.device_value(b)?;
                        ctx.device_accumulate(op, a, |d, acc, add| {
                            d.binary(DeviceBinary::Mul, g, bv, bc, rows, cols, acc, add)
                        })?;
                    } else {
                        ctx.device_accumulate(op, a, |d, acc, add| d.axpy(1.0, g, acc, add))?;
                    }
                }
                if ctx.wants(b) {
                    let backend = ctx.backend(op)?;
                    // The terms of b's gradient, one per element of a.
                    let terms = match kind {
                        DeviceBinary::Add => None,
                        DeviceBinary::Sub => {
                            let mut t = backend.alloc(len).map_err(dev_err(op))?;
                            backend.axpy(-1.0, g, &mut t, false).map_err(dev_err(op))?;
                            Some(t)
                        }
                        DeviceBinary::Mul => {
                            let av = ctx.device_value(a)?;
                            let mut t = backend.alloc(len).map_err(dev_err(op))?;
                            backend
                                .binary(
                                    DeviceBinary::Mul,
                                    g,
                                    av,
                                    DeviceBroadcast::Full,
                                    rows,
                                    cols,
                                    &mut t,
                                    false,
                                )
                                .map_err(dev_err(op))?;
                            Some(t)
                        }
                    };
                    let terms = terms.as_ref().unwrap_or(g);
                    ctx.device_accumulate(op, b, |d, acc, add| match bc {
                        DeviceBroadcast::Full => d.axpy(1.0, terms, acc, add),
                        DeviceBroadcast::PerRow => d.row_sums(terms, rows, cols, acc, add),
                        DeviceBroadcast::PerCol => d.col_sums(terms, rows, cols, acc, add),
                        DeviceBroadcast::Scalar => d.col_sums(terms, len, 1, acc, add),
                    })?;
                }
                Ok(())
            }),
        )
    }

    /// [`Graph::gather`] on the device, after its distributed handler
    /// (`handler`, when one fired) refreshed the ghost rows.
    pub(crate) fn gather_device(
        &mut self,
        backend: Backend<T>,
        x: Tensor,
        idx: Index,
        handler: Option<&str>,
    ) -> Result<Tensor, EngineError> {
        let op = "gather";
        self.ensure_device(&backend, x)?;
        let (_, cols) = self.shape(x);
        let (rows, domain) = {
            let ix = &self.indices[idx.id];
            (ix.values.len(), ix.domain)
        };
        let mut out = backend.alloc(rows * cols).map_err(dev_err(op))?;
        backend
            .gather_rows(
                self.device_value(x)?,
                cols,
                self.device_index(&backend, idx)?,
                &mut out,
            )
            .map_err(dev_err(op))?;
        let nx = &self.nodes[x.id];
        let spec = NodeSpec {
            op: op.into(),
            rows,
            cols,
            domain,
            fresh: true,
            replicated: nx.replicated && domain != RowDomain::Atom && domain != RowDomain::Edge,
        };
        let record = OpRecord {
            inputs: &[x],
            indices: &[idx],
            handler,
            reads: &[],
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                let g = ctx.device_out_grad(op)?;
                let csr = ctx.device_csr(idx)?;
                ctx.device_accumulate(op, x, |d, acc, add| d.sum_rows_csr(g, cols, csr, acc, add))
            }),
        )
    }

    /// [`Graph::scatter_add`] (`op` = `scatter_add`) and
    /// [`Graph::segment_sum`] (`segment_sum`) on the device: `out[t] = Σ
    /// src[s]` over the rows `s` that `idx` sends to `t`. `(handler,
    /// fresh)`: the distributed handler that lands the sums (its exchanges
    /// follow on the host) and whether the output's ghost rows are current.
    pub(crate) fn scatter_device(
        &mut self,
        backend: Backend<T>,
        src: Tensor,
        idx: Index,
        op: &'static str,
        (handler, fresh): (Option<&str>, bool),
    ) -> Result<Tensor, EngineError> {
        self.ensure_device(&backend, src)?;
        let (rows_src, cols) = self.shape(src);
        let (rows, domain, n_values) = {
            let ix = &self.indices[idx.id];
            (ix.target_rows, ix.target, ix.values.len())
        };
        if n_values != rows_src {
            return Err(EngineError::shape(
                op,
                format!("the index has {n_values} entries but the source has {rows_src} rows"),
            ));
        }
        let mut out = backend.alloc(rows * cols).map_err(dev_err(op))?;
        backend
            .sum_rows_csr(
                self.device_value(src)?,
                cols,
                self.device_csr(&backend, idx)?,
                &mut out,
                false,
            )
            .map_err(dev_err(op))?;
        let spec = NodeSpec {
            op: op.into(),
            rows,
            cols,
            domain,
            fresh,
            replicated: false,
        };
        let record = OpRecord {
            inputs: &[src],
            indices: &[idx],
            handler,
            reads: &[],
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                if !ctx.wants(src) {
                    return Ok(());
                }
                let g = ctx.device_out_grad(op)?;
                let index = ctx.device_index(idx)?;
                ctx.device_accumulate(op, src, |d, acc, add| {
                    if add {
                        let mut t = d.alloc(rows_src * cols)?;
                        d.gather_rows(g, cols, index, &mut t)?;
                        d.axpy(1.0, &t, acc, true)
                    } else {
                        d.gather_rows(g, cols, index, acc)
                    }
                })
            }),
        )
    }

    /// [`Graph::matmul`] on the device.
    pub(crate) fn matmul_device(
        &mut self,
        backend: Backend<T>,
        a: Tensor,
        b: Tensor,
        (m, k, n): (usize, usize, usize),
    ) -> Result<Tensor, EngineError> {
        let op = "matmul";
        self.ensure_device(&backend, a)?;
        self.ensure_device(&backend, b)?;
        let mut out = backend.alloc(m * n).map_err(dev_err(op))?;
        let shape = GemmShape {
            m,
            k,
            n,
            a_transposed: false,
            b_transposed: false,
        };
        backend
            .gemm(
                shape,
                self.device_value(a)?,
                self.device_value(b)?,
                &mut out,
                false,
            )
            .map_err(dev_err(op))?;
        let (na, nb) = (&self.nodes[a.id], &self.nodes[b.id]);
        let spec = NodeSpec {
            op: op.into(),
            rows: m,
            cols: n,
            domain: na.domain,
            fresh: na.fresh,
            replicated: na.replicated && nb.replicated,
        };
        let mut reads = Vec::new();
        if nb.requires_grad {
            reads.push(a);
        }
        if na.requires_grad {
            reads.push(b);
        }
        let record = OpRecord {
            inputs: &[a, b],
            indices: &[],
            handler: None,
            reads: &reads,
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(op)?;
                if ctx.wants(a) {
                    // ga (m×k) = g (m×n) · bᵀ
                    let bv = ctx.device_value(b)?;
                    let shape = GemmShape {
                        m,
                        k: n,
                        n: k,
                        a_transposed: false,
                        b_transposed: true,
                    };
                    ctx.device_accumulate(op, a, |d, acc, add| d.gemm(shape, g, bv, acc, add))?;
                }
                if ctx.wants(b) {
                    // gb (k×n) = aᵀ (k×m) · g (m×n)
                    let av = ctx.device_value(a)?;
                    let shape = GemmShape {
                        m: k,
                        k: m,
                        n,
                        a_transposed: true,
                        b_transposed: false,
                    };
                    ctx.device_accumulate(op, b, |d, acc, add| d.gemm(shape, av, g, acc, add))?;
                }
                Ok(())
            }),
        )
    }

    /// [`Graph::radial`] on the device: values and derivatives in one
    /// kernel, the derivatives kept for the backward.
    pub(crate) fn radial_device(
        &mut self,
        backend: Backend<T>,
        d: Tensor,
        f: Radial,
        (rows, k): (usize, usize),
    ) -> Result<Tensor, EngineError> {
        let op = f.name();
        self.ensure_device(&backend, d)?;
        let mut values = backend.alloc(rows * k).map_err(dev_err(op))?;
        let mut derivatives = backend.alloc(rows * k).map_err(dev_err(op))?;
        backend
            .radial(&f, self.device_value(d)?, &mut values, &mut derivatives)
            .map_err(dev_err(op))?;
        let nd = &self.nodes[d.id];
        let spec = NodeSpec {
            op: op.into(),
            rows,
            cols: k,
            domain: nd.domain,
            fresh: nd.fresh,
            replicated: nd.replicated,
        };
        let record = OpRecord {
            inputs: &[d],
            indices: &[],
            handler: None,
            reads: &[],
        };
        self.push_device(
            spec,
            values,
            record,
            Box::new(move |ctx, _| {
                if !ctx.wants(d) {
                    return Ok(());
                }
                let g = ctx.device_out_grad(op)?;
                let backend = ctx.backend(op)?;
                // gd[r] = Σ_c g[r, c] · f_c'(d[r]), columns in order.
                let mut terms = backend.alloc(rows * k).map_err(dev_err(op))?;
                backend
                    .binary(
                        DeviceBinary::Mul,
                        g,
                        &derivatives,
                        DeviceBroadcast::Full,
                        rows,
                        k,
                        &mut terms,
                        false,
                    )
                    .map_err(dev_err(op))?;
                ctx.device_accumulate(op, d, |b, acc, add| b.row_sums(&terms, rows, k, acc, add))
            }),
        )
    }
}
