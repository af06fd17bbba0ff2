//! `ddmlip bench cores`: the parallel efficiency this machine allows a
//! decomposed run, measured without any model.
//!
//! A decomposed step lasts as long as its slowest rank. `T` threads here do
//! identical, independent work (nothing shared, nothing exchanged) and meet
//! at a barrier after every step, as ranks do; the ratio of the one-thread
//! step to the slowest thread's step is the efficiency that a perfectly
//! balanced split without any overhead would reach. Against the mean thread
//! instead, it is what a split that moves work from slow to fast cores
//! within a step could reach at best.
use super::stats::{cores, median};
use crate::error::CliError;
use anyhow::anyhow;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Arguments of `ddmlip bench cores`.
#[derive(Args)]
pub struct CoresBenchArgs {
    /// Threads working together (the rank count to compare with). Default:
    /// the machine's cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Timed steps of each run (after one untimed step).
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    steps: usize,
    /// Work per thread and step, in milliseconds of one thread alone.
    #[arg(long, default_value_t = DEFAULT_WORK_MS)]
    work_ms: f64,
    /// Kernels to time, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "compute,cache"
    )]
    kernels: Vec<Kernel>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The work each thread repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// Eight independent multiply-then-add chains in registers: arithmetic
    /// only.
    Compute,
    /// Sums over a private 1 MiB array, which stays in the core's own cache.
    Cache,
}

/// Timed steps per run unless asked otherwise.
pub const DEFAULT_STEPS: usize = 8;

/// Work per thread and step (ms of one thread alone) unless asked otherwise.
pub const DEFAULT_WORK_MS: f64 = 300.0;

/// Every kernel, in the order they are timed.
pub const KERNELS: [Kernel; 2] = [Kernel::Compute, Kernel::Cache];

/// The most threads `bench cores` starts (as many as the threads backend
/// runs ranks).
const MAX_THREADS: usize = 1024;

/// Elements of the `cache` kernel's private array (1 MiB of f64).
const CACHE_ELEMENTS: usize = 1 << 17;

impl Kernel {
    /// Runs `units` units of work and returns a checksum, which depends only
    /// on `units` (so every thread given the same work returns the same bits).
    fn run(self, units: u64, array: &[f64]) -> f64 {
        match self {
            Self::Compute => {
                let y = black_box(1.000_000_1_f64);
                let mut a = [1.0_f64; 8];
                for _ in 0..units * 1024 {
                    for v in &mut a {
                        *v = *v * y + 1e-9;
                    }
                }
                a.iter().sum()
            }
            Self::Cache => {
                let mut total = 0.0;
                for _ in 0..units {
                    let mut q = [0.0_f64; 8];
                    for chunk in black_box(array).chunks_exact(8) {
                        for (s, x) in q.iter_mut().zip(chunk) {
                            *s += x;
                        }
                    }
                    total += q.iter().sum::<f64>();
                }
                total
            }
        }
    }
}

/// One kernel's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct CoresRecord {
    pub kernel: Kernel,
    pub threads: usize,
    /// Work units per thread and step (calibrated to `--work-ms`).
    pub units: u64,
    /// Median step of one thread alone, measured before and after the
    /// threads run together (s).
    pub alone_s: f64,
    /// Per step: the mean thread's time (s).
    pub mean_s: Vec<f64>,
    /// Per step: the slowest thread's time (s).
    pub slowest_s: Vec<f64>,
    /// `alone_s` / the mean over steps of `slowest_s`: the efficiency of a
    /// perfectly balanced split without overhead on this machine.
    pub ceiling: f64,
    /// `alone_s` / the mean over steps of `mean_s`: the same, had every
    /// step's work been shared out as the threads' speeds allowed.
    pub balanced_ceiling: f64,
}

/// Times of `threads` threads doing `units` of `kernel` per step, meeting
/// after each of `steps` timed steps (one untimed step first): per step, the
/// time of every thread (s), and the checksums of all threads.
fn lockstep(
    kernel: Kernel,
    threads: usize,
    units: u64,
    steps: usize,
) -> Result<(Vec<Vec<f64>>, Vec<f64>), CliError> {
    let barrier = Barrier::new(threads);
    let per_thread: Vec<(Vec<f64>, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let array: Vec<f64> = (0..CACHE_ELEMENTS).map(|i| i as f64 * 1e-9).collect();
                    let mut times = Vec::with_capacity(steps);
                    let mut checksum = 0.0;
                    for step in 0..=steps {
                        barrier.wait();
                        let t0 = Instant::now();
                        checksum = kernel.run(units, &array);
                        if step > 0 {
                            times.push(t0.elapsed().as_secs_f64());
                        }
                    }
                    (times, checksum)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(|_| CliError::failed(anyhow!("a benchmark thread panicked")))?;
    let by_step = (0..steps)
        .map(|s| per_thread.iter().map(|(t, _)| t[s]).collect())
        .collect();
    Ok((by_step, per_thread.iter().map(|(_, c)| *c).collect()))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Work units for about `work_ms` of one thread alone.
fn calibrate(kernel: Kernel, work_ms: f64) -> Result<u64, CliError> {
    let mut units = 1u64;
    loop {
        let (times, _) = lockstep(kernel, 1, units, 1)?;
        let t = times[0][0];
        // Long enough to extrapolate from, or already at the target.
        if t >= 0.02 || t * 1e3 >= work_ms {
            let scaled = (units as f64 * work_ms / (t * 1e3)).round();
            return Ok(scaled.max(1.0) as u64);
        }
        units *= 4;
    }
}

/// Measures one kernel: alone, `threads` together, alone again.
pub fn measure(
    kernel: Kernel,
    threads: usize,
    steps: usize,
    work_ms: f64,
) -> Result<CoresRecord, CliError> {
    let units = calibrate(kernel, work_ms)?;
    let alone_steps = steps.clamp(1, 3);
    let (before, _) = lockstep(kernel, 1, units, alone_steps)?;
    let (together, checksums) = lockstep(kernel, threads, units, steps)?;
    let (after, _) = lockstep(kernel, 1, units, alone_steps)?;
    // Identical work gives identical bits on every thread; anything else
    // means the threads did not do the same work.
    if checksums
        .iter()
        .any(|c| c.to_bits() != checksums[0].to_bits())
    {
        return Err(CliError::failed(anyhow!(
            "the {kernel:?} kernel gave different checksums on different threads"
        )));
    }
    let alone: Vec<f64> = before.iter().chain(&after).map(|s| s[0]).collect();
    let alone_s = median(&alone);
    let mean_s: Vec<f64> = together.iter().map(|s| mean(s)).collect();
    let slowest_s: Vec<f64> = together
        .iter()
        .map(|s| s.iter().copied().fold(0.0, f64::max))
        .collect();
    Ok(CoresRecord {
        kernel,
        threads,
        units,
        alone_s,
        ceiling: alone_s / mean(&slowest_s),
        balanced_ceiling: alone_s / mean(&mean_s),
        mean_s,
        slowest_s,
    })
}

pub fn run(a: &CoresBenchArgs) -> Result<u8, CliError> {
    let threads = a.threads.unwrap_or_else(cores);
    if threads == 0 || a.steps == 0 {
        return Err(CliError::input(anyhow!(
            "--threads and --steps must be at least 1"
        )));
    }
    if !(a.work_ms.is_finite() && a.work_ms > 0.0) {
        return Err(CliError::input(anyhow!(
            "--work-ms must be a positive number of milliseconds, got {}",
            a.work_ms
        )));
    }
    if threads > MAX_THREADS {
        return Err(CliError::input(anyhow!(
            "--threads {threads} is more than this benchmark starts (at most {MAX_THREADS})"
        )));
    }
    let mut records = Vec::new();
    for &kernel in &a.kernels {
        if !a.json {
            eprintln!("timing the {kernel:?} kernel: 1 thread, {threads} together, 1 thread");
        }
        records.push(measure(kernel, threads, a.steps, a.work_ms)?);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "records": records })).unwrap_or_default()
        );
        return Ok(0);
    }
    println!(
        "{threads} threads, identical independent work, meeting after each of {} steps",
        a.steps
    );
    println!("kernel    alone s   together: mean s  slowest s   ceiling  balanced");
    for r in &records {
        println!(
            "{:<8} {:>8.4} {:>17.4} {:>10.4} {:>8.1}% {:>8.1}%",
            format!("{:?}", r.kernel).to_lowercase(),
            r.alone_s,
            mean(&r.mean_s),
            mean(&r.slowest_s),
            100.0 * r.ceiling,
            100.0 * r.balanced_ceiling
        );
    }
    println!(
        "ceiling = alone / slowest: the best parallel efficiency of a {threads}-rank run whose ranks \
         meet every step, with perfect balance and no overhead; balanced = alone / mean: the best \
         with work moved between ranks within a step."
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lockstep_threads_do_the_same_work_and_the_slowest_bounds_the_mean() {
        for kernel in [Kernel::Compute, Kernel::Cache] {
            let r = measure(kernel, 3, 4, 2.0).unwrap();
            assert_eq!(r.mean_s.len(), 4);
            assert_eq!(r.slowest_s.len(), 4);
            for (m, s) in r.mean_s.iter().zip(&r.slowest_s) {
                assert!(*m > 0.0 && m <= s, "{kernel:?}: mean {m} slowest {s}");
            }
            assert!(r.ceiling > 0.0 && r.ceiling <= r.balanced_ceiling);
        }
    }

    #[test]
    fn kernels_depend_on_the_work_alone() {
        let array: Vec<f64> = (0..CACHE_ELEMENTS).map(|i| i as f64 * 1e-9).collect();
        // The cache kernel's sum of one pass is Σ i·1e-9 over the array.
        let n = CACHE_ELEMENTS as f64;
        let pass = Kernel::Cache.run(1, &array);
        assert!((pass - 1e-9 * n * (n - 1.0) / 2.0).abs() < 1e-9 * pass);
        assert_eq!(Kernel::Cache.run(3, &array).to_bits(), {
            let mut t = 0.0;
            for _ in 0..3 {
                t += pass;
            }
            t.to_bits()
        });
        // The compute kernel's chains: a ← a·y + 1e-9, 1024·units times, from 1.
        let (y, k) = (1.000_000_1_f64, 1024 * 2);
        let mut a = 1.0_f64;
        for _ in 0..k {
            a = a * y + 1e-9;
        }
        let eight: f64 = [a; 8].iter().sum();
        assert_eq!(Kernel::Compute.run(2, &array).to_bits(), eight.to_bits());
    }
}
