//! A per-step hook for progress displays (rank 0 only).

use std::sync::Arc;

/// Where a run stands after a step, as rank 0 reports it to a
/// [`StepObserver`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepProgress {
    /// Steps done in this call.
    pub done: u64,
    /// Steps this call runs at most (`--steps`, or `--max-steps` for a
    /// relaxation, which may stop earlier).
    pub total: u64,
    /// Simulated ns per wall-clock day so far (MD only).
    pub ns_per_day: Option<f64>,
    /// Instantaneous temperature (K, MD only).
    pub temperature: Option<f64>,
    /// The largest (generalized) force after the step (eV/Å, relaxation only).
    pub fmax: Option<f64>,
}

/// A callback rank 0 calls after every step; it must be cheap (it runs in
/// the step loop) and must not fail. Other ranks never call it, so it cannot
/// change any result.
#[derive(Clone)]
pub struct StepObserver(pub Arc<dyn Fn(&StepProgress) + Send + Sync>);

impl StepObserver {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&StepProgress) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Reports `p`.
    pub fn report(&self, p: &StepProgress) {
        (self.0)(p)
    }
}

impl std::fmt::Debug for StepObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepObserver")
    }
}
