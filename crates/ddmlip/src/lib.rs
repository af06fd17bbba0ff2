//! **ddmlip**: machine-learned interatomic potentials run by spatial domain
//! decomposition, with proof that the split run equals the single-process
//! one.
//!
//! This crate is the one to depend on. It re-exports what a program needs
//! from the workspace's crates:
//!
//! - structures: [`System`], [`Cell`], [`read_structure`] / [`write_structure`]
//!   (extended XYZ as ASE writes it, POSCAR, LAMMPS data, gzip) and small
//!   crystals in [`build`];
//! - models: [`load_model`] (built-ins such as `lj`, `schnet-demo`,
//!   `sevennet-0`, TOML model files, SevenNet checkpoints) and the [`Model`]
//!   trait to write your own against the op [`engine`];
//! - evaluation: [`evaluate`] once, or an [`Evaluator`] again and again, with
//!   [`EvalOptions`] (precision [`DType`], ranks, spec, balance) giving an
//!   [`EvalResult`] (energy in eV, forces in eV/Å, stress in eV/Å³);
//! - validation: [`trace_and_validate`] infers a distribution spec
//!   ([`spec`]) from a trace, runs it split over ranks, compares every output
//!   per global atom id and fixes the spec when it can;
//! - decomposition: [`partition`] shows how a system splits and whether the
//!   split is healthy.
//!
//! # Example
//!
//! Energy, forces and stress of a 32-atom copper crystal with the built-in
//! Lennard-Jones, in one process and split over 2 ranks:
//!
//! ```
//! use ddmlip::{build, evaluate, load_model, EvalOptions};
//!
//! let crystal = build::demo_copper(2); // FCC Cu, 2×2×2 cells, rattled
//! let model = load_model("lj")?;
//! let single = evaluate(model.as_ref(), &[crystal.clone()], &EvalOptions::default())?;
//! let split = evaluate(
//!     model.as_ref(),
//!     &[crystal],
//!     &EvalOptions { ranks: 2, ..Default::default() },
//! )?;
//! // Physics outputs are `Option`s: a run may lack one (an empty batch).
//! let (e1, e2) = (single.energy().ok_or("no energy")?[0], split.energy().ok_or("no energy")?[0]);
//! assert!((e1 - e2).abs() <= 1e-10 * e1.abs());
//! let forces = single.forces().ok_or("no forces")?;
//! assert_eq!(forces.len(), 32);
//! // Newton's third law: the forces of a periodic crystal sum to zero.
//! let total: f64 = forces.iter().map(|f| f[0]).sum();
//! assert!(total.abs() < 1e-10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The `examples/` directory has three programs: `evaluate` (a batch from
//! an XYZ file and back), `validate` (a model's distribution checked and
//! explained), `custom_model` (a model written against the engine's ops,
//! then validated).

#![forbid(unsafe_code)]

pub use ddmlip_atoms::{
    build, read_structure, write_structure, Cell, StructureError, System, XyzError,
};
mod device;
pub use ddmlip_engine::{DType, Model, ModelForward, ModelInfo};
pub use ddmlip_models::{load_model, model_names, ModelError};
pub use ddmlip_runtime::{
    evaluate, BalancePolicy, EngineDevice, EvalError, EvalOptions, EvalResult, Evaluator,
    OutputData, RankTimings,
};
pub use ddmlip_spec::{GatherMode, MLIPSpec, OutputKind, Policy, PolicyKind, ScatterMode};
pub use ddmlip_validate::{trace_and_validate, TraceReport, ValidateError, ValidateOptions};
pub use device::Device;

/// The op engine models are written against: [`engine::Graph`] and its ops,
/// tensors with row domains, the reverse-mode tape.
pub use ddmlip_engine as engine;

/// The runtime: everything [`evaluate`] and [`Evaluator`] are built on,
/// including [`runtime::evaluate_on_communicator`] for one MPI process per
/// rank.
pub use ddmlip_runtime as runtime;

/// Distribution specs ([`MLIPSpec`]): versioned JSON saying how a model's
/// gathers, scatters and per-system sums behave across ranks.
pub use ddmlip_spec as spec;

/// Model validation: spec inference, decomposed comparison, auto-fix rules
/// and diagnostics.
pub use ddmlip_validate as validate;

/// How a system splits over ranks: owners, ghosts with image shifts, halo
/// plans, partition health and an SVG picture.
pub mod partition {
    pub use ddmlip_domain::svg::render_svg;
    pub use ddmlip_domain::{
        partition_health, partition_system, partition_system_balanced, Balance, Ghost, Partition,
        PartitionError, PartitionHealth, RankDomain, RankHealth,
    };
}
