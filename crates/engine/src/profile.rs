//! Where a graph's time goes, by op name: [`OpProfile`], recorded while
//! [`Graph::enable_profile`](crate::Graph::enable_profile) is on.
//!
//! Forward: an op computes its output before it records the node, so the
//! time from one recorded node to the next is the later op's (with whatever
//! the model did in between: host-side constants, shape logic, waiting for a
//! halo exchange). Backward: each node's backward call is timed on its own.
//! Both totals thus cover the whole of their pass, and the profile is one
//! `Instant::now` and one map lookup per op when on, one branch when off.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;

/// Time spent in one op kind during one phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    /// The op's name as recorded in the graph (as in traces): `matmul`,
    /// `silu`, `gather`, an imported graph's `einsum` or `aten.mul.Tensor`, …
    pub op: String,
    /// Nodes of this op recorded (forward) or differentiated (backward).
    pub calls: usize,
    /// Wall-clock seconds, summed over the calls.
    pub seconds: f64,
}

/// Seconds per op kind of one or more graph runs, forward and backward
/// separately. Each list is sorted by decreasing time (ties by name).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpProfile {
    /// Forward pass: per op, the time from the previous recorded node to its
    /// own (the op's computation and the model's code before it).
    pub forward: Vec<OpTime>,
    /// Backward pass: per op, the time of its nodes' backward calls.
    pub backward: Vec<OpTime>,
}

impl OpProfile {
    /// Seconds of the forward list, summed.
    pub fn forward_s(&self) -> f64 {
        self.forward.iter().map(|t| t.seconds).sum()
    }

    /// Seconds of the backward list, summed.
    pub fn backward_s(&self) -> f64 {
        self.backward.iter().map(|t| t.seconds).sum()
    }

    /// Forward plus backward seconds.
    pub fn total_s(&self) -> f64 {
        self.forward_s() + self.backward_s()
    }

    /// Adds `other`'s calls and seconds op by op (several evaluations, or
    /// ranks: the sum is then CPU-side work over ranks, not wall time).
    pub fn merge(&mut self, other: &OpProfile) {
        merge_list(&mut self.forward, &other.forward);
        merge_list(&mut self.backward, &other.backward);
    }

    /// Divides every call count and time by `n` (> 0): the per-evaluation
    /// mean of `n` merged evaluations. Counts round to the nearest integer.
    pub fn scaled_down(mut self, n: usize) -> OpProfile {
        let n = n.max(1);
        for t in self.forward.iter_mut().chain(self.backward.iter_mut()) {
            t.calls = (t.calls + n / 2) / n;
            t.seconds /= n as f64;
        }
        self
    }

    /// The entry of `op` in the forward list.
    pub fn forward_op(&self, op: &str) -> Option<&OpTime> {
        self.forward.iter().find(|t| t.op == op)
    }

    /// The entry of `op` in the backward list.
    pub fn backward_op(&self, op: &str) -> Option<&OpTime> {
        self.backward.iter().find(|t| t.op == op)
    }
}

fn merge_list(into: &mut Vec<OpTime>, from: &[OpTime]) {
    for t in from {
        match into.iter_mut().find(|x| x.op == t.op) {
            Some(x) => {
                x.calls += t.calls;
                x.seconds += t.seconds;
            }
            None => into.push(t.clone()),
        }
    }
    sort(into);
}

fn sort(list: &mut [OpTime]) {
    list.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.op.cmp(&b.op)));
}

/// The running profile a graph holds while profiling is on.
pub(crate) struct Profiler {
    /// When the last forward node was recorded (or profiling started).
    mark: Instant,
    forward: HashMap<String, (usize, f64)>,
    backward: HashMap<String, (usize, f64)>,
}

impl Profiler {
    pub(crate) fn new() -> Self {
        Self {
            mark: Instant::now(),
            forward: HashMap::new(),
            backward: HashMap::new(),
        }
    }

    /// Restarts the forward clock: time until the next node is not an op's.
    pub(crate) fn restart(&mut self) {
        self.mark = Instant::now();
    }

    /// A forward node of `op` was just recorded.
    pub(crate) fn forward_node(&mut self, op: &str) {
        let now = Instant::now();
        let dt = now.duration_since(self.mark).as_secs_f64();
        self.mark = now;
        add(&mut self.forward, op, dt);
    }

    /// A backward call of `op` that began at `start` just returned.
    pub(crate) fn backward_node(&mut self, op: &str, start: Instant) {
        add(&mut self.backward, op, start.elapsed().as_secs_f64());
        // Forward ops recorded after a backward pass (a second model call on
        // the same graph) are timed from here.
        self.mark = Instant::now();
    }

    pub(crate) fn finish(self) -> OpProfile {
        let list = |m: HashMap<String, (usize, f64)>| {
            let mut v: Vec<OpTime> = m
                .into_iter()
                .map(|(op, (calls, seconds))| OpTime { op, calls, seconds })
                .collect();
            sort(&mut v);
            v
        };
        OpProfile {
            forward: list(self.forward),
            backward: list(self.backward),
        }
    }
}

fn add(map: &mut HashMap<String, (usize, f64)>, op: &str, dt: f64) {
    // Look up by `&str` first: no allocation for an op seen before.
    if let Some(e) = map.get_mut(op) {
        e.0 += 1;
        e.1 += dt;
    } else {
        map.insert(op.to_string(), (1, dt));
    }
}
