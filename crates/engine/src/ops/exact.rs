//! f64 values behind rounded inputs, so that edge geometry in f32 graphs is
//! computed once in f64 and rounded once.
//!
//! An f32 edge vector `r_j − r_i + S·cell` evaluated on f32 positions rounds
//! three times (each position, the difference, the shift) and loses up to
//! ~1e-6 Å; every model built on edges inherits that error in its forces.
//! When the runtime gives the f64 positions and cell the graph's values were
//! rounded from, the edge ops compute the vector in f64 and round it once.
//! Only values change: gradients still flow to the `T` leaves (∂v/∂r = ±1,
//! ∂v/∂cell = S), and f64 graphs never keep these values (their results are
//! bit for bit what they were).

use crate::{DType, EngineError, Graph, Scalar, Tensor};
use std::sync::Arc;

impl<T: Scalar> Graph<T> {
    /// Records `values`, the f64 numbers that tensor `t`'s values are the
    /// rounding of (same length, row-major). Edge ops on `t` — or on
    /// [`Graph::apply_strain`] of it, whose f64 values follow — then compute
    /// their vectors and lengths in f64 and round once to `T`. A no-op in f64
    /// graphs, where the values are already exact.
    ///
    /// Errors: `values` and `t` differ in length, or some value does not
    /// round to `t`'s value (they would describe another geometry).
    pub fn set_exact_values(&mut self, t: Tensor, values: Vec<f64>) -> Result<(), EngineError> {
        if T::DTYPE == DType::F64 {
            return Ok(());
        }
        let own = &self.nodes[t.id].value;
        if own.len() != values.len() {
            return Err(EngineError::shape(
                "set_exact_values",
                format!(
                    "{} exact values for a tensor of {} values",
                    values.len(),
                    own.len()
                ),
            ));
        }
        let differs = |k: usize| {
            let r = T::from_f64(values[k]);
            r != own[k] && !(r.is_nan() && own[k].is_nan())
        };
        if let Some(k) = (0..own.len()).find(|&k| differs(k)) {
            return Err(EngineError::shape(
                "set_exact_values",
                format!(
                    "exact value {k} ({}) does not round to the tensor's value ({:?})",
                    values[k], own[k]
                ),
            ));
        }
        self.exact_values.push((t.id, Arc::new(values)));
        Ok(())
    }

    /// The f64 values behind `t`, if any were recorded.
    pub(crate) fn exact_values_of(&self, t: Tensor) -> Option<Arc<Vec<f64>>> {
        self.exact_values
            .iter()
            .find(|(id, _)| *id == t.id)
            .map(|(_, v)| v.clone())
    }
}
