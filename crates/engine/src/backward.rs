//! What an op's backward closure sees.

use crate::buffers::Buffers;
use crate::device::{DeviceBackend, DeviceCsr, DeviceError, DeviceMem};
use crate::dist::Distributor;
use crate::graph::{Index, IndexNode, Node, Tensor};
use crate::ops::map_into;
use crate::{EngineError, Scalar};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// What a backward closure sees: input values, index arrays, gradient
/// accumulators and (when distributed) the communicator.
pub struct BackwardCtx<'a, T: Scalar> {
    pub(crate) nodes: &'a [Node<T>],
    pub(crate) indices: &'a [IndexNode],
    pub(crate) grads: &'a mut [Option<Vec<T>>],
    /// Gradients on the device, for ops that ran there.
    pub(crate) device_grads: &'a mut [Option<DeviceMem>],
    pub(crate) backend: Option<&'a dyn DeviceBackend<T>>,
    /// The output's gradient when the op ran on the device.
    pub(crate) out_grad_device: Option<&'a DeviceMem>,
    pub(crate) dist: Option<&'a mut (dyn Distributor + 'static)>,
    pub(crate) counts: &'a mut BTreeMap<String, usize>,
    pub(crate) pool: &'a mut Buffers<T>,
    /// The output of [`Graph::grad_replicated_seed`] when it is a deferred
    /// all-reduce: its gradient is the seed, the same on every rank.
    pub(crate) replicated_root: Option<usize>,
}

impl<'a, T: Scalar> BackwardCtx<'a, T> {
    /// Forward value of a tensor. The backward pass checks before each
    /// step that the values the step's op declared it reads are there; a
    /// released one reads as empty (debug builds assert).
    pub fn value(&self, t: Tensor) -> &'a [T] {
        let nodes: &'a [Node<T>] = self.nodes;
        debug_assert!(
            !nodes[t.id].released,
            "backward read the released output of `{}`",
            nodes[t.id].op
        );
        &nodes[t.id].value
    }

    /// Values of an index array.
    pub fn index(&self, i: Index) -> &'a [u32] {
        let indices: &'a [IndexNode] = self.indices;
        &indices[i.id].values
    }

    /// The index node (for its CSR inverse).
    pub(crate) fn index_node(&self, i: Index) -> &'a IndexNode {
        let indices: &'a [IndexNode] = self.indices;
        &indices[i.id]
    }

    /// Whether a gradient should flow into `t`.
    pub fn wants(&self, t: Tensor) -> bool {
        self.nodes[t.id].requires_grad
    }

    /// A zero-filled buffer of `len` elements from the recycled memory (for
    /// a gradient handed to [`BackwardCtx::accumulate`], which keeps or
    /// recycles it).
    pub(crate) fn zeroed(&mut self, len: usize) -> Vec<T> {
        self.pool.zeroed(len)
    }

    /// A buffer of `len` elements from the recycled memory with unspecified
    /// content, for a gradient the caller writes element by element.
    pub(crate) fn for_overwrite(&mut self, len: usize) -> Vec<T> {
        self.pool.for_overwrite(len)
    }

    /// Takes `t`'s gradient out to add into directly (zeros when it has
    /// none yet); hand it back with [`BackwardCtx::put_grad`].
    pub(crate) fn take_grad(&mut self, t: Tensor) -> Vec<T> {
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        match self.grads[t.id].take() {
            Some(g) => g,
            None => self.pool.zeroed(len),
        }
    }

    /// Takes `t`'s gradient out to add into directly, or, when it has none
    /// yet, a buffer of unspecified content that the caller must fill
    /// entirely: `(buffer, fresh)`. Hand it back with
    /// [`BackwardCtx::put_grad`].
    pub(crate) fn take_grad_or_fresh(&mut self, t: Tensor) -> (Vec<T>, bool) {
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        match self.grads[t.id].take() {
            Some(g) => (g, false),
            None => (self.pool.for_overwrite(len), true),
        }
    }

    /// Puts back a gradient from [`BackwardCtx::take_grad`].
    pub(crate) fn put_grad(&mut self, t: Tensor, g: Vec<T>) {
        self.grads[t.id] = Some(g);
    }

    /// Hands a scratch buffer back to the recycled memory.
    pub(crate) fn recycle(&mut self, v: Vec<T>) {
        self.pool.give(v);
    }

    /// A copy of `src` in recycled memory.
    pub(crate) fn copy_of(&mut self, src: &[T]) -> Vec<T> {
        let mut v = self.for_overwrite(src.len());
        v.copy_from_slice(src);
        v
    }

    /// Adds `g` into the gradient of `t` (ignored when `t` needs none).
    pub fn accumulate(&mut self, t: Tensor, g: Vec<T>) {
        if !self.nodes[t.id].requires_grad {
            self.pool.give(g);
            return;
        }
        match &mut self.grads[t.id] {
            Some(acc) => {
                if acc.len() >= crate::ops::PAR_THRESHOLD {
                    acc.par_iter_mut().zip(&g).for_each(|(a, b)| *a += *b);
                } else {
                    acc.iter_mut().zip(&g).for_each(|(a, b)| *a += *b);
                }
                self.pool.give(g);
            }
            slot @ None => *slot = Some(g),
        }
    }

    /// Adds element `i ↦ f(i)` into the gradient of `t`, for every element:
    /// no temporary when `t` already has a gradient, a recycled buffer when
    /// it has none.
    pub fn accumulate_map(&mut self, t: Tensor, f: impl Fn(usize) -> T + Sync) {
        if !self.nodes[t.id].requires_grad {
            return;
        }
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        match &mut self.grads[t.id] {
            Some(acc) => crate::ops::update_each(acc, |i, a| *a += f(i)),
            slot @ None => {
                let mut v = self.pool.for_overwrite(len);
                map_into(&mut v, f);
                *slot = Some(v);
            }
        }
    }

    /// Adds into the gradient of `t` block by block: `f(state, b, dst,
    /// overwrite)` fills (`overwrite`) or adds into `dst`, the elements
    /// `b·block ..` of the gradient; `state` is scratch from `init`, made
    /// once per rayon task rather than per block.
    pub(crate) fn accumulate_blocks<S>(
        &mut self,
        t: Tensor,
        block: usize,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize, &mut [T], bool) + Sync,
    ) {
        if !self.nodes[t.id].requires_grad {
            return;
        }
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        let run = |acc: &mut [T], overwrite: bool| {
            if len >= crate::ops::PAR_THRESHOLD {
                acc.par_chunks_mut(block)
                    .enumerate()
                    .for_each_init(&init, |s, (b, dst)| f(s, b, dst, overwrite));
            } else {
                let mut s = init();
                for (b, dst) in acc.chunks_mut(block).enumerate() {
                    f(&mut s, b, dst, overwrite);
                }
            }
        };
        match &mut self.grads[t.id] {
            Some(acc) => run(acc, false),
            slot @ None => {
                let mut v = self.pool.for_overwrite(len);
                run(&mut v, true);
                *slot = Some(v);
            }
        }
    }

    /// Adds into the gradient of `t` through `f(acc, fresh)`: `fresh` says
    /// `acc` holds unspecified values (no gradient yet), which `f` must then
    /// overwrite entirely instead of adding into: a GEMM with β = 0 instead
    /// of a zeroing pass and β = 1.
    pub(crate) fn accumulate_or_fill(&mut self, t: Tensor, f: impl FnOnce(&mut [T], bool)) {
        if !self.nodes[t.id].requires_grad {
            return;
        }
        let (mut acc, fresh) = self.take_grad_or_fresh(t);
        f(&mut acc, fresh);
        self.grads[t.id] = Some(acc);
    }

    /// Adds into the gradient of `t` through a closure over the accumulator.
    pub fn accumulate_with(&mut self, t: Tensor, f: impl FnOnce(&mut [T])) {
        if !self.nodes[t.id].requires_grad {
            return;
        }
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        let pool = &mut *self.pool;
        let acc = self.grads[t.id].get_or_insert_with(|| pool.zeroed(len));
        f(acc);
    }

    /// The graph's device (ops that ran there have one).
    pub(crate) fn backend(&self, op: &str) -> Result<&'a dyn DeviceBackend<T>, EngineError> {
        self.backend.ok_or_else(|| EngineError::Device {
            op: op.to_string(),
            message: "the graph has no device".into(),
        })
    }

    /// The output's gradient, on the device, of an op that ran there.
    pub(crate) fn device_out_grad(&self, op: &str) -> Result<&'a DeviceMem, EngineError> {
        self.out_grad_device.ok_or_else(|| EngineError::Device {
            op: op.to_string(),
            message: "no gradient on the device".into(),
        })
    }

    /// The device copy of `t`'s forward value.
    pub(crate) fn device_value(&self, t: Tensor) -> Result<&'a DeviceMem, EngineError> {
        let nodes: &'a [Node<T>] = self.nodes;
        nodes[t.id]
            .device
            .as_ref()
            .ok_or_else(|| EngineError::Device {
                op: nodes[t.id].op.clone(),
                message: "the value is not on the device".into(),
            })
    }

    /// The device copy of an index array.
    pub(crate) fn device_index(&self, i: Index) -> Result<&'a DeviceMem, EngineError> {
        let backend = self.backend("index")?;
        let indices: &'a [IndexNode] = self.indices;
        indices[i.id].device_values(backend)
    }

    /// The device copy of an index array's inverse map.
    pub(crate) fn device_csr(&mut self, i: Index) -> Result<&'a DeviceCsr, EngineError> {
        let backend = self.backend("scatter")?;
        let indices: &'a [IndexNode] = self.indices;
        let node = &indices[i.id];
        node.device_csr(backend, || self.pool.take_indices())
    }

    /// Adds into `t`'s gradient on the device through `f(backend, acc,
    /// accumulate)`: `accumulate` is false when `t` had no device gradient
    /// yet, and `f` must then overwrite every element of `acc`.
    pub(crate) fn device_accumulate(
        &mut self,
        op: &str,
        t: Tensor,
        f: impl FnOnce(&dyn DeviceBackend<T>, &mut DeviceMem, bool) -> Result<(), DeviceError>,
    ) -> Result<(), EngineError> {
        if !self.nodes[t.id].requires_grad {
            return Ok(());
        }
        let backend = self.backend(op)?;
        let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
        let (mut acc, accumulate) = match self.device_grads[t.id].take() {
            Some(acc) => (acc, true),
            None => (
                backend.alloc(len).map_err(|e| EngineError::device(op, e))?,
                false,
            ),
        };
        f(backend, &mut acc, accumulate).map_err(|e| EngineError::device(op, e))?;
        self.device_grads[t.id] = Some(acc);
        Ok(())
    }

    /// Adds `grad` (a new device array of `t`'s shape) into `t`'s device
    /// gradient, or makes it that gradient when `t` has none yet.
    pub(crate) fn device_add(
        &mut self,
        op: &str,
        t: Tensor,
        grad: DeviceMem,
    ) -> Result<(), EngineError> {
        if !self.nodes[t.id].requires_grad {
            return Ok(());
        }
        let backend = self.backend(op)?;
        match self.device_grads[t.id].as_mut() {
            Some(acc) => backend
                .axpy(1.0, &grad, acc, true)
                .map_err(|e| EngineError::device(op, e))?,
            None => self.device_grads[t.id] = Some(grad),
        }
        Ok(())
    }

    pub(crate) fn dist(
        &mut self,
        op: &str,
    ) -> Result<&mut (dyn Distributor + 'static), EngineError> {
        let op = op.to_string();
        self.dist.as_deref_mut().ok_or(EngineError::Comm {
            op,
            message: "distributed op without a distributor".into(),
        })
    }

    pub(crate) fn count(&mut self, handler: &str) {
        *self.counts.entry(handler.to_string()).or_insert(0) += 1;
    }
}
