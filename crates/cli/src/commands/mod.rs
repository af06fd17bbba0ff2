//! The subcommands, one file each. Each parses its arguments, calls the
//! library, and renders the result; no numerics live here.

use crate::error::CliError;
use clap::Subcommand;

mod bench;
mod demo;
mod eval;
mod eval_batch;
mod eval_mpi;
mod md;
mod md_validate;
mod models;
mod neighbors;
mod partition;
mod relax;
mod validate;

/// Every `ddmlip` subcommand.
#[derive(Subcommand)]
pub enum Command {
    /// Energies, forces and stress of every frame of a structure file.
    Eval(crate::args::EvalArgs),
    /// Neighbour-list statistics of a structure.
    Neighbors(neighbors::NeighborsArgs),
    /// How a structure splits over ranks: owned / ghost / remote atoms and health.
    Partition(partition::PartitionArgs),
    /// List the built-in models, or inspect a torch.export archive (`--inspect PATH.pt2`).
    Models(models::ModelsArgs),
    /// The embedded default job: a built-in model on a generated crystal, in one
    /// process and split over ranks, compared atom by atom.
    Demo(demo::DemoArgs),
    /// Does the model give the single-process answer split over ranks? If not,
    /// why, and which spec fixes it.
    Validate(validate::ValidateArgs),
    /// Benchmarks: model evaluation time and memory per rank count, GEMM rate.
    Bench(bench::BenchArgs),
    /// Molecular dynamics (nve, langevin, nose-hoover) split over ranks, with
    /// skin lists, migration, trajectory, thermo log and checkpoints.
    // Boxed: by far the largest argument set.
    Md(Box<md::MdArgs>),
    /// Relax the positions (with --cell also the cell) with FIRE, split over ranks.
    Relax(relax::RelaxArgs),
}

/// Runs one subcommand; returns the exit status on success.
pub fn run(cmd: Command) -> Result<u8, CliError> {
    match cmd {
        Command::Eval(a) => eval::run(a),
        Command::Neighbors(a) => neighbors::run(a),
        Command::Partition(a) => partition::run(a),
        Command::Models(a) => models::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Md(a) => md::md(*a),
        Command::Relax(a) => relax::relax(a),
    }
}
