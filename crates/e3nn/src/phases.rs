//! Per-phase wall time, CPU time and FLOP counts of the kernels, for
//! finding where threads wait.
//!
//! Off by default: a disabled [`PhaseClock::start`] is one relaxed atomic
//! load, and nothing is recorded. Enabled ([`set_enabled`]), each timed
//! call adds its wall time, the CPU time the whole process (all threads)
//! used meanwhile, and the FLOPs its caller states to a process-wide table
//! keyed by phase name and direction; [`take`] returns the table in first-use
//! order and empties it.
//!
//! The CPU time is the process's (`CLOCK_PROCESS_CPUTIME_ID`), so a phase's
//! `cpu_s / wall_s` is the number of cores it kept busy only when nothing
//! else in the process runs at the same time — one evaluation on one rank,
//! as `ddmlip bench model --phases` arranges. `cpu_s` below `wall_s ×
//! threads` is time threads waited (serial sections, imbalance, barriers)
//! or were descheduled by other processes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<Vec<PhaseTotal>> = Mutex::new(Vec::new());

/// Which pass of the evaluation a phase belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pass {
    /// The forward pass (energy).
    Forward,
    /// The backward pass (gradients for forces and stress).
    Backward,
}

impl Pass {
    /// `"forward"` or `"backward"`.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
        }
    }
}

/// Totals of one phase since the last [`take`].
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTotal {
    /// The phase (a kernel's name, e.g. `2_convolution`).
    pub name: String,
    /// Forward or backward.
    pub pass: Pass,
    /// Timed calls.
    pub calls: u64,
    /// Wall time of those calls, s.
    pub wall_s: f64,
    /// CPU time of the whole process during those calls (all threads), s.
    pub cpu_s: f64,
    /// Floating-point operations the callers counted (a multiply-add is 2);
    /// 0 where the phase is not counted.
    pub flops: f64,
}

/// Turns recording on or off for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether recording is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The table recorded since the last call (phases in first-use order), and
/// an empty table from here on.
pub fn take() -> Vec<PhaseTotal> {
    std::mem::take(&mut *TABLE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// CPU time of this process so far (all threads, user + system), s; `None`
/// where the clock cannot be read.
pub fn process_cpu_s() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// A started measurement; [`PhaseClock::stop`] records it. Inert when
/// recording was off at [`PhaseClock::start`].
#[must_use = "a phase is recorded by stop()"]
pub struct PhaseClock(Option<(Instant, f64)>);

impl PhaseClock {
    /// Starts timing if recording is on (otherwise costs one atomic load).
    pub fn start() -> Self {
        if !enabled() {
            return Self(None);
        }
        Self(process_cpu_s().map(|cpu| (Instant::now(), cpu)))
    }

    /// Adds the time since [`PhaseClock::start`] and `flops` to the phase
    /// `name` of pass `pass`.
    pub fn stop(self, name: &str, pass: Pass, flops: f64) {
        let Some((t0, c0)) = self.0 else { return };
        let wall_s = t0.elapsed().as_secs_f64();
        let cpu_s = process_cpu_s().map_or(0.0, |c| (c - c0).max(0.0));
        let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        match table.iter_mut().find(|p| p.pass == pass && p.name == name) {
            Some(p) => {
                p.calls += 1;
                p.wall_s += wall_s;
                p.cpu_s += cpu_s;
                p.flops += flops;
            }
            None => table.push(PhaseTotal {
                name: name.to_string(),
                pass,
                calls: 1,
                wall_s,
                cpu_s,
                flops,
            }),
        }
    }
}

/// Runs `f`, recorded as phase `name` of pass `pass` with `flops` when
/// recording is on.
pub fn timed<R>(name: &str, pass: Pass, flops: f64, f: impl FnOnce() -> R) -> R {
    let clock = PhaseClock::start();
    let r = f();
    clock.stop(name, pass, flops);
    r
}
