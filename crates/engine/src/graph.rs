use crate::device::{DeviceBackend, DeviceMem};
use crate::dist::Distributor;
use crate::trace::{Phase, Trace, TraceEvent, TraceShape};
use crate::{EngineError, RowDomain, Scalar};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::backward::BackwardCtx;
pub use crate::buffers::Buffers;
pub(crate) use index_node::{Csr, IndexNode};

mod index_node;

/// Handle of a tensor recorded in a [`Graph`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tensor {
    pub(crate) id: usize,
}

/// Handle of an integer index array (edge endpoints, atom → system, …).
/// Indices are not differentiable; they say which rows an op reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Index {
    pub(crate) id: usize,
}

pub(crate) type BackwardFn<T> =
    Box<dyn Fn(&mut BackwardCtx<'_, T>, &[T]) -> Result<(), EngineError> + Send + Sync>;

pub(crate) struct Node<T: Scalar> {
    pub value: Vec<T>,
    pub rows: usize,
    pub cols: usize,
    pub domain: RowDomain,
    pub requires_grad: bool,
    pub backward: Option<BackwardFn<T>>,
    pub op: String,
    /// Ghost rows hold their owners' current values (Atom tensors only).
    pub fresh: bool,
    /// Identical on every rank (parameters, all-reduced values).
    pub replicated: bool,
    /// Tensors (ids) this node's backward reads the values of: its inputs
    /// and output unless the op declared fewer; empty without a backward.
    pub reads: Vec<usize>,
    /// Some recorded backward reads this value.
    pub saved: bool,
    /// The value went back to the pool ([`Graph::release`]); `value` is empty.
    pub released: bool,
    /// The caller released the value while a backward still reads it: it
    /// goes back to the pool once the backward pass has passed this node.
    pub release_after_backward: bool,
    /// The value on the graph's device (see [`crate::device`]); `value`
    /// is then empty until a host op or a caller downloads it.
    pub device: Option<DeviceMem>,
    /// The op ran on the device, and so does its backward: it takes the
    /// output's gradient there (see [`BackwardCtx::device_out_grad`]).
    pub ran_on_device: bool,
}

/// A tape of ops over tensors of element type `T`.
///
/// Build it forward with the op methods (see [`crate::ops`]), then call
/// [`Graph::grad`] for reverse-mode derivatives. With a [`Distributor`]
/// attached, gathers, scatters, system reductions and opaque ops apply the
/// distributed handlers the spec selects.
pub struct Graph<T: Scalar> {
    pub(crate) nodes: Vec<Node<T>>,
    pub(crate) indices: Vec<IndexNode>,
    pub(crate) trace: Option<Trace>,
    pub(crate) dist: Option<Box<dyn Distributor>>,
    pub(crate) handler_counts: BTreeMap<String, usize>,
    pub(crate) scope: Vec<String>,
    pub(crate) check_finite: bool,
    /// Recycled buffers for op outputs and gradients.
    pub(crate) pool: Buffers<T>,
    /// The periodic shift arrays given to this graph's ops, kept so that
    /// their memory can be recycled when the graph ends.
    pub(crate) shift_arrays: Vec<Arc<Vec<[i32; 3]>>>,
    /// Edge lengths made so far, by [`crate::Edges`] key: each neighbour
    /// graph's lengths are one op however often a model asks.
    pub(crate) lengths_memo: Vec<([usize; 3], Tensor)>,
    /// Values ops keep for their backward pass besides their outputs (e.g.
    /// a radial basis's derivative table), recycled when the graph ends.
    pub(crate) saved: Vec<Arc<Vec<T>>>,
    /// Whether all-reduces wait until their sum is needed (see
    /// [`Graph::defer_all_reduces`]).
    pub(crate) defer_all_reduces: bool,
    /// All-reduce outputs that still hold this rank's partial, in the order
    /// they were recorded (the same on every rank).
    pub(crate) pending: Vec<usize>,
    /// f64 values that tensors' `T` values are the rounding of, by node id
    /// (see [`Graph::set_exact_values`]); empty in f64 graphs.
    pub(crate) exact_values: Vec<(usize, Arc<Vec<f64>>)>,
    /// Whether [`Graph::release`] frees values (on unless switched off).
    pub(crate) release_enabled: bool,
    /// Bytes of node values held right now (released ones excluded).
    pub(crate) live_bytes: usize,
    /// Live-byte accounting by op, when enabled.
    pub(crate) live_stats: Option<LiveStats>,
    /// Time per op kind while [`Graph::enable_profile`] is on.
    pub(crate) profile: Option<crate::profile::Profiler>,
    /// The device ops run on when they have a kernel there (see
    /// [`Graph::set_device`]).
    pub(crate) backend: Option<Arc<dyn DeviceBackend<T>>>,
    /// Periodic shift arrays on the device (as `u32` bit patterns), by the
    /// host array they copy: uploaded once however many edge ops read them.
    pub(crate) device_shifts: Vec<DeviceShifts>,
}

/// A periodic shift array and its copy on the device.
pub(crate) type DeviceShifts = (Arc<Vec<[i32; 3]>>, Arc<DeviceMem>);

/// Where the tape's memory peaks: the most bytes of op outputs and
/// gradients held at once during one graph's forward and backward passes,
/// and which ops' outputs made it up (see [`Graph::enable_live_stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveStats {
    /// Most bytes of tensor values (op outputs, inputs, constants) plus
    /// gradients alive at once.
    pub peak_bytes: usize,
    /// Whether the peak was reached in the backward pass.
    pub peak_in_backward: bool,
    /// The values alive at the peak by op name (bytes), largest first;
    /// gradients alive then are the entry `"(gradients)"`.
    pub peak_by_op: Vec<(String, usize)>,
}

impl<T: Scalar> Default for Graph<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// What an op recorded besides its output: its tensor inputs and index
/// arrays, the distributed handler that fired, and the values its backward
/// reads (among its inputs and its output).
pub(crate) struct OpRecord<'a> {
    pub inputs: &'a [Tensor],
    pub indices: &'a [Index],
    pub handler: Option<&'a str>,
    pub reads: &'a [Tensor],
}

/// Properties of a node to push.
pub(crate) struct NodeSpec {
    pub op: String,
    pub rows: usize,
    pub cols: usize,
    pub domain: RowDomain,
    pub fresh: bool,
    pub replicated: bool,
}

impl<T: Scalar> Graph<T> {
    /// An empty single-process graph.
    pub fn new() -> Self {
        Self {
            nodes: Vec::new(),
            indices: Vec::new(),
            trace: None,
            dist: None,
            handler_counts: BTreeMap::new(),
            scope: Vec::new(),
            check_finite: false,
            pool: Buffers::default(),
            shift_arrays: Vec::new(),
            lengths_memo: Vec::new(),
            saved: Vec::new(),
            defer_all_reduces: false,
            pending: Vec::new(),
            exact_values: Vec::new(),
            release_enabled: true,
            live_bytes: 0,
            live_stats: None,
            profile: None,
            backend: None,
            device_shifts: Vec::new(),
        }
    }

    /// An empty graph whose op outputs and gradients reuse `buffers` (from
    /// [`Graph::into_buffers`] of an earlier evaluation).
    pub fn with_buffers(buffers: Buffers<T>) -> Self {
        let mut g = Self::new();
        g.pool = buffers;
        g
    }

    /// Ends the graph, keeping the memory of its tensors for the next one.
    pub fn into_buffers(self) -> Buffers<T> {
        let mut pool = self.pool;
        for node in self.nodes {
            pool.give(node.value);
        }
        // The ops (and their copies of the arrays) are gone now.
        for v in self.saved {
            if let Ok(v) = Arc::try_unwrap(v) {
                pool.give(v);
            }
        }
        for shifts in self.shift_arrays {
            if let Ok(v) = Arc::try_unwrap(shifts) {
                pool.give_shifts(v);
            }
        }
        for ix in self.indices {
            // Shared arrays (still held by a caller) stay with their owner.
            if let Ok(values) = Arc::try_unwrap(ix.values) {
                pool.give_indices(values);
            }
            if let Some(sources) = ix
                .csr
                .into_inner()
                .and_then(|c| Arc::try_unwrap(c).ok())
                .and_then(|c| c.sources)
            {
                pool.give_indices(sources);
            }
        }
        pool
    }

    /// An empty index array from this graph's recycled memory: see
    /// [`Buffers::take_indices`].
    pub fn take_indices(&mut self) -> Vec<u32> {
        self.pool.take_indices()
    }

    /// Shares `v` with an op's backward closure; its memory goes back to the
    /// pool when the graph ends.
    pub(crate) fn save_for_backward(&mut self, v: Vec<T>) -> Arc<Vec<T>> {
        let v = Arc::new(v);
        self.saved.push(v.clone());
        v
    }

    /// An empty shift array from this graph's recycled memory: see
    /// [`Buffers::take_shifts`].
    pub fn take_shifts(&mut self) -> Vec<[i32; 3]> {
        self.pool.take_shifts()
    }

    /// Keeps an index array the caller no longer needs for the next graph.
    pub fn give_indices(&mut self, v: Vec<u32>) {
        self.pool.give_indices(v);
    }

    /// A vector of `len` values from this graph's recycled memory (a fresh
    /// one when none fits), for a caller that overwrites every element and
    /// hands it to [`Graph::leaf`] or [`Graph::constant`]: the values it holds
    /// are unspecified (stale, but initialised). Used for inputs rebuilt
    /// every evaluation (positions), so a repeated evaluation maps no fresh
    /// memory for them.
    pub fn take_values(&mut self, len: usize) -> Vec<T> {
        self.pool.for_overwrite(len)
    }

    /// Keeps a value vector the caller no longer needs (a gradient
    /// [`Graph::grad`] returned, say) for later ops and the next graph.
    pub fn give_values(&mut self, v: Vec<T>) {
        self.pool.give(v);
    }

    /// Starts recording every op (forward and backward) into a trace.
    pub fn enable_trace(&mut self) {
        self.trace = Some(Trace::default());
    }

    /// Distributed: all-reduces (per-system sums and their like) no longer
    /// communicate when recorded; their outputs hold this rank's partial
    /// until [`Graph::resolve_pending`]. A rank whose energy sum is the last
    /// op then does not wait for its peers before its backward pass (see
    /// [`Graph::grad_replicated_seed`]). Recording an op on such an output
    /// fails with [`EngineError::DeferredSumRead`] (the model needs its sums
    /// during the forward pass: evaluate it again without deferral). Read
    /// deferred outputs only after `resolve_pending`. Ignored while tracing
    /// (trace records hold forward values).
    pub fn defer_all_reduces(&mut self, on: bool) {
        self.defer_all_reduces = on;
    }

    /// Whether `t` is a deferred all-reduce that still holds a partial.
    pub fn is_pending(&self, t: Tensor) -> bool {
        self.pending.contains(&t.id)
    }

    /// Completes every deferred all-reduce, in recording order (every rank
    /// must call it at the same point of the run).
    pub fn resolve_pending(&mut self) -> Result<(), EngineError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let d = self
            .dist
            .as_deref_mut()
            .ok_or_else(|| EngineError::shape("all_reduce", "not distributed"))?;
        for id in std::mem::take(&mut self.pending) {
            d.all_reduce_sum(T::data_mut(&mut self.nodes[id].value))?;
        }
        Ok(())
    }

    /// Switches [`Graph::release`] on (the default) or off. Off, released
    /// tensors keep their values until the graph ends: same results bit
    /// for bit, more memory (for comparisons and debugging).
    pub fn set_release(&mut self, on: bool) {
        self.release_enabled = on;
    }

    /// Says that the caller will not read `t` (nor record ops on it) again.
    /// When no recorded backward reads its value, the value goes back to
    /// the pool now, for later ops to reuse; otherwise it goes back once
    /// the backward pass has passed `t` (so [`Graph::grad`] can run once
    /// more only if nothing was released). Reading a released value
    /// afterwards is an [`EngineError::Released`] (and a debug assertion in
    /// [`Graph::value`]). Deferred all-reduces and memoised edge lengths are
    /// kept. Does nothing when release is switched off.
    pub fn release(&mut self, t: Tensor) {
        if !self.release_enabled
            || self.pending.contains(&t.id)
            || self.lengths_memo.iter().any(|(_, m)| *m == t)
        {
            return;
        }
        let node = &mut self.nodes[t.id];
        if node.released {
            return;
        }
        if node.saved {
            node.release_after_backward = true;
            return;
        }
        free_value(node, &mut self.pool, &mut self.live_bytes);
    }

    /// Whether `t`'s value was released (see [`Graph::release`]).
    pub fn is_released(&self, t: Tensor) -> bool {
        self.nodes[t.id].released
    }

    /// Forward value of `t`, or [`EngineError::Released`] when it was
    /// released.
    pub fn try_value(&self, t: Tensor) -> Result<&[T], EngineError> {
        self.check_live(&[t])?;
        let node = &self.nodes[t.id];
        if node.device.is_some() && node.value.len() != node.rows * node.cols {
            return Err(EngineError::Device {
                op: node.op.clone(),
                message: "the value is on the device (Graph::ensure_host downloads it)".into(),
            });
        }
        Ok(&node.value)
    }

    /// [`EngineError::Released`] naming the first of `ts` whose value was
    /// released: every op checks its inputs before reading them.
    pub(crate) fn check_live(&self, ts: &[Tensor]) -> Result<(), EngineError> {
        match ts.iter().find(|t| self.nodes[t.id].released) {
            Some(t) => Err(EngineError::Released {
                op: self.nodes[t.id].op.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Starts counting the bytes of tensor values and gradients alive at
    /// once, by op (costs a pass over the tape at each new peak: for
    /// measurements, off by default).
    pub fn enable_live_stats(&mut self) {
        self.live_stats = Some(LiveStats::default());
    }

    /// The peak so far, when [`Graph::enable_live_stats`] was called.
    pub fn live_stats(&self) -> Option<&LiveStats> {
        self.live_stats.as_ref()
    }

    /// Bytes of node values held now (released values excluded; gradients
    /// not counted).
    pub fn live_value_bytes(&self) -> usize {
        self.live_bytes
    }

    /// Records a new forward peak of the live bytes with its breakdown.
    fn note_live(&mut self) {
        if let Some(stats) = &mut self.live_stats {
            note_peak(&self.nodes, stats, self.live_bytes, 0, false);
        }
    }

    /// Starts (or restarts) timing ops by name, forward and backward: see
    /// [`OpProfile`](crate::OpProfile). The next recorded node's time runs
    /// from this call, so call it just before the model's forward pass.
    pub fn enable_profile(&mut self) {
        match &mut self.profile {
            Some(p) => p.restart(),
            None => self.profile = Some(crate::profile::Profiler::new()),
        }
    }

    /// Takes the op times recorded since [`Graph::enable_profile`] (`None`
    /// when it was not called); profiling stops.
    pub fn take_profile(&mut self) -> Option<crate::OpProfile> {
        self.profile.take().map(crate::profile::Profiler::finish)
    }

    /// Makes every op check its output for NaN/inf and fail naming itself.
    pub fn enable_finite_checks(&mut self) {
        self.check_finite = true;
    }

    /// The recorded trace, if tracing was enabled.
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    /// Takes the recorded trace out of the graph.
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take()
    }

    /// Attaches the decomposition runtime: from now on distributed ops apply
    /// the handlers that its spec selects.
    pub fn set_distributor(&mut self, dist: Box<dyn Distributor>) {
        self.dist = Some(dist);
    }

    /// Detaches the decomposition runtime.
    pub fn take_distributor(&mut self) -> Option<Box<dyn Distributor>> {
        self.dist.take()
    }

    /// The attached decomposition runtime.
    pub fn distributor(&mut self) -> Option<&mut (dyn Distributor + 'static)> {
        self.dist.as_deref_mut()
    }

    /// True when a distributor is attached.
    pub fn is_distributed(&self) -> bool {
        self.dist.is_some()
    }

    /// How often each distributed handler fired (forward and backward).
    pub fn handler_counts(&self) -> &BTreeMap<String, usize> {
        &self.handler_counts
    }

    /// Labels the ops recorded until the matching [`Graph::pop_scope`] (e.g. a layer name).
    pub fn push_scope(&mut self, name: impl Into<String>) {
        self.scope.push(name.into());
    }

    /// Ends the innermost scope.
    pub fn pop_scope(&mut self) {
        self.scope.pop();
    }

    /// Number of recorded tensors.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The tensors recorded after the first `start` ones, in order (with
    /// `start` = [`Graph::len`] before a step: the tensors the step made).
    pub fn tensors_from(&self, start: usize) -> impl Iterator<Item = Tensor> {
        (start..self.nodes.len()).map(|id| Tensor { id })
    }

    /// True before the first tensor is recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A differentiable input (positions, strain, …).
    pub fn leaf(&mut self, value: Vec<T>, rows: usize, cols: usize, domain: RowDomain) -> Tensor {
        assert_eq!(value.len(), rows * cols, "leaf value has the wrong length");
        let t = self.push_raw(
            NodeSpec {
                op: "leaf".into(),
                rows,
                cols,
                domain,
                fresh: true,
                replicated: domain == RowDomain::None,
            },
            value,
            true,
            None,
        );
        self.record(t, &[], &[], None);
        t
    }

    /// A constant input (no gradient). Atom constants must hold ghost rows consistent with owners.
    pub fn constant(
        &mut self,
        value: Vec<T>,
        rows: usize,
        cols: usize,
        domain: RowDomain,
    ) -> Tensor {
        assert_eq!(
            value.len(),
            rows * cols,
            "constant value has the wrong length"
        );
        let t = self.push_raw(
            NodeSpec {
                op: "constant".into(),
                rows,
                cols,
                domain,
                fresh: true,
                replicated: domain != RowDomain::Atom && domain != RowDomain::Edge,
            },
            value,
            false,
            None,
        );
        self.record(t, &[], &[], None);
        t
    }

    /// A constant input whose `rows × cols` values `fill` writes (every
    /// element) into recycled memory: per-evaluation constants (per-edge
    /// host values of an imported model) without a fresh allocation each
    /// time. Atom constants must hold ghost rows consistent with owners.
    pub fn constant_with(
        &mut self,
        rows: usize,
        cols: usize,
        domain: RowDomain,
        fill: impl FnOnce(&mut [T]),
    ) -> Tensor {
        let mut value = self.pool.for_overwrite(rows * cols);
        fill(&mut value);
        self.constant(value, rows, cols, domain)
    }

    /// A parameter matrix given in f64 (converted to `T`), rows × cols, no gradient.
    pub fn param(
        &mut self,
        value: &[f64],
        rows: usize,
        cols: usize,
    ) -> Result<Tensor, EngineError> {
        if value.len() != rows * cols {
            return Err(EngineError::shape(
                "param",
                format!(
                    "parameter has {} values but its shape is {rows}×{cols}",
                    value.len()
                ),
            ));
        }
        let v: Vec<T> = value.iter().map(|&x| T::from_f64(x)).collect();
        Ok(self.constant(v, rows, cols, RowDomain::None))
    }

    /// Registers an index array: `values[r]` is a row of a `target` tensor with
    /// `target_rows` rows; the array itself has rows of `domain`. `role` names
    /// it in traces (e.g. `edge_center`).
    pub fn index(
        &mut self,
        values: Arc<Vec<u32>>,
        domain: RowDomain,
        target: RowDomain,
        target_rows: usize,
        role: &str,
    ) -> Result<Index, EngineError> {
        // A branch-free maximum vectorises; the offending value is looked
        // up only when there is one.
        let largest = values.iter().fold(0u32, |m, &v| m.max(v));
        if !values.is_empty() && largest as usize >= target_rows {
            let bad = values
                .iter()
                .find(|&&v| v as usize >= target_rows)
                .map_or(largest, |&v| v);
            return Err(EngineError::shape(
                "index",
                format!("index `{role}` holds {bad} but its target has {target_rows} rows"),
            ));
        }
        self.indices.push(IndexNode::new(
            values,
            largest,
            (domain, target, target_rows),
            role,
        ));
        Ok(Index {
            id: self.indices.len() - 1,
        })
    }

    /// Whether every row `idx` points at is an owned row of this rank (edges
    /// centred on owned atoms). A scatter through such an index leaves the
    /// ghost rows zero, so the reverse-sum of its halo correction would add
    /// nothing: skipping it saves an exchange (and its adjoint), each a point
    /// where a rank waits for its neighbours.
    pub(crate) fn targets_owned_rows_only(&self, idx: Index) -> bool {
        let ix = &self.indices[idx.id];
        self.dist.as_ref().is_some_and(|d| {
            ix.target == RowDomain::Atom
                && ix.target_rows == d.n_local()
                && (ix.values.is_empty() || (ix.largest as usize) < d.n_owned())
        })
    }

    /// Records a non-differentiable step that produced index arrays (e.g. a
    /// neighbour list built inside the model) so traces show it.
    pub fn record_index_op(&mut self, op: &str, reads: &[Tensor], produced: &[Index], rows: usize) {
        if self.trace.is_none() {
            return;
        }
        let shape = |n: &Node<T>| TraceShape {
            domain: n.domain,
            rows: n.rows,
            cols: n.cols,
        };
        let event = TraceEvent {
            seq: 0,
            phase: Phase::Forward,
            op: op.to_string(),
            scope: self.scope.join("/"),
            inputs: reads.iter().map(|i| shape(&self.nodes[i.id])).collect(),
            output: TraceShape {
                domain: RowDomain::Edge,
                rows,
                cols: 0,
            },
            indices: produced
                .iter()
                .map(|i| {
                    let ix = &self.indices[i.id];
                    format!("{} ({:?} → {:?})", ix.role, ix.domain, ix.target)
                })
                .collect(),
            handler: None,
            owned_sum: rows as f64,
            owned_sum_sq: 0.0,
            replicated: false,
            input_ids: reads.iter().map(|t| t.id).collect(),
            output_id: usize::MAX,
            device: None,
        };
        if let Some(trace) = &mut self.trace {
            trace.push(event);
        }
    }

    /// Values of an index array.
    pub fn index_values(&self, i: Index) -> &Arc<Vec<u32>> {
        &self.indices[i.id].values
    }

    /// Number of entries (rows) of an index array.
    pub fn index_len(&self, i: Index) -> usize {
        self.indices[i.id].values.len()
    }

    /// Rows of the tensor an index points into.
    pub fn index_target_rows(&self, i: Index) -> usize {
        self.indices[i.id].target_rows
    }

    /// Forward value (row-major rows × cols).
    ///
    /// A released value (see [`Graph::release`]) reads as empty; debug
    /// builds assert. Use [`Graph::try_value`] for a typed error. A value
    /// only on the device (see [`Graph::set_device`]) reads as empty too:
    /// call [`Graph::ensure_host`] first.
    pub fn value(&self, t: Tensor) -> &[T] {
        let node = &self.nodes[t.id];
        debug_assert!(
            !node.released,
            "value of `{}` read after its release",
            node.op
        );
        debug_assert!(
            node.device.is_none() || node.value.len() == node.rows * node.cols,
            "value of `{}` read on the host while it is on the device",
            node.op
        );
        &node.value
    }

    /// (rows, cols).
    pub fn shape(&self, t: Tensor) -> (usize, usize) {
        (self.nodes[t.id].rows, self.nodes[t.id].cols)
    }

    /// Row domain.
    pub fn domain(&self, t: Tensor) -> RowDomain {
        self.nodes[t.id].domain
    }

    /// Whether gradients flow through this tensor.
    pub fn requires_grad(&self, t: Tensor) -> bool {
        self.nodes[t.id].requires_grad
    }

    /// Whether the tensor is identical on every rank.
    pub fn is_replicated(&self, t: Tensor) -> bool {
        self.nodes[t.id].replicated
    }

    pub(crate) fn push_raw(
        &mut self,
        spec: NodeSpec,
        value: Vec<T>,
        requires_grad: bool,
        backward: Option<BackwardFn<T>>,
    ) -> Tensor {
        debug_assert_eq!(value.len(), spec.rows * spec.cols, "op {}", spec.op);
        self.push_stored(spec, value, None, requires_grad, backward)
    }

    /// [`Graph::push_raw`] for a value on the host (`value`) or, with
    /// `device`, on the graph's device (`value` empty).
    pub(crate) fn push_stored(
        &mut self,
        spec: NodeSpec,
        value: Vec<T>,
        device: Option<DeviceMem>,
        requires_grad: bool,
        backward: Option<BackwardFn<T>>,
    ) -> Tensor {
        let ran_on_device = device.is_some();
        self.live_bytes +=
            (value.len() + device.as_ref().map_or(0, DeviceMem::len)) * std::mem::size_of::<T>();
        self.nodes.push(Node {
            value,
            rows: spec.rows,
            cols: spec.cols,
            domain: spec.domain,
            requires_grad,
            backward: if requires_grad { backward } else { None },
            op: spec.op,
            fresh: spec.fresh,
            replicated: spec.replicated,
            reads: Vec::new(),
            saved: false,
            released: false,
            release_after_backward: false,
            device,
            ran_on_device,
        });
        self.note_live();
        if let (Some(p), Some(node)) = (&mut self.profile, self.nodes.last()) {
            p.forward_node(&node.op);
        }
        Tensor {
            id: self.nodes.len() - 1,
        }
    }

    /// Records an op result: pushes the node, traces it, checks finiteness.
    /// `requires_grad` is true when any input requires it. Its backward may
    /// read every input's value and its output's (see
    /// [`Graph::push_op_reading`] for ops that read fewer).
    pub(crate) fn push_op(
        &mut self,
        spec: NodeSpec,
        value: Vec<T>,
        inputs: &[Tensor],
        indices: &[Index],
        handler: Option<&str>,
        backward: BackwardFn<T>,
    ) -> Result<Tensor, EngineError> {
        let output = Tensor {
            id: self.nodes.len(),
        };
        let reads: Vec<Tensor> = inputs.iter().copied().chain([output]).collect();
        self.push_op_reading(spec, value, inputs, indices, handler, backward, &reads)
    }

    /// [`Graph::push_op`] for an op whose backward reads the values of
    /// `reads` only (among its inputs and its output, the tensor the call
    /// returns): the others can be released after their last forward use
    /// (see [`Graph::release`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_op_reading(
        &mut self,
        spec: NodeSpec,
        value: Vec<T>,
        inputs: &[Tensor],
        indices: &[Index],
        handler: Option<&str>,
        backward: BackwardFn<T>,
        reads: &[Tensor],
    ) -> Result<Tensor, EngineError> {
        let op = OpRecord {
            inputs,
            indices,
            handler,
            reads,
        };
        self.push_op_stored(spec, value, None, op, backward)
    }

    /// [`Graph::push_op_reading`] for an output on the host (`value`) or,
    /// with `device`, on the graph's device (`value` empty; the backward
    /// then runs on the device too).
    pub(crate) fn push_op_stored(
        &mut self,
        spec: NodeSpec,
        value: Vec<T>,
        device: Option<DeviceMem>,
        op: OpRecord<'_>,
        backward: BackwardFn<T>,
    ) -> Result<Tensor, EngineError> {
        let OpRecord {
            inputs,
            indices,
            handler,
            reads,
        } = op;
        // Ops read only their inputs, so an op whose inputs include a
        // deferred sum has just computed from a partial: refuse it (every
        // rank does, at the same op), and the caller runs again eagerly.
        if inputs.iter().any(|t| self.pending.contains(&t.id)) {
            return Err(EngineError::DeferredSumRead { op: spec.op });
        }
        // An op that computed from a released input read an empty slice:
        // its value must not reach the tape.
        self.check_live(inputs)?;
        let requires_grad = inputs.iter().any(|t| self.nodes[t.id].requires_grad);
        // A device output that finite checks or the trace read comes to the
        // host once, and stays as the node's host copy (inspection runs
        // trade memory for one download instead of two).
        let mut value = value;
        if let (Some(mem), Some(backend)) = (&device, &self.backend) {
            if self.check_finite || self.trace.is_some() {
                value = downloaded(backend.as_ref(), mem)
                    .map_err(|e| EngineError::device(&spec.op, e))?;
            }
        }
        if self.check_finite {
            if let Some(pos) = value.iter().position(|x| !x.is_finite()) {
                let op = spec.op.clone();
                return Err(EngineError::NonFinite {
                    op,
                    what: format!(
                        "element {pos} of a {}×{} {:?} output",
                        spec.rows, spec.cols, spec.domain
                    ),
                });
            }
        }
        if let Some(h) = handler {
            *self.handler_counts.entry(h.to_string()).or_insert(0) += 1;
        }
        let t = self.push_stored(spec, value, device, requires_grad, Some(backward));
        if requires_grad {
            let reads: Vec<usize> = reads.iter().map(|r| r.id).collect();
            for &r in &reads {
                self.nodes[r].saved = true;
            }
            self.nodes[t.id].reads = reads;
        }
        self.record(t, inputs, indices, handler);
        Ok(t)
    }

    fn record(&mut self, t: Tensor, inputs: &[Tensor], indices: &[Index], handler: Option<&str>) {
        if self.trace.is_none() {
            return;
        }
        let shape = |n: &Node<T>| TraceShape {
            domain: n.domain,
            rows: n.rows,
            cols: n.cols,
        };
        let node = &self.nodes[t.id];
        let owned = match (&self.dist, node.domain) {
            (Some(d), RowDomain::Atom) if node.rows == d.n_local() => d.n_owned(),
            _ => node.rows,
        };
        // A device output has its host copy while tracing (see
        // `Graph::push_op_stored`).
        let owned_values = &node.value[..owned * node.cols];
        let sum: f64 = owned_values.iter().map(|x| x.to_f64_lossless()).sum();
        let sum_sq: f64 = owned_values
            .iter()
            .map(|x| {
                let v = x.to_f64_lossless();
                v * v
            })
            .sum();
        let device = match (&node.device, &self.backend) {
            (Some(_), Some(b)) if node.ran_on_device => Some(b.name()),
            _ => None,
        };
        let event = TraceEvent {
            seq: 0,
            phase: Phase::Forward,
            op: node.op.clone(),
            scope: self.scope.join("/"),
            inputs: inputs.iter().map(|i| shape(&self.nodes[i.id])).collect(),
            output: shape(node),
            indices: indices
                .iter()
                .map(|i| {
                    let ix = &self.indices[i.id];
                    format!("{} ({:?} → {:?})", ix.role, ix.domain, ix.target)
                })
                .collect(),
            handler: handler.map(str::to_string),
            owned_sum: sum,
            owned_sum_sq: sum_sq,
            replicated: node.replicated,
            input_ids: inputs.iter().map(|t| t.id).collect(),
            output_id: t.id,
            device,
        };
        if let Some(trace) = &mut self.trace {
            trace.push(event);
        }
    }

    /// Reverse-mode gradient of `Σ seed ⊙ output` with respect to `wrt`.
    ///
    /// `seed` defaults to ones. Returns one gradient per `wrt` tensor (zeros
    /// where the output does not depend on it, unless `strict`).
    pub fn grad(
        &mut self,
        output: Tensor,
        seed: Option<Vec<T>>,
        wrt: &[Tensor],
    ) -> Result<Vec<Vec<T>>, EngineError> {
        self.resolve_pending()?;
        self.backward(output, seed, wrt, None)
    }

    /// [`Graph::grad`] for a seed that every rank passes identically (a
    /// replicated output such as the energy). When `output` is a deferred
    /// all-reduce its adjoint needs no communication — the gradient of
    /// `Σ_ranks x` for a seed shared by all ranks is that seed on each — so
    /// no rank waits for its peers between forward and backward; the sum
    /// itself stays pending until [`Graph::resolve_pending`].
    pub fn grad_replicated_seed(
        &mut self,
        output: Tensor,
        seed: Option<Vec<T>>,
        wrt: &[Tensor],
    ) -> Result<Vec<Vec<T>>, EngineError> {
        // Other pending sums feed nothing (recording a consumer would have
        // completed them), so they receive no gradient and can wait.
        let root = self.is_pending(output).then_some(output.id);
        self.backward(output, seed, wrt, root)
    }

    fn backward(
        &mut self,
        output: Tensor,
        seed: Option<Vec<T>>,
        wrt: &[Tensor],
        replicated_root: Option<usize>,
    ) -> Result<Vec<Vec<T>>, EngineError> {
        let n = self.nodes.len();
        let mut grads: Vec<Option<Vec<T>>> = (0..n).map(|_| None).collect();
        let out_len = self.nodes[output.id].rows * self.nodes[output.id].cols;
        let seed = seed.unwrap_or_else(|| vec![T::one(); out_len]);
        if seed.len() != out_len {
            return Err(EngineError::shape(
                "grad",
                "seed length differs from the output",
            ));
        }
        if !self.nodes[output.id].requires_grad {
            return Err(EngineError::SeveredGradient {
                what: "any differentiable input".into(),
            });
        }
        grads[output.id] = Some(seed);
        let keep: std::collections::HashSet<usize> = wrt.iter().map(|t| t.id).collect();
        // Gradients made by ops that ran on the device, summed there.
        let mut device_grads: Vec<Option<DeviceMem>> = (0..n).map(|_| None).collect();
        let Graph {
            nodes,
            indices,
            trace,
            dist,
            handler_counts,
            pool,
            live_bytes,
            live_stats,
            profile,
            backend,
            ..
        } = self;
        let backend = backend.as_deref();
        // Every rank walks the same nodes in the same order, so collective
        // adjoints (refresh ↔ reverse-sum, all-reduce) line up across ranks.
        for id in (0..=output.id).rev() {
            let node = &nodes[id];
            let len = node.rows * node.cols;
            let on_device = node.ran_on_device && node.backward.is_some();
            // A tensor read by ops on both sides has a gradient in both
            // places: the two parts meet where its own backward runs.
            let (g, g_device) = match (grads[id].take(), device_grads[id].take(), backend) {
                (None, None, _) => {
                    release_passed(nodes, pool, live_bytes, id);
                    continue;
                }
                (host, Some(mut dev), Some(b)) if on_device => {
                    if let Some(host) = host {
                        let up = b
                            .upload(&host)
                            .map_err(|e| EngineError::device(&node.op, e))?;
                        b.axpy(1.0, &up, &mut dev, true)
                            .map_err(|e| EngineError::device(&node.op, e))?;
                        pool.give(host);
                    }
                    (Vec::new(), Some(dev))
                }
                (Some(host), None, Some(b)) if on_device => {
                    let dev = b
                        .upload(&host)
                        .map_err(|e| EngineError::device(&node.op, e))?;
                    pool.give(host);
                    (Vec::new(), Some(dev))
                }
                (host, dev, _) => {
                    let mut host = host.unwrap_or_else(|| pool.zeroed(len));
                    if let (Some(dev), Some(b)) = (dev, backend) {
                        add_download(b, &dev, &mut host, pool)
                            .map_err(|e| EngineError::device(&node.op, e))?;
                    }
                    (host, None)
                }
            };
            let Some(bw) = &node.backward else {
                grads[id] = Some(g);
                release_passed(nodes, pool, live_bytes, id);
                continue;
            };
            if let Some(&r) = node.reads.iter().find(|&&r| nodes[r].released) {
                return Err(EngineError::Released {
                    op: nodes[r].op.clone(),
                });
            }
            let mut ctx = BackwardCtx {
                nodes,
                indices,
                grads: &mut grads,
                device_grads: &mut device_grads,
                backend,
                out_grad_device: g_device.as_ref(),
                dist: dist.as_deref_mut(),
                counts: handler_counts,
                pool,
                replicated_root,
            };
            let started = profile.is_some().then(std::time::Instant::now);
            bw(&mut ctx, &g)?;
            if let (Some(p), Some(t0)) = (profile.as_mut(), started) {
                p.backward_node(&node.op, t0);
            }
            if let Some(tr) = trace.as_mut() {
                let on_host = match (&g_device, backend) {
                    (Some(dev), Some(b)) => {
                        downloaded(b, dev).map_err(|e| EngineError::device(&node.op, e))?
                    }
                    _ => Vec::new(),
                };
                let sum: f64 = g.iter().chain(&on_host).map(|x| x.to_f64_lossless()).sum();
                tr.push(TraceEvent {
                    seq: 0,
                    phase: Phase::Backward,
                    op: format!("{}.backward", node.op),
                    scope: String::new(),
                    inputs: vec![TraceShape {
                        domain: node.domain,
                        rows: node.rows,
                        cols: node.cols,
                    }],
                    output: TraceShape {
                        domain: node.domain,
                        rows: node.rows,
                        cols: node.cols,
                    },
                    indices: Vec::new(),
                    handler: None,
                    owned_sum: sum,
                    owned_sum_sq: 0.0,
                    replicated: false,
                    input_ids: vec![id],
                    output_id: id,
                    device: g_device.as_ref().and(backend).map(|b| b.name()),
                });
            }
            if let Some(stats) = live_stats.as_mut() {
                // The gradients alive right after this step, with the one
                // just consumed (the peak of the step).
                let grad_bytes = (grads.iter().flatten().map(Vec::len).sum::<usize>() + g.len())
                    * std::mem::size_of::<T>();
                note_peak(nodes, stats, *live_bytes, grad_bytes, true);
            }
            // Intermediate gradients are dropped as soon as they are consumed.
            if keep.contains(&id) {
                grads[id] = Some(g);
            } else {
                pool.give(g);
            }
            // No backward left to run reads this node's value: nodes read
            // only their inputs (earlier nodes) and their own output.
            release_passed(nodes, pool, live_bytes, id);
        }
        // Leaves have no backward: a device part of their gradient is
        // still on the device.
        let mut out = Vec::with_capacity(wrt.len());
        for t in wrt {
            let len = self.nodes[t.id].rows * self.nodes[t.id].cols;
            let mut g = grads[t.id].take().unwrap_or_else(|| vec![T::zero(); len]);
            if let (Some(dev), Some(b)) = (device_grads[t.id].take(), self.backend.as_deref()) {
                add_download(b, &dev, &mut g, &mut self.pool)
                    .map_err(|e| EngineError::device("grad", e))?;
            }
            out.push(g);
        }
        // Gradients of leaves nobody asked for are recycled, not dropped.
        for g in grads.into_iter().flatten() {
            self.pool.give(g);
        }
        Ok(out)
    }
}

/// `host += dev` (downloaded through a recycled buffer).
fn add_download<T: Scalar>(
    backend: &dyn DeviceBackend<T>,
    dev: &DeviceMem,
    host: &mut [T],
    pool: &mut Buffers<T>,
) -> Result<(), crate::device::DeviceError> {
    let mut tmp = pool.for_overwrite(dev.len());
    backend.download(dev, &mut tmp)?;
    for (h, d) in host.iter_mut().zip(&tmp) {
        *h += *d;
    }
    pool.give(tmp);
    Ok(())
}

/// Returns the value of node `id` to the pool once the backward pass has
/// passed it, if its caller released it while a backward still read it.
fn release_passed<T: Scalar>(
    nodes: &mut [Node<T>],
    pool: &mut Buffers<T>,
    live_bytes: &mut usize,
    id: usize,
) {
    let node = &mut nodes[id];
    if node.release_after_backward && !node.released {
        free_value(node, pool, live_bytes);
    }
}

/// Releases `node`'s value: its host copy back to the pool, its device copy
/// dropped, both off the live bytes.
fn free_value<T: Scalar>(node: &mut Node<T>, pool: &mut Buffers<T>, live_bytes: &mut usize) {
    let value = std::mem::take(&mut node.value);
    node.released = true;
    let device_len = node.device.take().map_or(0, |m| m.len());
    *live_bytes = live_bytes.saturating_sub((value.len() + device_len) * std::mem::size_of::<T>());
    pool.give(value);
}

/// A host copy of device memory `mem`.
fn downloaded<T: Scalar>(
    backend: &dyn DeviceBackend<T>,
    mem: &DeviceMem,
) -> Result<Vec<T>, crate::device::DeviceError> {
    let mut v = vec![T::zero(); mem.len()];
    backend.download(mem, &mut v)?;
    Ok(v)
}

/// Makes `stats` the breakdown of this moment when `live + grad_bytes`
/// exceeds its peak.
fn note_peak<T: Scalar>(
    nodes: &[Node<T>],
    stats: &mut LiveStats,
    live: usize,
    grad_bytes: usize,
    in_backward: bool,
) {
    let total = live + grad_bytes;
    if total <= stats.peak_bytes {
        return;
    }
    let mut by_op: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes {
        // Host and device copies both count.
        let len = n.value.len() + n.device.as_ref().map_or(0, DeviceMem::len);
        if len > 0 {
            *by_op.entry(n.op.as_str()).or_insert(0) += len * std::mem::size_of::<T>();
        }
    }
    let mut peak_by_op: Vec<(String, usize)> =
        by_op.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    if grad_bytes > 0 {
        peak_by_op.push(("(gradients)".into(), grad_bytes));
    }
    peak_by_op.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    *stats = LiveStats {
        peak_bytes: total,
        peak_in_backward: in_backward,
        peak_by_op,
    };
}
