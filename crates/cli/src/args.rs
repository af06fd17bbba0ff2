//! Argument groups shared by several commands: backend, precision, balance,
//! and the arguments of `eval` (read by both its backends).

use clap::{Args, ValueEnum};
use ddmlip::{BalancePolicy, DType};
use std::path::PathBuf;

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
    pub(crate) model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    pub(crate) modal: Option<String>,
    /// Extended XYZ structure file (several frames = a batch).
    #[arg(long)]
    pub(crate) structure: PathBuf,
    /// Split every system over this many ranks [default: 1]. Under
    /// `--backend mpi` the rank count is the MPI job's size instead.
    #[arg(long)]
    pub(crate) ranks: Option<usize>,
    /// Communication backend: threads of this process, or one MPI process
    /// per rank (`mpirun -n N ddmlip eval --backend mpi ...`).
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    pub(crate) backend: Backend,
    /// Floating-point precision.
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    pub(crate) dtype: Precision,
    /// Write the structure with energy, forces and stress as extended XYZ.
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// A distribution spec (JSON) for --ranks > 1 instead of the model's own.
    #[arg(long)]
    pub(crate) spec: Option<PathBuf>,
    /// How split runs place domain boundaries.
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    pub(crate) balance: BalanceArg,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where to evaluate: cpu, or cuda[:N] (build with --features cuda):
    /// lj, schnet-demo and SevenNet use their own CUDA kernels, every other
    /// model (and any with --engine-ops) runs through the op engine with
    /// its generic ops on the GPU.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: crate::device::Device,
    /// GPUs of the ranks with `--device cuda` and `--ranks N`, round-robin:
    /// a list (`0,1,2,3`) or `all` (every GPU this machine has); default:
    /// every rank on the `--device` GPU.
    #[arg(long)]
    pub(crate) gpus: Option<crate::device::GpuList>,
    /// With `--device cuda`: run the model through the op engine, its
    /// generic ops on the GPU (any model; what models without CUDA
    /// kernels of their own always do), instead of the model's own kernels.
    #[arg(long)]
    pub(crate) engine_ops: bool,
}
