//! Opaque custom ops: user kernels on raw slices that the dispatcher cannot
//! see into. Decomposed, an op adapter from the spec says how to feed them
//! (`slice_owned`, `gather_halo`) and how to combine what they return
//! (`scatter_outputs`, `all_reduce_sum`, `slice_outputs_owned`).

use crate::device::{DeviceBackend, DeviceError, DeviceKernel};
use crate::graph::{NodeSpec, OpRecord};
use crate::{EngineError, Graph, KernelError, RowDomain, Scalar, Tensor};
use ddmlip_spec::{InputTransform, OutputTransform};
use std::sync::Arc;

/// (row domain, rows, cols) of a kernel input or output.
pub type Shape = (RowDomain, usize, usize);

/// A user kernel on raw row-major slices.
pub trait OpaqueKernel<T: Scalar>: Send + Sync {
    /// The op name the trace and spec adapters use.
    fn name(&self) -> &str;
    /// Shape of the single output given the inputs' shapes.
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError>;
    /// Computes the output into `out` (zeroed, sized from `output_shape`).
    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError>;
    /// Adds input gradients into `grads` (one zeroed buffer per input) given
    /// the output gradient. `None` means the kernel has no backward. A
    /// kernel implements this or [`OpaqueKernel::backward_fresh`], which the
    /// engine calls (its default zeroes the fresh buffers and calls this).
    fn backward(
        &self,
        _inputs: &[&[T]],
        _shapes: &[Shape],
        _grad_out: &[T],
        _grads: &mut [Vec<T>],
    ) -> Option<Result<(), KernelError>> {
        None
    }
    /// [`OpaqueKernel::backward`] where a gradient buffer may arrive
    /// *fresh*: `fresh[i]` says `grads[i]` holds unspecified values
    /// (nothing accumulated into it yet), so the kernel must assign every
    /// element of it instead of adding. Buffers not fresh are as
    /// `backward` gets them. The default zeroes the fresh buffers and calls
    /// `backward`; a kernel overrides it to spare that pass over memory
    /// (zeroing a row where it is about to write it, in cache, or assigning).
    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        if !self.backward_assigns() {
            for (g, _) in grads.iter_mut().zip(fresh).filter(|(_, &f)| f) {
                crate::ops::map_into(g, |_| T::zero());
            }
        }
        self.backward(inputs, shapes, grad_out, grads)
    }

    /// When true, [`OpaqueKernel::backward`] assigns every element of every
    /// gradient buffer it gets, so the default
    /// [`OpaqueKernel::backward_fresh`] hands them over without zeroing
    /// them first; when false (the default), it adds into zeroed buffers.
    /// Not together with [`OpaqueKernel::adds_into_gradients`].
    fn backward_assigns(&self) -> bool {
        false
    }

    /// Whether [`OpaqueKernel::backward`] reads the values of input
    /// `input` (all by default), given which inputs need a gradient
    /// (`wants`, one flag per input). Inputs it does not read may be
    /// released after their last forward use; `backward` then sees an
    /// empty slice for them (their shapes are still given) and must not
    /// read them: it may skip the gradients nobody wants.
    fn backward_reads(&self, _input: usize, _wants: &[bool]) -> bool {
        true
    }

    /// When true, [`OpaqueKernel::backward`] only adds into its gradient
    /// buffers (never assigns), so an input's gradient accumulated so far
    /// by later ops may be handed to it in place of a zeroed buffer (no
    /// zeroing, no second pass to add the two); when false (the default),
    /// each buffer starts at zero.
    fn adds_into_gradients(&self) -> bool {
        false
    }

    /// When true, [`OpaqueKernel::backward`] receives an empty buffer for
    /// each input that needs no gradient (a constant), which it must leave
    /// alone (no work for it); when false (the default), every input gets a
    /// zeroed buffer of its length.
    fn skips_unwanted_gradients(&self) -> bool {
        false
    }

    /// When true, [`OpaqueKernel::forward`] assigns every element of its
    /// output, which then arrives with unspecified (stale but initialised)
    /// values instead of zeroed; when false (the default), it arrives zeroed.
    fn writes_every_output(&self) -> bool {
        false
    }

    /// This kernel's implementation on `backend`'s device, when it has one
    /// there: on a graph with a device ([`Graph::set_device`]) the op then
    /// runs on the device, forward and backward, and is traced as the same
    /// op. `None` (the default): it runs on the host, its inputs
    /// downloaded.
    fn device_kernel(
        &self,
        _backend: &dyn DeviceBackend<T>,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        Ok(None)
    }
}

impl<T: Scalar> Graph<T> {
    /// Runs an opaque kernel. Single process: just computes. Decomposed: the
    /// spec's adapter for `kernel.name()` transforms inputs and output; with
    /// no adapter the kernel sees all local rows as they are.
    pub fn opaque(
        &mut self,
        kernel: Arc<dyn OpaqueKernel<T>>,
        inputs: &[Tensor],
    ) -> Result<Tensor, EngineError> {
        let name = kernel.name().to_string();
        let adapter = self
            .dist
            .as_ref()
            .and_then(|d| d.spec().adapter(&name).cloned());
        let mut ins = inputs.to_vec();
        if let Some(a) = &adapter {
            for (pos, t) in ins.iter_mut().enumerate() {
                match a.inputs.get(&pos.to_string()) {
                    Some(InputTransform::SliceOwned) => *t = self.slice_owned(*t)?,
                    Some(InputTransform::GatherHalo) => {
                        *t = self.halo_refresh(*t, "adapter:gather_halo")?
                    }
                    None => {}
                }
            }
        }
        let handler = if self.dist.is_some() {
            Some(if adapter.is_some() {
                format!("opaque:{name}(adapter)")
            } else {
                format!("opaque:{name}(undeclared)")
            })
        } else {
            None
        };
        let y = self.push_kernel(
            kernel,
            &ins,
            format!("opaque:{name}"),
            handler.as_deref(),
            false,
        )?;
        match adapter.as_ref().and_then(|a| a.outputs.get("0")) {
            Some(OutputTransform::ScatterOutputs) => {
                let y = self.halo_reverse_sum(y, "adapter:scatter_outputs")?;
                self.halo_refresh(y, "halo:refresh")
            }
            Some(OutputTransform::AllReduceSum) => self.all_reduce(y, "adapter:all_reduce_sum"),
            Some(OutputTransform::SliceOutputsOwned) => {
                let y = self.pad_ghosts(y)?;
                self.halo_refresh(y, "adapter:slice_outputs_owned")
            }
            None => Ok(y),
        }
    }

    /// Runs `kernel` on `ins` and records one node whose backward calls the
    /// kernel's (shared by opaque and row-wise ops). `row_local` marks a
    /// kernel that maps rows independently, so freshness and replication
    /// carry over from the inputs.
    pub(crate) fn push_kernel(
        &mut self,
        kernel: Arc<dyn OpaqueKernel<T>>,
        ins: &[Tensor],
        op: String,
        handler: Option<&str>,
        row_local: bool,
    ) -> Result<Tensor, EngineError> {
        if let Some(backend) = self.device_for_op() {
            let on_device = kernel
                .device_kernel(backend.as_ref())
                .map_err(|e| EngineError::device(kernel.name(), e))?;
            if let Some(dk) = on_device {
                return self.push_device_kernel(backend, kernel, dk, ins, (op, handler), row_local);
            }
        }
        self.ensure_host(ins)?;
        self.check_live(ins)?;
        let kernel_err = |source| EngineError::Kernel {
            op: kernel.name().to_string(),
            source,
        };
        let shapes: Vec<Shape> = ins
            .iter()
            .map(|t| {
                (
                    self.nodes[t.id].domain,
                    self.nodes[t.id].rows,
                    self.nodes[t.id].cols,
                )
            })
            .collect();
        let (domain, rows, cols) = kernel.output_shape(&shapes).map_err(kernel_err)?;
        let mut out = if kernel.writes_every_output() {
            self.pool.for_overwrite(rows * cols)
        } else {
            self.pool.zeroed(rows * cols)
        };
        {
            let slices: Vec<&[T]> = ins
                .iter()
                .map(|t| self.nodes[t.id].value.as_slice())
                .collect();
            kernel
                .forward(&slices, &shapes, &mut out)
                .map_err(kernel_err)?;
        }
        let spec = NodeSpec {
            op: op.clone(),
            rows,
            cols,
            domain,
            fresh: row_local && ins.iter().all(|t| self.nodes[t.id].fresh),
            replicated: row_local && ins.iter().all(|t| self.nodes[t.id].replicated),
        };
        let ins_b = ins.to_vec();
        let wants: Vec<bool> = ins.iter().map(|t| self.nodes[t.id].requires_grad).collect();
        let read: Vec<bool> = (0..ins.len())
            .map(|pos| kernel.backward_reads(pos, &wants))
            .collect();
        let reads: Vec<Tensor> = ins
            .iter()
            .zip(&read)
            .filter(|&(_, &r)| r)
            .map(|(&t, _)| t)
            .collect();
        let k = kernel.clone();
        self.push_op_reading(
            spec,
            out,
            ins,
            &[],
            handler,
            Box::new(move |ctx, g| {
                let slices: Vec<&[T]> = ins_b
                    .iter()
                    .enumerate()
                    .map(|(pos, &t)| if read[pos] { ctx.value(t) } else { &[] })
                    .collect();
                // Kernels that add get the gradient accumulated so far;
                // a buffer with nothing in it yet comes fresh (unspecified
                // content), for the kernel to fill.
                let skip = k.skips_unwanted_gradients();
                let adds = k.adds_into_gradients();
                let mut fresh = vec![false; ins_b.len()];
                let mut grads: Vec<Vec<T>> = Vec::with_capacity(ins_b.len());
                for (i, (&t, &(_, r, c))) in ins_b.iter().zip(&shapes).enumerate() {
                    grads.push(if skip && !ctx.wants(t) {
                        Vec::new()
                    } else if adds && ctx.wants(t) {
                        // Handed back by the `accumulate` below.
                        let (buf, is_fresh) = ctx.take_grad_or_fresh(t);
                        fresh[i] = is_fresh;
                        buf
                    } else {
                        fresh[i] = true;
                        ctx.for_overwrite(r * c)
                    });
                }
                match k.backward_fresh(&slices, &shapes, g, &mut grads, &fresh) {
                    None => return Err(EngineError::NoBackward { op: op.clone() }),
                    Some(Err(source)) => {
                        return Err(EngineError::Kernel {
                            op: k.name().to_string(),
                            source,
                        })
                    }
                    Some(Ok(())) => {}
                }
                for (&t, gt) in ins_b.iter().zip(grads) {
                    if !(skip && gt.is_empty() && !ctx.wants(t)) {
                        ctx.accumulate(t, gt);
                    }
                }
                Ok(())
            }),
            &reads,
        )
    }

    /// [`Graph::push_kernel`] for a kernel with a device side: the same op
    /// (name, shapes, handler) with its value and its backward on the device.
    fn push_device_kernel(
        &mut self,
        backend: Arc<dyn DeviceBackend<T>>,
        kernel: Arc<dyn OpaqueKernel<T>>,
        dk: Arc<dyn DeviceKernel<T>>,
        ins: &[Tensor],
        (op, handler): (String, Option<&str>),
        row_local: bool,
    ) -> Result<Tensor, EngineError> {
        self.check_live(ins)?;
        let name = kernel.name().to_string();
        let kernel_err = |source| EngineError::Kernel {
            op: name.clone(),
            source,
        };
        let shapes: Vec<Shape> = ins
            .iter()
            .map(|t| {
                let n = &self.nodes[t.id];
                (n.domain, n.rows, n.cols)
            })
            .collect();
        let (domain, rows, cols) = kernel.output_shape(&shapes).map_err(kernel_err)?;
        for &t in ins {
            self.ensure_device(&backend, t)?;
        }
        let dev_err = |e| EngineError::device(&name, e);
        let mut out = backend.alloc(rows * cols).map_err(dev_err)?;
        {
            let values = self.device_values(ins)?;
            dk.forward(backend.as_ref(), &values, &shapes, &mut out)
                .map_err(dev_err)?;
        }
        let spec = NodeSpec {
            op: op.clone(),
            rows,
            cols,
            domain,
            fresh: row_local && ins.iter().all(|t| self.nodes[t.id].fresh),
            replicated: row_local && ins.iter().all(|t| self.nodes[t.id].replicated),
        };
        let wants: Vec<bool> = ins.iter().map(|t| self.nodes[t.id].requires_grad).collect();
        let read: Vec<bool> = (0..ins.len())
            .map(|pos| wants.iter().any(|&w| w) && dk.backward_reads(pos))
            .collect();
        let reads: Vec<Tensor> = ins
            .iter()
            .zip(&read)
            .filter(|&(_, &r)| r)
            .map(|(&t, _)| t)
            .collect();
        let ins_b = ins.to_vec();
        let record = OpRecord {
            inputs: ins,
            indices: &[],
            handler,
            reads: &reads,
        };
        self.push_device(
            spec,
            out,
            record,
            Box::new(move |ctx, _| {
                let g = ctx.device_out_grad(&op)?;
                let values = ins_b
                    .iter()
                    .zip(&read)
                    .map(|(&t, &r)| if r { ctx.device_value(t) } else { Ok(g) })
                    .collect::<Result<Vec<_>, _>>()?;
                let backend = ctx.backend(&op)?;
                for (pos, &t) in ins_b.iter().enumerate() {
                    if !ctx.wants(t) {
                        continue;
                    }
                    let grad = dk
                        .backward(backend, &values, &shapes, g, pos)
                        .map_err(|e| EngineError::device(&op, e))?;
                    if let Some(grad) = grad {
                        ctx.device_add(&op, t, grad)?;
                    }
                }
                Ok(())
            }),
        )
    }

    /// The owned rows of a local Atom tensor. Backward pads ghost rows with zeros.
    fn slice_owned(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        let n_owned = self
            .dist
            .as_ref()
            .map(|d| d.n_owned())
            .unwrap_or(self.nodes[x.id].rows);
        let (rows, cols) = self.shape(x);
        let keep = n_owned.min(rows);
        let mut out = self.pool.for_overwrite(keep * cols);
        out.copy_from_slice(&self.nodes[x.id].value[..keep * cols]);
        let spec = NodeSpec {
            op: "slice_owned".into(),
            rows: keep,
            cols,
            domain: RowDomain::Atom,
            fresh: true,
            replicated: false,
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            Some("adapter:slice_owned"),
            Box::new(move |ctx, g| {
                ctx.accumulate_with(x, |gx| {
                    for (a, &b) in gx[..keep * cols].iter_mut().zip(g) {
                        *a += b;
                    }
                });
                Ok(())
            }),
        )
    }

    /// Extends an owned-rows tensor to all local rows with zero ghost rows.
    fn pad_ghosts(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        let n_local = self
            .dist
            .as_ref()
            .map(|d| d.n_local())
            .unwrap_or(self.nodes[x.id].rows);
        let (rows, cols) = self.shape(x);
        if rows > n_local {
            return Err(EngineError::shape(
                "pad_ghosts",
                format!("{rows} rows exceed the {n_local} local rows"),
            ));
        }
        let mut out = self.pool.zeroed(n_local * cols);
        out[..rows * cols].copy_from_slice(&self.nodes[x.id].value);
        let spec = NodeSpec {
            op: "pad_ghosts".into(),
            rows: n_local,
            cols,
            domain: RowDomain::Atom,
            fresh: false,
            replicated: false,
        };
        self.push_op(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                let gx = ctx.copy_of(&g[..rows * cols]);
                ctx.accumulate(x, gx);
                Ok(())
            }),
        )
    }
}
