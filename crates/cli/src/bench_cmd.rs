//! `ddmlip bench`: wall-clock and memory benchmarks of full evaluations
//! (forward + forces + stress) and of the machine's f32 GEMM rate.
//!
//! Every rank count of `bench model` runs in its own child process (this same
//! executable, re-invoked with the hidden `--child` flag) so that the rayon
//! pool can be sized per configuration (the global pool can be built only
//! once per process) and so that the peak RSS read from `/proc/self/status`
//! belongs to one configuration alone.

use super::{demo_crystal, load_model, read_structure, BalanceArg, Precision};
use crate::CliError;
use anyhow::{anyhow, Context};
use clap::{Args, Subcommand, ValueEnum};
use ddmlip_atoms::System;
use ddmlip_runtime::{EvalOptions, EvalResult, Evaluator, RankTimings};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::time::Instant;

/// Arguments of `ddmlip bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Time full evaluations (forward + forces + stress) of a model: median of
    /// --repeats after one warm-up, per rank count, each in its own process.
    Model(ModelBenchArgs),
    /// The parallel efficiency this machine allows a decomposed run: threads
    /// doing identical, independent work and meeting after every step, as
    /// ranks do, against one thread alone.
    Cores(crate::bench_cores::CoresBenchArgs),
    /// The f32 GEMM rate of this machine (matrixmultiply sgemm), single thread
    /// and split over row blocks on a rayon pool, as the engine splits it.
    Gemm(GemmBenchArgs),
}

/// Generated benchmark crystals.
#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Serialize, Deserialize)]
pub enum Crystal {
    /// Diamond Si, a = 5.43 Å, 8-atom conventional cell, rattled 0.05 Å.
    Si,
    /// FCC Cu, a = 3.615 Å, 4-atom conventional cell, rattled (the demo crystal).
    Cu,
}

#[derive(Args)]
struct ModelBenchArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    modal: Option<String>,
    /// Extended XYZ structure file (the first frame is timed).
    #[arg(long, conflicts_with = "crystal")]
    structure: Option<PathBuf>,
    /// Generated crystal when no --structure is given.
    #[arg(long, value_enum, default_value_t = Crystal::Cu)]
    crystal: Crystal,
    /// Conventional cells per axis of the generated crystal.
    #[arg(long, default_value_t = 10)]
    repeat: usize,
    /// Floating-point precision.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    dtype: Precision,
    /// Rank counts to time (threads backend), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    ranks: Vec<usize>,
    /// Rayon threads per rank: each rank of a split run has its own pool of
    /// this many workers. Default: the machine's cores / ranks (at least 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed evaluations after the warm-up; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Times through the whole rank list, alternating (1, 16, 1, 16, …):
    /// each rank count's median is over the steps of all rounds, so a
    /// machine whose speed drifts is sampled alike for every count.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// How split runs place domain boundaries.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    balance: BalanceArg,
    /// Ranks do not run pieces of other ranks' work while they wait (the
    /// threads backend shares work by default).
    #[arg(long)]
    no_work_sharing: bool,
    /// After the runs, time `bench cores` for the largest thread count
    /// (ranks × threads) and report its ceilings next to the efficiencies:
    /// what this machine allows a split whose ranks meet every step.
    #[arg(long)]
    ceiling: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Run exactly one rank count in this process and print its record as JSON.
    #[arg(long, hide = true)]
    child: bool,
}

#[derive(Args)]
struct GemmBenchArgs {
    /// GEMM shapes `MxKxN` (C = A·B, A is M×K), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "65536x64x64,65536x64x960,1024x1024x1024"
    )]
    shapes: Vec<String>,
    /// Rayon threads for the row-block-parallel run. Default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Timed calls per shape; the median is reported.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One timed configuration of `bench model` (one child process).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelRecord {
    pub model: String,
    pub dtype: String,
    /// What was evaluated (file name or generated crystal).
    pub structure: String,
    pub atoms: usize,
    /// Directed neighbour pairs within the model cutoff (single-process graph).
    pub edges: usize,
    pub ranks: usize,
    pub threads_per_rank: usize,
    /// Rayon workers of all ranks together (ranks × threads per rank).
    pub pool_threads: usize,
    /// `MATMUL_NUM_THREADS` as seen by the process (matrixmultiply's own threads).
    pub matmul_num_threads: Option<String>,
    /// How domain boundaries were placed (`--balance`; records from before
    /// the option read as the regular grid it then always was).
    #[serde(default = "geometric_name")]
    pub balance: String,
    /// Whether waiting ranks ran pieces of other ranks' work (records from
    /// before the option read as without, which they were).
    #[serde(default)]
    pub work_sharing: bool,
    pub warmup_s: f64,
    /// Wall time of every timed evaluation (s), of all rounds.
    pub times_s: Vec<f64>,
    /// Median of `times_s`.
    pub median_s: f64,
    /// With `--rounds` above 1: the median of each round, in run order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_medians_s: Vec<f64>,
    /// Median CPU time of the process (all threads, user + system) per
    /// evaluation (s); far above `median_s` × pool threads means waiting or
    /// spinning, far below means the machine was busy with other work.
    pub median_cpu_s: f64,
    /// Median wall time per atom and evaluation (µs).
    pub us_per_atom_step: f64,
    /// Atoms × evaluations per second at the median.
    pub atom_steps_per_s: f64,
    /// Resident set after loading model and structure, before evaluating (bytes).
    pub rss_before_bytes: u64,
    /// Peak resident set of the process (`VmHWM`, bytes).
    pub peak_rss_bytes: u64,
    /// Peak resident set / atoms (bytes).
    pub peak_rss_per_atom: f64,
    /// (peak − before) / atoms (bytes): what the evaluation itself added.
    pub eval_rss_per_atom: f64,
    /// Σ ghost rows / Σ owned rows over ranks (0 for one rank).
    pub ghost_owned_ratio: f64,
    /// Bytes sent by all ranks during one evaluation.
    pub bytes_per_step: u64,
    /// Minor page faults per timed evaluation (pages mapped on first touch;
    /// memory reused between steps causes none).
    #[serde(default)]
    pub minor_faults_per_step: f64,
    /// Per timed evaluation, each rank's own work (s): setup, forward and
    /// backward without the time spent in communication calls (decomposed
    /// runs). A rank that is slow in every step is a slow core or a heavy
    /// domain; one that changes from step to step is noise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_work_s: Vec<Vec<f64>>,
    /// Where the last timed evaluation's wall time went (decomposed runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseBreakdown>,
}

fn geometric_name() -> String {
    BalanceArg::Geometric.name().into()
}

/// One decomposed evaluation's time line, in seconds: the serial partition,
/// then each phase as mean and maximum over ranks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseBreakdown {
    /// Partition and halo layout, before the ranks start.
    pub partition_s: f64,
    /// Mean over ranks of [setup, forward, backward, reduce, gather, comm].
    pub mean_s: [f64; 6],
    /// Maximum over ranks of the same phases.
    pub max_s: [f64; 6],
    /// Earliest and latest rank end (s since the call started).
    pub rank_end_s: [f64; 2],
    /// When the consolidated result was ready (s since the call started).
    #[serde(default)]
    pub finish_s: f64,
    /// Each rank's sizes and time line.
    #[serde(default)]
    pub per_rank: Vec<RankRecord>,
}

/// One rank of a decomposed evaluation: its rows, edges and phases.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankRecord {
    pub owned: usize,
    pub ghosts: usize,
    pub edges: usize,
    pub timings: RankTimings,
}

/// The phases of [`PhaseBreakdown::mean_s`] and [`PhaseBreakdown::max_s`].
const PHASES: [&str; 6] = ["setup", "forward", "backward", "reduce", "gather", "comm"];

impl PhaseBreakdown {
    fn of(r: &EvalResult) -> Option<Self> {
        if r.rank_timings.is_empty() {
            return None;
        }
        let n = r.rank_timings.len() as f64;
        let phases = |t: &RankTimings| [t.setup, t.forward, t.backward, t.reduce, t.gather, t.comm];
        let mut mean_s = [0.0; 6];
        let mut max_s = [0.0f64; 6];
        let mut rank_end_s = [f64::INFINITY, 0.0f64];
        for t in &r.rank_timings {
            for (k, v) in phases(t).into_iter().enumerate() {
                mean_s[k] += v / n;
                max_s[k] = max_s[k].max(v);
            }
            rank_end_s[0] = rank_end_s[0].min(t.end());
            rank_end_s[1] = rank_end_s[1].max(t.end());
        }
        let per_rank = r
            .rank_sizes
            .iter()
            .zip(&r.rank_timings)
            .map(|(&(owned, ghosts, edges), &timings)| RankRecord {
                owned,
                ghosts,
                edges,
                timings,
            })
            .collect();
        Some(Self {
            partition_s: r.partition_s,
            mean_s,
            max_s,
            rank_end_s,
            finish_s: r.finish_s,
            per_rank,
        })
    }
}

/// `bench model` summary: the records plus scaling against the smallest rank count.
#[derive(Debug, Serialize)]
struct ModelSummary {
    records: Vec<ModelRecord>,
    /// Per record: t(base)/t.
    speedup: Vec<f64>,
    /// Per record: t(base)·cores(base) / (t·cores), cores = pool threads.
    efficiency: Vec<f64>,
    /// With `--ceiling`: `bench cores` at the largest pool, one record per
    /// kernel.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ceiling: Vec<crate::bench_cores::CoresRecord>,
}

/// Runs `ddmlip bench …`; returns the exit status.
pub fn run(a: BenchArgs) -> Result<u8, CliError> {
    match a.what {
        BenchWhat::Model(m) if m.child => model_child(&m),
        BenchWhat::Model(m) => model_parent(&m),
        BenchWhat::Gemm(g) => gemm(&g),
        BenchWhat::Cores(c) => crate::bench_cores::run(&c),
    }
}

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn threads_per_rank(a: &ModelBenchArgs, ranks: usize) -> usize {
    a.threads.unwrap_or_else(|| (cores() / ranks).max(1))
}

fn model_parent(a: &ModelBenchArgs) -> Result<u8, CliError> {
    if a.ranks.is_empty() || a.ranks.contains(&0) {
        return Err(CliError::input(anyhow!("--ranks must list counts ≥ 1")));
    }
    if a.repeats == 0 || a.threads == Some(0) || a.repeat == 0 || a.rounds == 0 {
        return Err(CliError::input(anyhow!(
            "--repeats, --rounds, --threads and --repeat must be at least 1"
        )));
    }
    let exe = std::env::current_exe()
        .context("locating the ddmlip executable")
        .map_err(CliError::failed)?;
    // Per rank count, its record from every round.
    let mut rounds: Vec<Vec<ModelRecord>> = vec![Vec::with_capacity(a.rounds); a.ranks.len()];
    for round in 0..a.rounds {
        for (k, &r) in a.ranks.iter().enumerate() {
            let rec = run_child(a, &exe, r)?;
            if !a.json {
                let of = if a.rounds > 1 {
                    format!(", round {}/{}", round + 1, a.rounds)
                } else {
                    String::new()
                };
                eprintln!(
                    "ranks {r}: {:.2} µs/atom/step (median of {}{of})",
                    rec.us_per_atom_step, a.repeats
                );
            }
            rounds[k].push(rec);
        }
    }
    let records = rounds.into_iter().filter_map(merge_rounds).collect();
    let mut summary = summarize(records);
    let widest = summary.records.iter().map(|r| r.pool_threads).max();
    if let Some(threads) = widest.filter(|&t| a.ceiling && t > 1) {
        if !a.json {
            eprintln!("timing this machine's ceiling for {threads} threads (bench cores)");
        }
        for kernel in crate::bench_cores::KERNELS {
            summary.ceiling.push(crate::bench_cores::measure(
                kernel,
                threads,
                crate::bench_cores::DEFAULT_STEPS,
                crate::bench_cores::DEFAULT_WORK_MS,
            )?);
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(CliError::failed)?
        );
    } else {
        print!("{}", model_table(&summary));
    }
    Ok(0)
}

/// Runs one `bench model --child` process for `r` ranks and reads its record.
fn run_child(a: &ModelBenchArgs, exe: &std::path::Path, r: usize) -> Result<ModelRecord, CliError> {
    let mut cmd = Process::new(exe);
    cmd.args(["bench", "model", "--child", "--model", &a.model])
        .args(["--dtype", precision_name(a.dtype)])
        .args(["--ranks", &r.to_string()])
        .args(["--threads", &threads_per_rank(a, r).to_string()])
        .args(["--repeats", &a.repeats.to_string()])
        .args(["--balance", a.balance.name()])
        .stderr(Stdio::inherit());
    if let Some(m) = &a.modal {
        cmd.args(["--modal", m]);
    }
    if a.no_work_sharing {
        cmd.arg("--no-work-sharing");
    }
    match &a.structure {
        Some(p) => cmd.arg("--structure").arg(p),
        None => cmd.args([
            "--crystal",
            crystal_name(a.crystal),
            "--repeat",
            &a.repeat.to_string(),
        ]),
    };
    let out = cmd
        .output()
        .with_context(|| format!("starting the {r}-rank benchmark process"))
        .map_err(CliError::failed)?;
    if !out.status.success() {
        return Err(CliError {
            status: out.status.code().map_or(crate::EXIT_FAILED, |c| c as u8),
            error: anyhow!("the {r}-rank benchmark failed ({})", out.status),
        });
    }
    serde_json::from_slice(&out.stdout)
        .context("reading the benchmark record")
        .map_err(CliError::failed)
}

/// One record for a rank count from its rounds: every round's steps, their
/// median and the rates at it, each round's median, and the per-rank work
/// of all rounds; the CPU time is the median of the rounds' medians, and
/// memory, faults and the phase breakdown are the last round's. `None` for
/// no rounds.
fn merge_rounds(rounds: Vec<ModelRecord>) -> Option<ModelRecord> {
    if rounds.len() < 2 {
        return rounds.into_iter().next();
    }
    let round_medians: Vec<f64> = rounds.iter().map(|r| r.median_s).collect();
    let cpu = median(&rounds.iter().map(|r| r.median_cpu_s).collect::<Vec<_>>());
    let times: Vec<f64> = rounds.iter().flat_map(|r| r.times_s.clone()).collect();
    let work: Vec<Vec<f64>> = rounds.iter().flat_map(|r| r.rank_work_s.clone()).collect();
    let mut rec = rounds.into_iter().last()?;
    rec.median_s = median(&times);
    rec.median_cpu_s = cpu;
    rec.us_per_atom_step = rec.median_s * 1e6 / rec.atoms.max(1) as f64;
    rec.atom_steps_per_s = rec.atoms as f64 / rec.median_s;
    rec.times_s = times;
    rec.round_medians_s = round_medians;
    rec.rank_work_s = work;
    Some(rec)
}

fn summarize(records: Vec<ModelRecord>) -> ModelSummary {
    let base = records
        .iter()
        .min_by_key(|r| r.ranks)
        .map(|r| (r.median_s, r.pool_threads as f64));
    let (speedup, efficiency) = records
        .iter()
        .map(|r| match base {
            Some((t0, c0)) if r.median_s > 0.0 => {
                let s = t0 / r.median_s;
                (s, s * c0 / r.pool_threads as f64)
            }
            _ => (f64::NAN, f64::NAN),
        })
        .unzip();
    ModelSummary {
        records,
        speedup,
        efficiency,
        ceiling: Vec::new(),
    }
}

fn model_table(s: &ModelSummary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if let Some(r) = s.records.first() {
        let _ = writeln!(
            o,
            "{} {} on {}: {} atoms, {} edges ({:.1} per atom); {} domains{}{}",
            r.model,
            r.dtype,
            r.structure,
            r.atoms,
            r.edges,
            r.edges as f64 / r.atoms.max(1) as f64,
            r.balance,
            match r.round_medians_s.len() {
                0 | 1 => String::new(),
                n => format!("; medians over {n} alternating rounds"),
            },
            match s.records.iter().find(|r| r.ranks > 1) {
                Some(split) if split.work_sharing => "; waiting ranks share work",
                Some(_) => "; no work sharing",
                None => "",
            }
        );
    }
    let _ = writeln!(
        o,
        "{:>5} {:>7} {:>10} {:>8} {:>12} {:>12} {:>10} {:>9} {:>9} {:>11} {:>11} {:>8} {:>6}",
        "ranks",
        "thr/rk",
        "median s",
        "cpu s",
        "µs/atom/step",
        "atom·step/s",
        "peak MiB",
        "KiB/atom",
        "ghost/own",
        "MiB/step",
        "faults/step",
        "speedup",
        "eff"
    );
    for ((r, sp), ef) in s.records.iter().zip(&s.speedup).zip(&s.efficiency) {
        let _ = writeln!(
            o,
            "{:>5} {:>7} {:>10.4} {:>8.3} {:>12.2} {:>12.3e} {:>10.1} {:>9.2} {:>9.3} {:>11.2} {:>11.0} {:>8.2} {:>5.0}%",
            r.ranks,
            r.threads_per_rank,
            r.median_s,
            r.median_cpu_s,
            r.us_per_atom_step,
            r.atom_steps_per_s,
            r.peak_rss_bytes as f64 / MIB,
            r.peak_rss_per_atom / 1024.0,
            r.ghost_owned_ratio,
            r.bytes_per_step as f64 / MIB,
            r.minor_faults_per_step,
            sp,
            100.0 * ef
        );
    }
    // Where a decomposed step's time went: the phases of the last timed
    // evaluation, mean (max) over ranks.
    for r in &s.records {
        if let Some(p) = r.phases.as_ref().filter(|_| r.ranks > 1) {
            let phases: Vec<String> = PHASES
                .iter()
                .zip(p.mean_s.iter().zip(&p.max_s))
                .map(|(n, (mean, max))| format!("{n} {mean:.3} ({max:.3})"))
                .collect();
            let _ = writeln!(
                o,
                "{:>3} ranks, s mean (max): partition {:.3}, {}",
                r.ranks,
                p.partition_s,
                phases.join(", ")
            );
        }
    }
    if let Some(first) = s.ceiling.first() {
        let kernels: Vec<String> = s
            .ceiling
            .iter()
            .map(|c| {
                format!(
                    "{} {:.0}% ({:.0}% balanced)",
                    format!("{:?}", c.kernel).to_lowercase(),
                    100.0 * c.ceiling,
                    100.0 * c.balanced_ceiling
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "this machine's ceiling for {} threads meeting every step (bench cores): {}",
            first.threads,
            kernels.join(", ")
        );
    }
    o
}

const MIB: f64 = 1024.0 * 1024.0;

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "f32",
        Precision::F64 => "f64",
    }
}

fn crystal_name(c: Crystal) -> &'static str {
    match c {
        Crystal::Si => "si",
        Crystal::Cu => "cu",
    }
}

fn model_child(a: &ModelBenchArgs) -> Result<u8, CliError> {
    let ranks = match a.ranks.as_slice() {
        [r] if *r >= 1 => *r,
        _ => return Err(CliError::input(anyhow!("--child takes one rank count"))),
    };
    let threads = threads_per_rank(a, ranks);
    if threads == 0 || a.repeats == 0 {
        return Err(CliError::input(anyhow!(
            "--threads and --repeats must be at least 1"
        )));
    }
    // A single-process run uses the global pool; decomposed runs give each
    // rank a private pool of `threads` workers (EvalOptions::threads_per_rank)
    // and compute the partition, before the ranks start, on the global pool:
    // there it may use every core the ranks will.
    let pool_threads = ranks * threads;
    rayon::ThreadPoolBuilder::new()
        .num_threads(pool_threads)
        .build_global()
        .context("building the rayon pool")
        .map_err(CliError::failed)?;
    let model = load_model(&a.model, a.modal.as_deref())?;
    let (sys, label) = match &a.structure {
        Some(p) => (read_structure(p)?.swap_remove(0), p.display().to_string()),
        None => match a.crystal {
            Crystal::Si => (
                si_diamond(a.repeat),
                format!("Si diamond {0}x{0}x{0}", a.repeat),
            ),
            Crystal::Cu => (
                demo_crystal(a.repeat),
                format!("FCC Cu {0}x{0}x{0}", a.repeat),
            ),
        },
    };
    let edges = count_edges(&sys, model.cutoff())?;
    let frames = vec![sys];
    let opts = EvalOptions {
        dtype: a.dtype.into(),
        ranks,
        threads_per_rank: threads,
        balance: a.balance.into(),
        work_sharing: !a.no_work_sharing,
        ..Default::default()
    };
    let rss_before = read_status_kib("VmRSS:").unwrap_or(0) * 1024;
    // Like an MD run: one evaluator, whose ranks keep their memory between
    // steps; the warm-up step maps it.
    let mut evaluator = Evaluator::new(model.as_ref(), opts);
    let t0 = Instant::now();
    let first = evaluator.evaluate(&frames).map_err(CliError::failed)?;
    let warmup_s = t0.elapsed().as_secs_f64();
    drop(first);
    let mut times = Vec::with_capacity(a.repeats);
    let mut cpu_times = Vec::with_capacity(a.repeats);
    let mut last = None;
    let mut rank_work_s = Vec::new();
    let faults_before = process_minor_faults();
    for _ in 0..a.repeats {
        let c0 = process_cpu_s();
        let t0 = Instant::now();
        let r = evaluator.evaluate(&frames).map_err(CliError::failed)?;
        times.push(t0.elapsed().as_secs_f64());
        if let (Some(c0), Some(c1)) = (c0, process_cpu_s()) {
            cpu_times.push(c1 - c0);
        }
        if r.rank_timings.len() > 1 {
            rank_work_s.push(r.rank_timings.iter().map(RankTimings::work).collect());
        }
        last = Some(r);
    }
    let minor_faults_per_step = match (faults_before, process_minor_faults()) {
        (Some(f0), Some(f1)) => f1.saturating_sub(f0) as f64 / a.repeats as f64,
        _ => 0.0,
    };
    let peak = read_status_kib("VmHWM:").unwrap_or(0) * 1024;
    let (owned, ghost) = last
        .as_ref()
        .map(|r| {
            r.rank_sizes
                .iter()
                .fold((0usize, 0usize), |(o, g), s| (o + s.0, g + s.1))
        })
        .unwrap_or((0, 0));
    let atoms = frames[0].len();
    let median_s = median(&times);
    let rec = ModelRecord {
        model: model.name().to_string(),
        dtype: precision_name(a.dtype).into(),
        structure: label,
        atoms,
        edges,
        ranks,
        threads_per_rank: threads,
        pool_threads,
        matmul_num_threads: std::env::var("MATMUL_NUM_THREADS").ok(),
        balance: a.balance.name().into(),
        work_sharing: ranks > 1 && !a.no_work_sharing,
        warmup_s,
        median_s,
        round_medians_s: Vec::new(),
        median_cpu_s: median(&cpu_times),
        us_per_atom_step: median_s * 1e6 / atoms as f64,
        atom_steps_per_s: atoms as f64 / median_s,
        rss_before_bytes: rss_before,
        peak_rss_bytes: peak,
        peak_rss_per_atom: peak as f64 / atoms as f64,
        eval_rss_per_atom: peak.saturating_sub(rss_before) as f64 / atoms as f64,
        ghost_owned_ratio: if owned > 0 {
            ghost as f64 / owned as f64
        } else {
            0.0
        },
        bytes_per_step: last.as_ref().map_or(0, |r| r.bytes_sent),
        minor_faults_per_step,
        phases: last.as_ref().and_then(PhaseBreakdown::of),
        rank_work_s,
        times_s: times,
    };
    println!("{}", serde_json::to_string(&rec).map_err(CliError::failed)?);
    Ok(0)
}

fn count_edges(sys: &System, cutoff: f64) -> Result<usize, CliError> {
    use ddmlip_neighbors::{pair_list_for_centers, NeighborOptions};
    if !(cutoff.is_finite() && cutoff > 0.0) {
        return Ok(0);
    }
    let pairs = pair_list_for_centers(
        &sys.positions,
        sys.cell.as_ref(),
        sys.pbc,
        &NeighborOptions {
            cutoff,
            half: false,
        },
        sys.len(),
    )
    .map_err(CliError::input)?;
    Ok(pairs.len())
}

/// Median of a non-empty sample (mean of the two middle values for even
/// lengths); NaN for an empty one.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        0.5 * (v[m - 1] + v[m])
    }
}

/// A `Key:   123 kB` line of `/proc/self/status`, in KiB; `None` where the
/// file or line is missing (non-Linux systems).
fn read_status_kib(key: &str) -> Option<u64> {
    parse_status_kib(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

/// User + system CPU time of this process, all threads (s), from
/// `/proc/self/stat` (fields 14 and 15, in USER_HZ = 100 ticks per second on
/// Linux); `None` where unavailable.
fn process_cpu_s() -> Option<f64> {
    parse_stat_cpu_s(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn parse_stat_cpu_s(stat: &str) -> Option<f64> {
    let f = stat_fields(stat)?;
    // `f` starts at field 3, so fields 14 and 15 are at 11 and 12.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`):
/// each is a page the kernel had to map (and zero) on first touch.
fn process_minor_faults() -> Option<u64> {
    parse_stat_minor_faults(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn parse_stat_minor_faults(stat: &str) -> Option<u64> {
    stat_fields(stat)?.get(7)?.parse().ok()
}

/// The fields of a `/proc/<pid>/stat` line from field 3 on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    // The command name (field 2) is parenthesised and may hold spaces.
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Diamond Si: the 8-atom conventional cell (a = 5.43 Å) repeated `n` times
/// per axis, periodic, every coordinate displaced by a deterministic
/// Gaussian of standard deviation 0.05 Å (like ASE's `rattle(0.05)`, though
/// not the same random numbers).
pub fn si_diamond(n: usize) -> System {
    let a = 5.43;
    let fcc = [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5],
        [0.5, 0.0, 0.5],
        [0.5, 0.5, 0.0],
    ];
    let mut rng = ddmlip_models::init::Weights::new(12345);
    let mut gauss = move || {
        // Box–Muller on (0, 1] uniforms.
        let u1 = 0.5 * (1.0 - rng.uniform());
        let u2 = 0.5 * (1.0 + rng.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    };
    let mut positions = Vec::with_capacity(8 * n * n * n);
    for i in 0..n {
        for j in 0..n {
            for k in 0..n {
                for b in fcc {
                    for off in [0.0, 0.25] {
                        positions.push([
                            (i as f64 + b[0] + off) * a + 0.05 * gauss(),
                            (j as f64 + b[1] + off) * a + 0.05 * gauss(),
                            (k as f64 + b[2] + off) * a + 0.05 * gauss(),
                        ]);
                    }
                }
            }
        }
    }
    let len = n as f64 * a;
    let numbers = vec![14; positions.len()];
    System::new(
        positions,
        numbers,
        Some(ddmlip_atoms::Cell::orthorhombic(len, len, len)),
        [true; 3],
    )
}

/// One GEMM shape of `bench gemm`.
#[derive(Debug, Serialize)]
struct GemmRecord {
    m: usize,
    k: usize,
    n: usize,
    /// One sgemm call from one thread (GFLOP/s, 2·M·K·N per call);
    /// matrixmultiply adds `MATMUL_NUM_THREADS` threads of its own (1 unless set).
    single_thread_gflops: f64,
    /// Row blocks of 256 on the rayon pool, one sgemm each (GFLOP/s).
    parallel_gflops: f64,
    threads: usize,
}

fn parse_shape(s: &str) -> Result<(usize, usize, usize), CliError> {
    let dims: Vec<usize> = s
        .split('x')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| CliError::input(anyhow!("shape `{s}`: expected MxKxN")))?;
    match dims.as_slice() {
        [m, k, n] if *m > 0 && *k > 0 && *n > 0 => Ok((*m, *k, *n)),
        _ => Err(CliError::input(anyhow!(
            "shape `{s}`: expected MxKxN, all positive"
        ))),
    }
}

/// `c = a·b`, row-major, one matrixmultiply call.
fn sgemm(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: the assert above keeps every strided access inside the slices;
    // `c` is a unique borrow, so it aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

fn gemm(g: &GemmBenchArgs) -> Result<u8, CliError> {
    use rayon::prelude::*;
    const ROW_BLOCK: usize = 256;
    if g.repeats == 0 || g.threads == Some(0) {
        return Err(CliError::input(anyhow!(
            "--repeats and --threads must be at least 1"
        )));
    }
    let shapes: Vec<_> = g
        .shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<_, _>>()?;
    let threads = g.threads.unwrap_or_else(cores);
    // matrixmultiply reads this once, at its first call: pin it to one thread
    // (unless the caller chose otherwise) so that "single thread" is one
    // thread and the row-block run is not oversubscribed. Still
    // single-threaded here, so changing the environment is sound.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", "1");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(CliError::failed)?;
    let mut records = Vec::new();
    for (m, k, n) in shapes {
        let mut w = ddmlip_models::init::Weights::new(7);
        let a: Vec<f32> = (0..m * k).map(|_| w.uniform() as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|_| w.uniform() as f32).collect();
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let mut time = |f: &mut dyn FnMut(&mut [f32])| {
            f(&mut c);
            let t: Vec<f64> = (0..g.repeats)
                .map(|_| {
                    let t0 = Instant::now();
                    f(&mut c);
                    t0.elapsed().as_secs_f64()
                })
                .collect();
            flops / median(&t) / 1e9
        };
        let single = time(&mut |c: &mut [f32]| sgemm(&a, &b, c, m, k, n));
        let parallel = time(&mut |c: &mut [f32]| {
            pool.install(|| {
                c.par_chunks_mut(ROW_BLOCK * n)
                    .zip(a.par_chunks(ROW_BLOCK * k))
                    .for_each(|(cb, ab)| sgemm(ab, &b, cb, ab.len() / k, k, n));
            })
        });
        records.push(GemmRecord {
            m,
            k,
            n,
            single_thread_gflops: single,
            parallel_gflops: parallel,
            threads,
        });
    }
    if g.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&records).map_err(CliError::failed)?
        );
    } else {
        println!(
            "f32 GEMM (matrixmultiply sgemm; MATMUL_NUM_THREADS={})",
            std::env::var("MATMUL_NUM_THREADS").unwrap_or_else(|_| "unset".into())
        );
        println!(
            "{:>20} {:>14} {:>22}",
            "M x K x N", "1 call GFLOP/s", "row blocks GFLOP/s"
        );
        for r in &records {
            println!(
                "{:>20} {:>14.1} {:>15.1} ({} thr)",
                format!("{}x{}x{}", r.m, r.k, r.n),
                r.single_thread_gflops,
                r.parallel_gflops,
                r.threads
            );
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_matches_definition() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn status_lines_parse_in_kib() {
        let s = "Name:\tddmlip\nVmHWM:\t  123456 kB\nVmRSS:\t    1000 kB\n";
        assert_eq!(parse_status_kib(s, "VmHWM:"), Some(123456));
        assert_eq!(parse_status_kib(s, "VmRSS:"), Some(1000));
        assert_eq!(parse_status_kib(s, "VmPeak:"), None);
    }

    #[test]
    fn stat_cpu_fields() {
        // proc(5): utime is field 14, stime field 15 (after a name with spaces).
        let s = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1";
        assert_eq!(parse_stat_cpu_s(s), Some(3.0));
        // minflt is field 10.
        assert_eq!(parse_stat_minor_faults(s), Some(7));
    }

    #[test]
    fn touching_fresh_pages_counts_faults() {
        let Some(before) = process_minor_faults() else {
            return; // not Linux
        };
        // 64 MiB of fresh memory: at least 32 faults even with 2 MiB pages.
        let mut v: Vec<u8> = Vec::with_capacity(64 << 20);
        v.resize(64 << 20, 1);
        let after = process_minor_faults().unwrap_or(0);
        assert!(std::hint::black_box(&v)[12345] == 1);
        assert!(after >= before + 32, "{before} -> {after}");
    }

    #[test]
    fn own_status_peak_is_at_least_current() {
        // On Linux the high-water mark in one reading is never below the
        // resident set of that same reading.
        if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
            let hwm = parse_status_kib(&s, "VmHWM:").unwrap();
            let rss = parse_status_kib(&s, "VmRSS:").unwrap();
            assert!(hwm >= rss && rss > 0);
        }
    }

    #[test]
    fn si_diamond_has_the_diamond_shells() {
        // Ideal diamond with a = 5.43 Å: 4 neighbours at a·√3/4 = 2.351 Å,
        // then 12 at a/√2 = 3.840 Å; the rattle (σ = 0.05 Å per coordinate)
        // moves distances by a few σ at most.
        let n = 3;
        let sys = si_diamond(n);
        assert_eq!(sys.len(), 8 * n * n * n);
        assert!(sys.numbers.iter().all(|&z| z == 14));
        let len = 5.43 * n as f64;
        let mut counts = [0usize; 2];
        for (i, p) in sys.positions.iter().enumerate() {
            for (j, q) in sys.positions.iter().enumerate() {
                if i == j {
                    continue;
                }
                let mut d2 = 0.0;
                for ax in 0..3 {
                    let mut d = q[ax] - p[ax];
                    d -= len * (d / len).round();
                    d2 += d * d;
                }
                let d = d2.sqrt();
                if d < 3.0 {
                    counts[0] += 1;
                    assert!((d - 5.43 * 3f64.sqrt() / 4.0).abs() < 0.4, "d = {d}");
                } else if d < 4.2 {
                    counts[1] += 1;
                }
            }
        }
        assert_eq!(counts[0], 4 * sys.len());
        assert_eq!(counts[1], 12 * sys.len());
    }

    #[test]
    fn si_rattle_has_the_requested_spread() {
        let n = 4;
        let ideal = {
            let mut v = Vec::new();
            let a = 5.43;
            for i in 0..n {
                for j in 0..n {
                    for k in 0..n {
                        for b in [
                            [0.0, 0.0, 0.0],
                            [0.0, 0.5, 0.5],
                            [0.5, 0.0, 0.5],
                            [0.5, 0.5, 0.0],
                        ] {
                            for off in [0.0, 0.25] {
                                v.push([
                                    (i as f64 + b[0] + off) * a,
                                    (j as f64 + b[1] + off) * a,
                                    (k as f64 + b[2] + off) * a,
                                ]);
                            }
                        }
                    }
                }
            }
            v
        };
        let sys = si_diamond(n);
        let d: Vec<f64> = sys
            .positions
            .iter()
            .zip(&ideal)
            .flat_map(|(p, q)| (0..3).map(move |a| p[a] - q[a]))
            .collect();
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / d.len() as f64).sqrt();
        // 1536 samples: the sample σ is within ~5 % of 0.05 Å with overwhelming probability.
        assert!((sd - 0.05).abs() < 0.005, "sd = {sd}");
        assert!(mean.abs() < 0.005, "mean = {mean}");
        assert_eq!(si_diamond(n).positions, sys.positions, "deterministic");
    }

    #[test]
    fn sgemm_matches_naive_product() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c = vec![0f32; m * n];
        sgemm(&a, &b, &mut c, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                assert!((c[i * n + j] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn shapes_parse_and_reject() {
        assert_eq!(parse_shape("8x64x960").ok(), Some((8, 64, 960)));
        assert!(parse_shape("8x64").is_err());
        assert!(parse_shape("0x1x1").is_err());
        assert!(parse_shape("axbxc").is_err());
    }

    #[test]
    fn efficiency_uses_cores() {
        let rec = |ranks, pool, t| ModelRecord {
            model: "m".into(),
            dtype: "f32".into(),
            structure: "s".into(),
            atoms: 10,
            edges: 0,
            ranks,
            threads_per_rank: 1,
            pool_threads: pool,
            matmul_num_threads: None,
            warmup_s: 0.0,
            times_s: vec![t],
            median_s: t,
            round_medians_s: Vec::new(),
            median_cpu_s: t,
            us_per_atom_step: 0.0,
            atom_steps_per_s: 0.0,
            rss_before_bytes: 0,
            peak_rss_bytes: 0,
            minor_faults_per_step: 0.0,
            peak_rss_per_atom: 0.0,
            eval_rss_per_atom: 0.0,
            ghost_owned_ratio: 0.0,
            bytes_per_step: 0,
            balance: "geometric".into(),
            work_sharing: false,
            rank_work_s: Vec::new(),
            phases: None,
        };
        let s = summarize(vec![rec(1, 1, 8.0), rec(4, 4, 2.5)]);
        assert!((s.speedup[1] - 3.2).abs() < 1e-12);
        assert!((s.efficiency[1] - 0.8).abs() < 1e-12);

        // Rounds merge into one record whose median is over all their steps.
        let mut first = rec(4, 4, 0.0);
        (first.times_s, first.median_s) = (vec![1.0, 3.0, 9.0], 3.0);
        let mut second = rec(4, 4, 0.0);
        (second.times_s, second.median_s) = (vec![2.0, 4.0, 5.0], 4.0);
        second.rank_work_s = vec![vec![0.5; 4]];
        let merged = merge_rounds(vec![first, second]).unwrap();
        assert_eq!(merged.times_s, [1.0, 3.0, 9.0, 2.0, 4.0, 5.0]);
        assert_eq!(merged.median_s, 3.5);
        assert_eq!(merged.round_medians_s, [3.0, 4.0]);
        assert!((merged.atom_steps_per_s - 10.0 / 3.5).abs() < 1e-12);
        assert_eq!(merged.rank_work_s.len(), 1);
        assert!(merge_rounds(vec![]).is_none());

        // The table shows faults per step and, for split runs, the phases.
        let mut split = rec(4, 4, 2.5);
        split.minor_faults_per_step = 1234.0;
        split.phases = Some(PhaseBreakdown {
            partition_s: 0.011,
            mean_s: [0.1, 0.2, 0.3, 0.04, 0.005, 0.06],
            max_s: [0.15, 0.25, 0.35, 0.045, 0.006, 0.07],
            rank_end_s: [2.4, 2.5],
            finish_s: 2.5,
            per_rank: vec![],
        });
        let table = model_table(&summarize(vec![rec(1, 1, 8.0), split]));
        assert!(table.contains("faults/step"), "{table}");
        assert!(table.contains(" 1234 "), "{table}");
        assert!(
            table.contains("4 ranks, s mean (max): partition 0.011, setup 0.100 (0.150)"),
            "{table}"
        );
        assert!(table.contains("comm 0.060 (0.070)"), "{table}");
        // A single-process record has no phase line.
        assert_eq!(table.matches("ranks, s mean").count(), 1, "{table}");
    }
}
