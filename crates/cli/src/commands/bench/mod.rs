//! `ddmlip bench`: wall-clock and memory benchmarks of full evaluations
//! (`model`), the parallel efficiency the machine allows (`cores`) and its
//! f32 GEMM rate (`gemm`).

use crate::error::CliError;
use clap::{Args, Subcommand};

mod cores;
mod gemm;
mod model;
mod phases;
mod procfs;
mod stats;

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
    Model(model::ModelBenchArgs),
    /// The parallel efficiency this machine allows a decomposed run: threads
    /// doing identical, independent work and meeting after every step, as
    /// ranks do, against one thread alone.
    Cores(cores::CoresBenchArgs),
    /// The f32 GEMM rate of this machine (matrixmultiply sgemm), single thread
    /// and split over row blocks on a rayon pool, as the engine splits it.
    Gemm(gemm::GemmBenchArgs),
}

/// Runs `ddmlip bench …`; returns the exit status.
pub fn run(a: BenchArgs) -> Result<u8, CliError> {
    match a.what {
        BenchWhat::Model(m) if m.child => model::child(&m),
        BenchWhat::Model(m) => model::run(&m),
        BenchWhat::Gemm(g) => gemm::run(&g),
        BenchWhat::Cores(c) => cores::run(&c),
    }
}
