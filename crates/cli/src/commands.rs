//! The subcommands. Each parses its arguments, calls the libraries, and
//! renders the result; no numerics live here.

use crate::output::{self, fmt_e};
use crate::{eval_batch, CliError};
use anyhow::{anyhow, Context};
use clap::{Args, Subcommand, ValueEnum};
use ddmlip_atoms::System;
use ddmlip_engine::{DType, Model};
use ddmlip_runtime::{evaluate, BalancePolicy, EvalError, EvalOptions, EvalResult};
use std::path::{Path, PathBuf};

// `eval --backend mpi`; a child module so it shares this module's helpers.
// `validate --backend mpi` reuses its MPI communicator wrapper.
#[path = "bench_cmd.rs"]
pub mod bench_cmd;
#[path = "mpi_cmd.rs"]
pub(crate) mod mpi_cmd;

#[derive(Subcommand)]
pub enum Command {
    /// Energies, forces and stress of every frame of a structure file.
    Eval(EvalArgs),
    /// Neighbour-list statistics of a structure.
    Neighbors(NeighborsArgs),
    /// How a structure splits over ranks: owned / ghost / remote atoms and health.
    Partition(PartitionArgs),
    /// List the built-in models.
    Models,
    /// The embedded default job: a built-in model on a generated crystal, in one
    /// process and split over ranks, compared atom by atom.
    Demo(DemoArgs),
    /// Does the model give the single-process answer split over ranks? If not,
    /// why, and which spec fixes it.
    Validate(crate::validate_cmd::ValidateArgs),
    /// Benchmarks: model evaluation time and memory per rank count, GEMM rate.
    Bench(bench_cmd::BenchArgs),
    /// Molecular dynamics (nve, langevin) split over ranks, with skin lists,
    /// migration, trajectory, thermo log and checkpoints.
    Md(crate::md_cmd::MdArgs),
    /// Relax the positions with FIRE, split over ranks.
    Relax(crate::relax_cmd::RelaxArgs),
}

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq)]
pub enum Backend {
    /// Ranks as threads of this process.
    Threads,
    /// Ranks as MPI processes (build with `--features mpi`, launch with mpirun).
    Mpi,
}

#[derive(Clone, Copy, ValueEnum, Debug, PartialEq)]
pub enum Precision {
    F64,
    F32,
}

impl From<Precision> for DType {
    fn from(p: Precision) -> Self {
        match p {
            Precision::F64 => DType::F64,
            Precision::F32 => DType::F32,
        }
    }
}

/// Domain boundaries of split runs (`EvalOptions::balance`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BalanceArg {
    /// A regular grid in fractional coordinates.
    Geometric,
    /// Staggered cuts: about the same number of atoms on every rank (a
    /// lattice plane is never split).
    Atoms,
}

impl BalanceArg {
    pub fn name(self) -> &'static str {
        match self {
            Self::Geometric => "geometric",
            Self::Atoms => "atoms",
        }
    }
}

impl From<BalanceArg> for BalancePolicy {
    fn from(b: BalanceArg) -> Self {
        match b {
            BalanceArg::Geometric => Self::Geometric,
            BalanceArg::Atoms => Self::Atoms,
        }
    }
}

#[derive(Args)]
pub struct EvalArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    modal: Option<String>,
    /// Extended XYZ structure file (several frames = a batch).
    #[arg(long)]
    structure: PathBuf,
    /// Split every system over this many ranks [default: 1]. Under
    /// `--backend mpi` the rank count is the MPI job's size instead.
    #[arg(long)]
    ranks: Option<usize>,
    /// Communication backend: threads of this process, or one MPI process
    /// per rank (`mpirun -n N ddmlip eval --backend mpi ...`).
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    /// Floating-point precision.
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    dtype: Precision,
    /// Write the structure with energy, forces and stress as extended XYZ.
    #[arg(long)]
    output: Option<PathBuf>,
    /// A distribution spec (JSON) for --ranks > 1 instead of the model's own.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// How split runs place domain boundaries.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    balance: BalanceArg,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct NeighborsArgs {
    /// Extended XYZ structure file.
    #[arg(long)]
    structure: PathBuf,
    /// Cutoff radius (Å).
    #[arg(long, allow_negative_numbers = true)]
    cutoff: f64,
    /// Half list: each pair once instead of both directions.
    #[arg(long)]
    half: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PartitionArgs {
    /// Extended XYZ structure file (the first frame is partitioned).
    #[arg(long)]
    structure: PathBuf,
    /// Number of ranks.
    #[arg(long)]
    ranks: usize,
    /// Interaction cutoff (Å); the ghost width is cutoff + skin.
    #[arg(long, allow_negative_numbers = true)]
    cutoff: f64,
    /// Extra ghost width (Å).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    skin: f64,
    /// How domain boundaries are placed.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    balance: BalanceArg,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Draw the split as SVG (ranks coloured, ghosts hollow).
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Built-in model to run.
    #[arg(long, default_value = "schnet-demo")]
    model: String,
    /// Ranks for the decomposed run.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Conventional FCC cells per axis of the generated copper crystal.
    #[arg(long, default_value_t = 6)]
    repeat: usize,
}

/// Runs one subcommand; returns the exit status on success.
pub fn run(cmd: Command) -> Result<u8, CliError> {
    match cmd {
        Command::Eval(a) => eval(a),
        Command::Neighbors(a) => neighbors(a),
        Command::Partition(a) => partition(a),
        Command::Models => models(),
        Command::Demo(a) => demo(a),
        Command::Validate(a) => crate::validate_cmd::validate(a),
        Command::Bench(a) => bench_cmd::run(a),
        Command::Md(a) => crate::md_cmd::md(a),
        Command::Relax(a) => crate::relax_cmd::relax(a),
    }
}

pub fn read_structure(path: &Path) -> Result<Vec<System>, CliError> {
    let frames = ddmlip_atoms::read_structure(path).map_err(CliError::input)?;
    if frames.is_empty() {
        return Err(CliError::input(anyhow!("{}: no frames", path.display())));
    }
    Ok(frames)
}

pub fn load_model(name: &str, modal: Option<&str>) -> Result<Box<dyn Model>, CliError> {
    ddmlip_models::load_model_with_modal(name, modal).map_err(CliError::input)
}

fn eval_error(e: EvalError) -> CliError {
    match e {
        EvalError::Input(_) => CliError::input(e),
        EvalError::Engine(ddmlip_engine::EngineError::Input(_)) => CliError::input(e),
        _ => CliError::failed(e),
    }
}

fn load_spec(path: &Option<PathBuf>) -> Result<Option<ddmlip_spec::MLIPSpec>, CliError> {
    path.as_ref()
        .map(|p| {
            ddmlip_spec::MLIPSpec::load(p)
                .with_context(|| format!("spec file {}", p.display()))
                .map_err(CliError::input)
        })
        .transpose()
}

fn eval(a: EvalArgs) -> Result<u8, CliError> {
    if a.backend == Backend::Mpi {
        return mpi_cmd::eval_mpi(a);
    }
    let ranks = a.ranks.unwrap_or(1);
    if let Some(out) = &a.output {
        eval_batch::check_writable(out)?;
    }
    let model = load_model(&a.model, a.modal.as_deref())?;
    let spec = load_spec(&a.spec)?;
    if let (Some(spec), Some(path)) = (&spec, &a.spec) {
        if ranks > 1 {
            eval_batch::warn_unvalidated_spec(
                spec,
                path,
                model.as_ref(),
                &a.model,
                &a.structure,
                ranks,
            );
        }
    }
    let opts = EvalOptions {
        dtype: a.dtype.into(),
        ranks,
        spec,
        balance: a.balance.into(),
        ..Default::default()
    };
    let to_stdout = a.output.as_deref().is_some_and(eval_batch::is_stdio);
    let run = eval_batch::run_batch(
        model.as_ref(),
        opts,
        &a.structure,
        a.output.as_deref(),
        true,
    )?;
    let health = run.health();
    let mut flags = format!("--structure {}", a.structure.display());
    if let BalanceArg::Atoms = a.balance {
        flags.push_str(" --balance atoms");
    }
    if let Some(warning) = output::degenerate_warning(&health, Some(&flags)) {
        eprint!("{warning}");
    }
    if let Some(warning) = eval_batch::absurd_energy_warning(&run) {
        eprint!("{warning}");
    }
    let dtype = DType::from(a.dtype).to_string();
    let report = if a.json {
        eval_batch::batch_json(model.as_ref(), &run, ranks, &dtype).to_string() + "\n"
    } else {
        let mut text = eval_batch::batch_text(model.as_ref(), &run, ranks);
        if let Some(out) = a.output.as_ref().filter(|_| !to_stdout) {
            text.push_str(&format!("wrote {}\n", out.display()));
        }
        text
    };
    // With `--output -` the structure owns stdout; the summary goes to stderr.
    if to_stdout {
        eprint!("{report}");
    } else {
        print!("{report}");
    }
    Ok(0)
}

/// The health of each frame's split, after warning on stderr about splits
/// that leave ranks idle or holding the whole system.
// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn report_split_health(
    a: &EvalArgs,
    frames: &[System],
    result: &EvalResult,
) -> Vec<ddmlip_domain::PartitionHealth> {
    let health = output::eval_health(frames, result);
    let mut flags = format!("--structure {}", a.structure.display());
    if let BalanceArg::Atoms = a.balance {
        flags.push_str(" --balance atoms");
    }
    if let Some(warning) = output::degenerate_warning(&health, Some(&flags)) {
        eprint!("{warning}");
    }
    health
}

// Used by the MPI backend (`--features mpi`) only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn write_results(path: &Path, frames: &[System], result: &EvalResult) -> Result<(), CliError> {
    let out = result.annotate(frames);
    ddmlip_atoms::extxyz::write_file(path, &out)
        .with_context(|| format!("writing {}", path.display()))
        .map_err(CliError::input)
}

fn neighbors(a: NeighborsArgs) -> Result<u8, CliError> {
    use ddmlip_neighbors::{neighbor_list, NeighborOptions};
    let frames = read_structure(&a.structure)?;
    let mut per_frame = Vec::new();
    for (s, sys) in frames.iter().enumerate() {
        let nl = neighbor_list(
            &sys.positions,
            sys.cell.as_ref(),
            sys.pbc,
            &NeighborOptions {
                cutoff: a.cutoff,
                half: a.half,
            },
        )
        .map_err(|e| CliError::input(anyhow!("frame {s}: {e}")))?;
        per_frame.push(output::NeighborStats::new(sys, &nl));
    }
    if a.json {
        println!("{}", output::neighbors_json(&per_frame, a.cutoff, a.half));
    } else {
        print!("{}", output::neighbors_text(&per_frame, a.cutoff, a.half));
    }
    Ok(0)
}

fn partition(a: PartitionArgs) -> Result<u8, CliError> {
    use ddmlip_domain::{partition_health, partition_system_balanced};
    if !(a.cutoff.is_finite() && a.cutoff > 0.0) {
        return Err(CliError::input(anyhow!(
            "--cutoff must be a positive number of Å, got {}",
            a.cutoff
        )));
    }
    if a.ranks == 0 {
        return Err(CliError::input(anyhow!("--ranks must be at least 1")));
    }
    let frames = read_structure(&a.structure)?;
    let sys = &frames[0];
    sys.validate().map_err(CliError::input)?;
    let balance = BalancePolicy::from(a.balance).partition_balance();
    let p = partition_system_balanced(sys, a.ranks, a.cutoff + a.skin, balance)
        .map_err(CliError::input)?;
    let health = partition_health(&p, sys);
    if let Some(svg) = &a.svg {
        let axes = output::svg_axes(&p);
        std::fs::write(svg, ddmlip_domain::svg::render_svg(&p, sys, axes))
            .with_context(|| format!("writing {}", svg.display()))
            .map_err(CliError::input)?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&health).unwrap_or_default()
        );
    } else {
        print!("{}", output::partition_text(&health));
        if let Some(svg) = &a.svg {
            println!("wrote {}", svg.display());
        }
    }
    Ok(0)
}

fn models() -> Result<u8, CliError> {
    for (name, desc) in ddmlip_models::model_names() {
        println!("{name:<20} {desc}");
    }
    Ok(0)
}

/// FCC copper, `n³` conventional cells, rattled deterministically.
pub fn demo_crystal(n: usize) -> System {
    let a = 3.615;
    let basis = [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
    ];
    let mut w = ddmlip_models::init::Weights::new(2024);
    let mut positions = Vec::with_capacity(4 * n * n * n);
    for i in 0..n {
        for j in 0..n {
            for k in 0..n {
                for b in basis {
                    positions.push([
                        (i as f64 + b[0]) * a + 0.05 * w.uniform(),
                        (j as f64 + b[1]) * a + 0.05 * w.uniform(),
                        (k as f64 + b[2]) * a + 0.05 * w.uniform(),
                    ]);
                }
            }
        }
    }
    let len = n as f64 * a;
    let numbers = vec![29; positions.len()];
    System::new(
        positions,
        numbers,
        Some(ddmlip_atoms::Cell::orthorhombic(len, len, len)),
        [true; 3],
    )
}

fn demo(a: DemoArgs) -> Result<u8, CliError> {
    let model = load_model(&a.model, None)?;
    if a.repeat == 0 {
        return Err(CliError::input(anyhow!("--repeat must be at least 1")));
    }
    let sys = demo_crystal(a.repeat);
    let frames = vec![sys];
    println!(
        "ddmlip demo: {} on FCC Cu, {} atoms in a {:.2} Å periodic box",
        model.name(),
        frames[0].len(),
        a.repeat as f64 * 3.615
    );
    let t0 = std::time::Instant::now();
    let single = evaluate(model.as_ref(), &frames, &EvalOptions::default()).map_err(eval_error)?;
    let t_single = t0.elapsed().as_secs_f64();
    let opts = EvalOptions {
        ranks: a.ranks,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let split = evaluate(model.as_ref(), &frames, &opts).map_err(eval_error)?;
    let t_split = t0.elapsed().as_secs_f64();
    let health = output::eval_health(&frames, &split);
    if let Some(warning) = output::degenerate_warning(&health, None) {
        eprint!("{warning}");
    }
    print!(
        "{}",
        output::demo_text(&frames[0], &single, &split, a.ranks, t_single, t_split)
    );
    let worst = output::max_rel_difference(&single, &split);
    if worst > 1e-10 {
        println!(
            "FAIL: decomposed run differs from the single-process run (max relative difference {})",
            fmt_e(worst)
        );
        return Ok(crate::EXIT_FAILED);
    }
    println!(
        "OK: the {}-rank run equals the single-process run (max relative difference {}).",
        a.ranks,
        fmt_e(worst)
    );
    // The model author's view: trace, infer a spec, validate it, explain.
    let report = ddmlip_validate::trace_and_validate(
        model.as_ref(),
        &frames,
        &ddmlip_validate::ValidateOptions {
            ranks: a.ranks,
            ..Default::default()
        },
    )
    .map_err(CliError::input)?;
    println!(
        "validate: {} after {} attempt(s) in {:.2} s ({}); `ddmlip validate` prints the full report",
        if report.ok { "PASS" } else { "FAIL" },
        report.attempts.len(),
        report.seconds,
        report.next_action.lines().next().unwrap_or("")
    );
    Ok(if report.ok { 0 } else { crate::EXIT_FAILED })
}
