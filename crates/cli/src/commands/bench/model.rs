//! `ddmlip bench model`: wall-clock and memory of full evaluations
//! (forward + forces + stress) per rank count.
//!
//! Every rank count of `bench model` runs in its own child process (this same
//! executable, re-invoked with the hidden `--child` flag) so that the rayon
//! pool can be sized per configuration (the global pool can be built only
//! once per process) and so that the peak RSS read from `/proc/self/status`
//! belongs to one configuration alone.
use super::procfs::{process_cpu_s, process_minor_faults, read_status_kib};
use super::stats::{cores, median};
use crate::args::{BalanceArg, Precision};
use crate::device::Device;
use crate::error::{CliError, EXIT_FAILED};
use crate::input::{load_model, read_structure};
use anyhow::{anyhow, Context};
use clap::{Args, ValueEnum};
use ddmlip_atoms::System;
use ddmlip_engine::OpProfile;
use ddmlip_runtime::{EvalOptions, EvalResult, Evaluator, RankTimings};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::time::Instant;

/// Generated benchmark crystals.
#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Serialize, Deserialize)]
pub enum Crystal {
    /// Diamond Si, a = 5.43 Å, 8-atom conventional cell, rattled 0.05 Å.
    Si,
    /// FCC Cu, a = 3.615 Å, 4-atom conventional cell, rattled (the demo crystal).
    Cu,
}

#[derive(Args)]
pub struct ModelBenchArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    pub(crate) model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    pub(crate) modal: Option<String>,
    /// Extended XYZ structure file (the first frame is timed).
    #[arg(long, conflicts_with = "crystal")]
    pub(crate) structure: Option<PathBuf>,
    /// Generated crystal when no --structure is given.
    #[arg(long, value_enum, default_value_t = Crystal::Cu)]
    pub(crate) crystal: Crystal,
    /// Conventional cells per axis of the generated crystal.
    #[arg(long, default_value_t = 10)]
    pub(crate) repeat: usize,
    /// Floating-point precision.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub(crate) dtype: Precision,
    /// Rank counts to time (threads backend), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) ranks: Vec<usize>,
    /// Rayon threads per rank: each rank of a split run has its own pool of
    /// this many workers. Default: the machine's cores / ranks (at least 1).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Timed evaluations after the warm-up; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Times through the whole rank list, alternating (1, 16, 1, 16, …):
    /// each rank count's median is over the steps of all rounds, so a
    /// machine whose speed drifts is sampled alike for every count.
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    /// How split runs place domain boundaries.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    pub(crate) balance: BalanceArg,
    /// Ranks do not run pieces of other ranks' work while they wait (the
    /// threads backend shares work by default).
    #[arg(long)]
    pub(crate) no_work_sharing: bool,
    /// After the runs, time `bench cores` for the largest thread count
    /// (ranks × threads) and report its ceilings next to the efficiencies:
    /// what this machine allows a split whose ranks meet every step.
    #[arg(long)]
    pub(crate) ceiling: bool,
    /// Time the engine's ops by name, forward and backward separately (per
    /// timed evaluation, summed over ranks), and print the table after the
    /// timings (`profile` of each record with --json). Off by default: the
    /// timings then carry no clock reads per op.
    #[arg(long)]
    pub(crate) profile: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where to evaluate: cpu, or cuda[:N] (build with --features cuda; one
    /// process on one GPU, --ranks ranks sharing it). With the model's own
    /// kernels --threads and --rounds do not apply; through the op engine
    /// (models without kernels of their own, or --engine-ops) they do.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: Device,
    /// Time each SevenNet kernel phase (forward and backward per layer:
    /// wall, CPU of all threads, FLOPs, GFLOP/s) and the time outside the
    /// kernels; one rank only (`--ranks 1`).
    #[arg(long)]
    pub(crate) phases: bool,
    /// With `--device cuda`: time the model through the op engine, its
    /// generic ops on the GPU (what models without CUDA kernels of their
    /// own always do), instead of the model's own kernels; --ranks as on
    /// the CPU (ranks share the GPU).
    #[arg(long)]
    pub(crate) engine_ops: bool,
    /// Run exactly one rank count in this process and print its record as JSON.
    #[arg(long, hide = true)]
    pub(crate) child: bool,
}

/// The system `bench model` times (the first frame of --structure, or the
/// generated crystal) and its label.
fn bench_system(a: &ModelBenchArgs) -> Result<(System, String), CliError> {
    Ok(match &a.structure {
        Some(p) => (read_structure(p)?.swap_remove(0), p.display().to_string()),
        None => match a.crystal {
            Crystal::Si => (
                ddmlip::build::rattled_silicon(a.repeat),
                format!("Si diamond {0}x{0}x{0}", a.repeat),
            ),
            Crystal::Cu => (
                ddmlip::build::demo_copper(a.repeat),
                format!("FCC Cu {0}x{0}x{0}", a.repeat),
            ),
        },
    })
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
    /// With `--profile`: seconds and calls per op name, forward and
    /// backward, per timed evaluation (the mean over evaluations and rounds),
    /// summed over ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<OpProfile>,
    /// With `--phases`: the SevenNet kernel phases, per evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_phases: Option<super::phases::KernelPhases>,
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
        if r.diagnostics.rank_timings.is_empty() {
            return None;
        }
        let n = r.diagnostics.rank_timings.len() as f64;
        let phases = |t: &RankTimings| [t.setup, t.forward, t.backward, t.reduce, t.gather, t.comm];
        let mut mean_s = [0.0; 6];
        let mut max_s = [0.0f64; 6];
        let mut rank_end_s = [f64::INFINITY, 0.0f64];
        for t in &r.diagnostics.rank_timings {
            for (k, v) in phases(t).into_iter().enumerate() {
                mean_s[k] += v / n;
                max_s[k] = max_s[k].max(v);
            }
            rank_end_s[0] = rank_end_s[0].min(t.end());
            rank_end_s[1] = rank_end_s[1].max(t.end());
        }
        let per_rank = r
            .diagnostics
            .rank_sizes
            .iter()
            .zip(&r.diagnostics.rank_timings)
            .map(|(&(owned, ghosts, edges), &timings)| RankRecord {
                owned,
                ghosts,
                edges,
                timings,
            })
            .collect();
        Some(Self {
            partition_s: r.diagnostics.partition_s,
            mean_s,
            max_s,
            rank_end_s,
            finish_s: r.diagnostics.finish_s,
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
    ceiling: Vec<super::cores::CoresRecord>,
}

fn threads_per_rank(a: &ModelBenchArgs, ranks: usize) -> usize {
    a.threads.unwrap_or_else(|| (cores() / ranks).max(1))
}

pub fn run(a: &ModelBenchArgs) -> Result<u8, CliError> {
    let engine = crate::device::engine_gpu(a.device, a.engine_ops, &a.model)?;
    if let (Device::Cuda(index), None) = (a.device, engine) {
        if a.profile {
            return Err(CliError::input(anyhow!(
                "--profile times the op engine on the CPU; it does not apply to --device cuda"
            )));
        }
        if a.repeats == 0 || a.repeat == 0 {
            return Err(CliError::input(anyhow!(
                "--repeats and --repeat must be at least 1"
            )));
        }
        if a.ranks.is_empty() || a.ranks.contains(&0) {
            return Err(CliError::input(anyhow!("--ranks must list counts ≥ 1")));
        }
        return crate::device::bench_model(
            &a.model,
            || bench_system(a),
            crate::device::GpuBench {
                dtype: a.dtype,
                repeats: a.repeats,
                ranks: &a.ranks,
                json: a.json,
                index,
            },
        );
    }
    if a.ranks.is_empty() || a.ranks.contains(&0) {
        return Err(CliError::input(anyhow!("--ranks must list counts ≥ 1")));
    }
    if a.repeats == 0 || a.threads == Some(0) || a.repeat == 0 || a.rounds == 0 {
        return Err(CliError::input(anyhow!(
            "--repeats, --rounds, --threads and --repeat must be at least 1"
        )));
    }
    if a.phases && a.ranks.iter().any(|&r| r != 1) {
        return Err(CliError::input(anyhow!(
            "--phases times one rank (the phases' CPU time is the whole process's): use --ranks 1"
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
        for kernel in super::cores::KERNELS {
            summary.ceiling.push(super::cores::measure(
                kernel,
                threads,
                super::cores::DEFAULT_STEPS,
                super::cores::DEFAULT_WORK_MS,
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
        for p in summary
            .records
            .iter()
            .filter_map(|r| r.kernel_phases.as_ref())
        {
            print!("{}", super::phases::table(p));
        }
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
    if a.profile {
        cmd.arg("--profile");
    }
    if a.phases {
        cmd.arg("--phases");
    }
    if let Device::Cuda(index) = a.device {
        cmd.args(["--device", &format!("cuda:{index}"), "--engine-ops"]);
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
            status: out.status.code().map_or(EXIT_FAILED, |c| c as u8),
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
    let n_rounds = rounds.len();
    let profile = rounds
        .iter()
        .filter_map(|r| r.profile.as_ref())
        .fold(None, |acc: Option<OpProfile>, p| {
            let mut acc = acc.unwrap_or_default();
            acc.merge(p);
            Some(acc)
        })
        .map(|p| p.scaled_down(n_rounds));
    let mut rec = rounds.into_iter().last()?;
    rec.median_s = median(&times);
    rec.median_cpu_s = cpu;
    rec.us_per_atom_step = rec.median_s * 1e6 / rec.atoms.max(1) as f64;
    rec.atom_steps_per_s = rec.atoms as f64 / rec.median_s;
    rec.times_s = times;
    rec.round_medians_s = round_medians;
    rec.rank_work_s = work;
    rec.profile = profile;
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
    for r in &s.records {
        if let Some(p) = &r.profile {
            o.push_str(&profile_table(r, p));
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

/// The `--profile` table of one record: every op of each phase by time,
/// with its share of the profiled forward + backward time.
fn profile_table(r: &ModelRecord, p: &OpProfile) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let total = p.total_s();
    let _ = writeln!(
        o,
        "{} rank{}: op times per evaluation{}: forward {:.4} s + backward {:.4} s = {:.4} s (median step {:.4} s)",
        r.ranks,
        if r.ranks == 1 { "" } else { "s" },
        if r.ranks == 1 { "" } else { ", summed over ranks" },
        p.forward_s(),
        p.backward_s(),
        total,
        r.median_s
    );
    let _ = writeln!(
        o,
        "  {:<8} {:<32} {:>7} {:>10} {:>6}",
        "phase", "op", "calls", "seconds", "share"
    );
    for (phase, list) in [("forward", &p.forward), ("backward", &p.backward)] {
        for t in list {
            let share = if total > 0.0 { t.seconds / total } else { 0.0 };
            let _ = writeln!(
                o,
                "  {:<8} {:<32} {:>7} {:>10.5} {:>5.1}%",
                phase,
                t.op,
                t.calls,
                t.seconds,
                100.0 * share
            );
        }
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

pub fn child(a: &ModelBenchArgs) -> Result<u8, CliError> {
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
    let (sys, label) = bench_system(a)?;
    let edges = count_edges(&sys, model.cutoff())?;
    let frames = vec![sys];
    let engine = crate::device::engine_device(a.device, a.engine_ops, &a.model, (false, false))?;
    let opts = EvalOptions {
        dtype: a.dtype.into(),
        ranks,
        threads_per_rank: threads,
        balance: a.balance.into(),
        work_sharing: !a.no_work_sharing,
        profile: a.profile,
        device: engine.map(|(d, _)| d),
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
    let mut profile: Option<OpProfile> = None;
    let faults_before = process_minor_faults();
    let mut phase_run = a.phases.then(super::phases::PhaseRun::start);
    for _ in 0..a.repeats {
        if let Some(run) = phase_run.as_mut() {
            run.begin();
        }
        let c0 = process_cpu_s();
        let t0 = Instant::now();
        let r = evaluator.evaluate(&frames).map_err(CliError::failed)?;
        times.push(t0.elapsed().as_secs_f64());
        if let (Some(c0), Some(c1)) = (c0, process_cpu_s()) {
            cpu_times.push(c1 - c0);
        }
        if let Some(run) = phase_run.as_mut() {
            let wall = times.last().copied().unwrap_or(0.0);
            run.end(r.diagnostics.rank_timings.first(), wall);
        }
        if r.diagnostics.rank_timings.len() > 1 {
            rank_work_s.push(
                r.diagnostics
                    .rank_timings
                    .iter()
                    .map(RankTimings::work)
                    .collect(),
            );
        }
        for p in &r.diagnostics.profiles {
            profile.get_or_insert_with(OpProfile::default).merge(p);
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
            r.diagnostics
                .rank_sizes
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
        bytes_per_step: last.as_ref().map_or(0, |r| r.diagnostics.bytes_sent),
        minor_faults_per_step,
        phases: last.as_ref().and_then(PhaseBreakdown::of),
        kernel_phases: phase_run.map(|run| run.finish(threads, atoms, a.repeats)),
        rank_work_s,
        times_s: times,
        profile: profile.map(|p| p.scaled_down(a.repeats)),
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

#[cfg(test)]
mod tests {
    use super::*;

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
            kernel_phases: None,
            phases: None,
            profile: None,
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
