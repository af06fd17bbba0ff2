//! Forward memory: each graph value's last use, found once at import, and
//! the release of engine tensors as the run passes it (the engine keeps a
//! released value only while a backward still reads it).

use super::*;
use ddmlip_engine::Tensor;
use std::collections::HashSet;

/// For each node of `program` (by position), the values whose last reader
/// it is: after it runs, nothing reads them. The program's outputs never
/// appear (the caller reads them after the run).
pub(super) fn last_uses(program: &crate::ir::Program) -> Vec<Vec<String>> {
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (k, node) in program.nodes.iter().enumerate() {
        for (_, arg) in &node.args {
            match arg {
                Arg::AsTensor(t) => {
                    last.insert(t.name.as_str(), k);
                }
                Arg::AsTensors(ts) => {
                    for t in ts {
                        last.insert(t.name.as_str(), k);
                    }
                }
                _ => {}
            }
        }
    }
    let outputs: HashSet<&str> = program.outputs.iter().map(String::as_str).collect();
    let mut dying = vec![Vec::new(); program.nodes.len()];
    for (name, k) in last {
        if !outputs.contains(name) {
            dying[k].push(name.to_string());
        }
    }
    // Deterministic release order (HashMap iteration is not).
    for names in &mut dying {
        names.sort_unstable();
    }
    dying
}

/// Which engine tensors the run's values still name, to release each once
/// no value names it.
#[derive(Default)]
pub(super) struct Liveness {
    /// Names bound to each engine tensor.
    refs: HashMap<Tensor, usize>,
    /// Tensors made before the model ran (positions, cell): the caller's.
    protected: HashSet<Tensor>,
}

impl Liveness {
    /// Keeps `tensors` (the caller's inputs) whatever the model does.
    pub(super) fn protect(&mut self, tensors: &[Tensor]) {
        self.protected.extend(tensors.iter().copied());
    }

    /// After a step that recorded the tensors from `start` on and bound
    /// `outputs`: counts the outputs' tensors and releases the step's
    /// intermediates that no value names.
    pub(super) fn after_step<T: Scalar>(
        &mut self,
        g: &mut Graph<T>,
        values: &HashMap<String, Val>,
        outputs: &[String],
        start: usize,
    ) {
        for name in outputs {
            if let Some(Val::T { t, .. }) = values.get(name) {
                *self.refs.entry(*t).or_insert(0) += 1;
            }
        }
        let made: Vec<Tensor> = g.tensors_from(start).collect();
        for t in made {
            if !self.refs.contains_key(&t) && !self.protected.contains(&t) {
                g.release(t);
            }
        }
    }

    /// Drops the values `names` (read for the last time) and releases the
    /// tensors no other value names.
    pub(super) fn drop_values<T: Scalar>(
        &mut self,
        g: &mut Graph<T>,
        values: &mut HashMap<String, Val>,
        names: &[String],
    ) {
        for name in names {
            let Some(Val::T { t, .. }) = values.remove(name) else {
                continue;
            };
            let Some(n) = self.refs.get_mut(&t) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&t);
                if !self.protected.contains(&t) {
                    g.release(t);
                }
            }
        }
    }
}
