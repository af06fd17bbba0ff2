//! Pair sums on the device: a [`Pointwise`] expression evaluated step by
//! step with the device's element-wise kernels over every edge (each step
//! the op it names, so the values are those of the same steps as separate
//! ops), its reverse sweep for the gradient, and the per-centre sums over
//! the centre index's inverse map.

use crate::device::{DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceError, DeviceMem};
use crate::graph::{NodeSpec, OpRecord};
use crate::ops::elementwise::{BinaryKind, Unary};
use crate::ops::pointwise::{Pointwise, Step};
use crate::{EngineError, Graph, Index, RowDomain, Scalar, Tensor};
use std::sync::Arc;

/// A register of an expression on the device: one value per element, or
/// one value for all (a register that depends on constants only).
enum DeviceReg {
    Full(DeviceMem),
    Scalar(DeviceMem),
}

impl DeviceReg {
    fn mem(&self) -> &DeviceMem {
        match self {
            DeviceReg::Full(m) | DeviceReg::Scalar(m) => m,
        }
    }

    fn broadcast(&self) -> DeviceBroadcast {
        match self {
            DeviceReg::Full(_) => DeviceBroadcast::Full,
            DeviceReg::Scalar(_) => DeviceBroadcast::Scalar,
        }
    }
}

fn device_binary(kind: BinaryKind) -> Option<DeviceBinary> {
    match kind {
        BinaryKind::Add => Some(DeviceBinary::Add),
        BinaryKind::Sub => Some(DeviceBinary::Sub),
        BinaryKind::Mul => Some(DeviceBinary::Mul),
        BinaryKind::Div => None,
    }
}

impl Pointwise {
    /// Whether the device evaluates this expression: no quotient (the
    /// device has no quotient kernel) and a result that depends on an input.
    pub(crate) fn runs_on_device(&self) -> bool {
        let mut depends = vec![false; self.steps.len()];
        for (k, s) in self.steps.iter().enumerate() {
            depends[k] = match *s {
                Step::Input(_) => true,
                Step::Constant(_) => false,
                Step::Unary(_, a) => depends[a as usize],
                Step::Binary(BinaryKind::Div, _, _) => return false,
                Step::Binary(_, a, b) => depends[a as usize] || depends[b as usize],
            };
        }
        depends.last().copied().unwrap_or(false)
    }

    /// Every register over `len` elements of `inputs` (call only when
    /// [`Pointwise::runs_on_device`]).
    fn eval_device<T: Scalar>(
        &self,
        d: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        len: usize,
    ) -> Result<Vec<DeviceReg>, DeviceError> {
        let mut regs: Vec<DeviceReg> = Vec::with_capacity(self.steps.len());
        for s in &self.steps {
            let reg = match *s {
                Step::Input(j) => {
                    let mut m = d.alloc(len)?;
                    d.axpy(1.0, inputs[j as usize], &mut m, false)?;
                    DeviceReg::Full(m)
                }
                Step::Constant(c) => DeviceReg::Scalar(d.upload(&[T::from_f64(c)])?),
                Step::Unary(f, a) => {
                    let x = &regs[a as usize];
                    let mut m = d.alloc(x.mem().len())?;
                    d.unary(f, x.mem(), &mut m)?;
                    match x {
                        DeviceReg::Full(_) => DeviceReg::Full(m),
                        DeviceReg::Scalar(_) => DeviceReg::Scalar(m),
                    }
                }
                Step::Binary(kind, a, b) => {
                    let op = device_binary(kind)
                        .ok_or_else(|| DeviceError("a quotient in a device expression".into()))?;
                    let (x, y) = (&regs[a as usize], &regs[b as usize]);
                    match (x, y) {
                        (DeviceReg::Scalar(p), DeviceReg::Scalar(q)) => {
                            let mut m = d.alloc(1)?;
                            d.binary(op, p, q, DeviceBroadcast::Full, 1, 1, &mut m, false)?;
                            DeviceReg::Scalar(m)
                        }
                        (DeviceReg::Full(p), q) => {
                            let mut m = d.alloc(len)?;
                            d.binary(op, p, q.mem(), q.broadcast(), len, 1, &mut m, false)?;
                            DeviceReg::Full(m)
                        }
                        (DeviceReg::Scalar(p), DeviceReg::Full(q)) => {
                            // c ∘ y as y ∘ c: the same value for a sum or a
                            // product; a difference negated (exact).
                            let mut m = d.alloc(len)?;
                            d.binary(op, q, p, DeviceBroadcast::Scalar, len, 1, &mut m, false)?;
                            if op == DeviceBinary::Sub {
                                let mut n = d.alloc(len)?;
                                d.unary(Unary::Neg, &m, &mut n)?;
                                m = n;
                            }
                            DeviceReg::Full(m)
                        }
                    }
                }
            };
            regs.push(reg);
        }
        Ok(regs)
    }

    /// The gradient with respect to input `j` of `Σ g ⊙ result` over `len`
    /// elements, from the registers [`Pointwise::eval_device`] made.
    fn input_grad_device<T: Scalar>(
        &self,
        d: &dyn DeviceBackend<T>,
        regs: &[DeviceReg],
        g: &DeviceMem,
        len: usize,
        j: usize,
    ) -> Result<DeviceMem, DeviceError> {
        let n = self.steps.len();
        let mut grads: Vec<Option<DeviceMem>> = (0..n).map(|_| None).collect();
        let mut seed = d.alloc(len)?;
        d.axpy(1.0, g, &mut seed, false)?;
        grads[n - 1] = Some(seed);
        let mut result: Option<DeviceMem> = None;
        // Adds `f(out, accumulate)` into register `r`'s gradient (Full
        // registers only: the others depend on no input).
        fn add_into<T: Scalar>(
            d: &dyn DeviceBackend<T>,
            slot: &mut Option<DeviceMem>,
            len: usize,
            f: impl FnOnce(&mut DeviceMem, bool) -> Result<(), DeviceError>,
        ) -> Result<(), DeviceError> {
            match slot {
                Some(m) => f(m, true),
                None => {
                    let mut m = d.alloc(len)?;
                    f(&mut m, false)?;
                    *slot = Some(m);
                    Ok(())
                }
            }
        }
        for k in (0..n).rev() {
            let Some(gk) = grads[k].take() else { continue };
            match self.steps[k] {
                Step::Input(i) if i as usize == j => {
                    add_into(d, &mut result, len, |m, acc| d.axpy(1.0, &gk, m, acc))?
                }
                Step::Input(_) | Step::Constant(_) => {}
                Step::Unary(f, a) => {
                    if let DeviceReg::Full(x) = &regs[a as usize] {
                        let y = regs[k].mem();
                        add_into(d, &mut grads[a as usize], len, |m, acc| {
                            d.unary_grad(f, x, y, &gk, m, acc)
                        })?;
                    }
                }
                Step::Binary(kind, a, b) => {
                    let (x, y) = (&regs[a as usize], &regs[b as usize]);
                    let mut side = |r: u16, other: &DeviceReg, sign: f64| {
                        add_into(d, &mut grads[r as usize], len, |m, acc| match kind {
                            BinaryKind::Mul => d.binary(
                                DeviceBinary::Mul,
                                &gk,
                                other.mem(),
                                other.broadcast(),
                                len,
                                1,
                                m,
                                acc,
                            ),
                            _ => d.axpy(sign, &gk, m, acc),
                        })
                    };
                    if matches!(x, DeviceReg::Full(_)) {
                        side(a, y, 1.0)?;
                    }
                    if matches!(y, DeviceReg::Full(_)) {
                        let sign = if kind == BinaryKind::Sub { -1.0 } else { 1.0 };
                        side(b, x, sign)?;
                    }
                }
            }
        }
        match result {
            Some(m) => Ok(m),
            None => {
                // The result does not depend on input `j`: zeros.
                let mut m = d.alloc(len)?;
                d.axpy(0.0, g, &mut m, false)?;
                Ok(m)
            }
        }
    }
}

fn dev_err(op: &str) -> impl Fn(DeviceError) -> EngineError + '_ {
    move |e| EngineError::device(op, e)
}

impl<T: Scalar> Graph<T> {
    /// [`Graph::pair_sum`] on the device: the lengths, the expression
    /// over every edge, per-centre sums; `scatter_handler` the handler that
    /// lands the sums (its exchanges follow on the host).
    pub(crate) fn pair_sum_device(
        &mut self,
        backend: Arc<dyn DeviceBackend<T>>,
        op: String,
        geo: crate::ops::edge_geometry::EdgeGeometry,
        expr: &Pointwise,
        (center, neighbor): (Index, Index),
        (scatter_handler, fresh): (Option<&str>, bool),
    ) -> Result<Tensor, EngineError> {
        let n_edges = geo.ci.len();
        let n_rows = self.indices[center.id].target_rows;
        let dg = self.device_geometry(&backend, &geo, &op)?;
        let mut lengths_mem = backend.alloc(n_edges).map_err(dev_err(&op))?;
        self.run_edge_geometry(
            &backend,
            &dg,
            (center, neighbor),
            None,
            Some(&mut lengths_mem),
        )?;
        let regs = expr
            .eval_device(backend.as_ref(), &[&lengths_mem], n_edges)
            .map_err(dev_err(&op))?;
        let terms = regs
            .last()
            .map(DeviceReg::mem)
            .ok_or_else(|| EngineError::Device {
                op: op.clone(),
                message: "an empty expression".into(),
            })?;
        let mut out = backend.alloc(n_rows).map_err(dev_err(&op))?;
        backend
            .sum_rows_csr(
                terms,
                1,
                self.device_csr(&backend, center)?,
                &mut out,
                false,
            )
            .map_err(dev_err(&op))?;
        drop(regs);
        if let Some(h) = geo.handler {
            *self.handler_counts.entry(h.to_string()).or_insert(0) += 1;
        }
        let spec = NodeSpec {
            op: op.clone(),
            rows: n_rows,
            cols: 1,
            domain: RowDomain::Atom,
            fresh,
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
            handler: scatter_handler,
            reads: &reads,
        };
        let expr = expr.clone();
        let geometry = dg;
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(&op)?;
                let backend = ctx.backend(&op)?;
                let ends = (ctx.device_index(center)?, ctx.device_index(neighbor)?);
                let system = geometry
                    .edge_system
                    .map(|s| ctx.device_index(s))
                    .transpose()?;
                let edges = geometry.edges(ends, system);
                let source = geometry.source(|t| ctx.device_value(t))?;
                let err = dev_err(&op);
                let mut lengths = backend.alloc(n_edges).map_err(&err)?;
                backend
                    .edge_geometry(&edges, source, None, Some(&mut lengths))
                    .map_err(&err)?;
                // Each edge's seed: its centre's gradient.
                let mut seeds = backend.alloc(n_edges).map_err(&err)?;
                backend
                    .gather_rows(g, 1, ends.0, &mut seeds)
                    .map_err(&err)?;
                let regs = expr
                    .eval_device(backend, &[&lengths], n_edges)
                    .map_err(&err)?;
                let d_length = expr
                    .input_grad_device(backend, &regs, &seeds, n_edges, 0)
                    .map_err(&err)?;
                drop(regs);
                let mut rows = backend.alloc(n_edges * 3).map_err(&err)?;
                backend
                    .length_gradient_rows(&edges, source, &d_length, &lengths, &mut rows)
                    .map_err(&err)?;
                crate::ops::device_geometry::edge_rows_backward(
                    ctx,
                    &geometry,
                    (center, neighbor),
                    &edges,
                    &rows,
                    &op,
                )
            }),
        )
    }
}
