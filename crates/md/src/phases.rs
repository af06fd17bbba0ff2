//! Where the wall-clock time of an MD step goes, phase by phase, measured on
//! rank 0 with one clock read at each phase boundary (tens of nanoseconds a
//! step, nothing per atom or per pair).

use serde::Serialize;
use std::time::Instant;

/// Seconds one rank's [`crate::RankEvaluator`] spent in the parts of its
/// force calls, summed over the calls since the last
/// [`crate::RankEvaluator::reset_phases`]. All fields are non-negative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EvalPhases {
    /// Keeping the candidate (skin) pairs within the model's cutoff.
    pub filter: f64,
    /// Building the graph's inputs (positions, strain, indices) and the
    /// model's forward pass.
    pub forward: f64,
    /// The gradient pass from the energy to positions and strain.
    pub backward: f64,
    /// Ghost forces sent home (reverse sum), pending sums completed, and
    /// the owned forces copied out.
    pub force_return: f64,
}

/// Mean wall-clock seconds per steady MD step on rank 0, phase by phase
/// (the steps [`crate::MdSummary::step_s`] averages over). With thread
/// ranks or MPI a phase that waits for peers (ghost refresh, force return,
/// reduce) includes the waiting. `other` is the rest of the step (thermo
/// rows, frames, checkpoints, progress): `step_s` minus the other phases,
/// so it can come out slightly negative from clock rounding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepPhases {
    /// Integrator work on owned atoms: kicks, drifts, thermostat and
    /// barostat updates, and the next step's first half advanced ahead.
    pub integrate: f64,
    /// Rebuilds (migration, ghosts, halo plan, pair list), amortised over
    /// all steady steps.
    pub rebuild: f64,
    /// Ghost positions refreshed from their owners on steps without a
    /// rebuild.
    pub ghost_refresh: f64,
    /// Candidate pairs filtered to the model's cutoff.
    pub filter: f64,
    /// Graph inputs and the model's forward pass.
    pub forward: f64,
    /// The gradient pass.
    pub backward: f64,
    /// Ghost forces reverse-summed to owners and owned forces copied out.
    pub force_return: f64,
    /// The step's one reduction (kinetic energy, sums, displacement).
    pub reduce: f64,
    /// The rest of the step: output and bookkeeping.
    pub other: f64,
}

/// Running sums of the driver's phases (the evaluator keeps its own).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DriverPhases {
    pub integrate: f64,
    pub rebuild: f64,
    pub ghost_refresh: f64,
    pub reduce: f64,
}

impl StepPhases {
    /// Per-step means from the sums over `steps` steps lasting `step_s`
    /// each on average.
    pub(crate) fn from_sums(
        driver: &DriverPhases,
        eval: &EvalPhases,
        steps: u64,
        step_s: f64,
    ) -> Self {
        let per = |s: f64| s / steps.max(1) as f64;
        let mut p = StepPhases {
            integrate: per(driver.integrate),
            rebuild: per(driver.rebuild),
            ghost_refresh: per(driver.ghost_refresh),
            filter: per(eval.filter),
            forward: per(eval.forward),
            backward: per(eval.backward),
            force_return: per(eval.force_return),
            reduce: per(driver.reduce),
            other: 0.0,
        };
        p.other = step_s - p.measured();
        p
    }

    /// The sum of every phase but `other`.
    pub fn measured(&self) -> f64 {
        self.integrate
            + self.rebuild
            + self.ghost_refresh
            + self.filter
            + self.forward
            + self.backward
            + self.force_return
            + self.reduce
    }
}

/// Seconds since `clock`, and `clock` moved to now: one clock read per
/// phase boundary.
pub(crate) fn lap(clock: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = now.duration_since(*clock).as_secs_f64();
    *clock = now;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_is_the_rest_of_the_step() {
        let driver = DriverPhases {
            integrate: 1.0,
            rebuild: 2.0,
            ghost_refresh: 3.0,
            reduce: 4.0,
        };
        let eval = EvalPhases {
            filter: 5.0,
            forward: 6.0,
            backward: 7.0,
            force_return: 8.0,
        };
        // 36 s of phases over 4 steps of 10 s each: 9 s measured, 1 s other.
        let p = StepPhases::from_sums(&driver, &eval, 4, 10.0);
        assert_eq!(p.integrate, 0.25);
        assert_eq!(p.force_return, 2.0);
        assert_eq!(p.measured(), 9.0);
        assert_eq!(p.other, 1.0);
    }
}
