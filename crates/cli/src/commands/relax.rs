//! `ddmlip relax`: FIRE relaxation of the positions on a decomposed system
//! (the numerics live in `ddmlip-md`).

use crate::args::{Backend, BalanceArg, Precision};
use crate::error::{CliError, EXIT_FAILED};
use anyhow::anyhow;
use clap::Args;
use ddmlip_atoms::System;
use ddmlip_md::{CellRelax, MdError, RelaxConfig, RelaxSummary, Topology};
use std::path::PathBuf;

#[derive(Args)]
pub struct RelaxArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    modal: Option<String>,
    /// Extended XYZ structure (the last frame is used).
    #[arg(long)]
    structure: PathBuf,
    /// Converged when the largest force on any atom is below this (eV/Å).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    fmax: f64,
    /// Give up (exit 1) after this many FIRE steps.
    #[arg(long, default_value_t = 1000)]
    max_steps: u64,
    /// Relax the cell too (ASE's `UnitCellFilter`: the deformation gradient
    /// times the atom count as three extra rows; converged when their
    /// forces, virial·F⁻ᵀ/N, are below --fmax as well). Needs a periodic cell.
    #[arg(long)]
    cell: bool,
    /// With --cell: the external pressure (GPa) the stress relaxes to [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pressure: Option<f64>,
    /// Verlet skin (Å) of the pair list.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    skin: f64,
    /// Ranks to split the system over [default: 1]. Under `--backend mpi`
    /// the MPI job's size.
    #[arg(long)]
    ranks: Option<usize>,
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    dtype: Precision,
    /// Where forces are evaluated: cpu, or cuda[:N] (--ranks N: ranks sharing the GPU;
    /// build with --features cuda): lj, schnet-demo and SevenNet use their
    /// own CUDA kernels, every other model (and any with --engine-ops) runs
    /// through the op engine with its generic ops on the GPU.
    #[arg(long, default_value = "cpu")]
    device: crate::device::Device,
    /// GPUs of the ranks with `--device cuda` and `--ranks N`, round-robin:
    /// a list (`0,1,2,3`) or `all` (every GPU this machine has); default:
    /// every rank on the `--device` GPU.
    #[arg(long)]
    gpus: Option<crate::device::GpuList>,
    /// With `--device cuda`: evaluate the model through the op engine, its
    /// generic ops on the GPU, instead of its own CUDA kernels.
    #[arg(long)]
    engine_ops: bool,
    #[arg(long, value_enum, default_value_t = BalanceArg::Geometric)]
    balance: BalanceArg,
    /// The relaxed structure with energy, forces and stress (extended XYZ).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    json: bool,
}

fn md_error(e: MdError) -> CliError {
    match e {
        MdError::Input(_) => CliError::input(e),
        _ => CliError::failed(e),
    }
}

/// Runs `ddmlip relax`.
pub fn relax(a: RelaxArgs) -> Result<u8, CliError> {
    crate::device::gpus_need_cuda(a.device, a.gpus.as_ref())?;
    if a.pressure.is_some() && !a.cell {
        return Err(CliError::input(anyhow!(
            "--pressure sets the target of the cell relaxation; it needs --cell"
        )));
    }
    let frames = crate::input::read_structure(&a.structure)?;
    let system = frames
        .into_iter()
        .last()
        .ok_or_else(|| CliError::input(anyhow!("{}: no frames", a.structure.display())))?;
    let model = crate::input::load_model(&a.model, a.modal.as_deref())?;
    ddmlip_runtime::check_batch(model.as_ref(), std::slice::from_ref(&system))
        .map_err(|e| CliError::input(anyhow!("{}: {e}", a.structure.display())))?;
    let topology = Topology {
        numbers: system.numbers.clone(),
        // FIRE is mass-less; masses are not read.
        masses: vec![1.0; system.len()],
        pbc: system.pbc,
    };
    let config = RelaxConfig {
        fmax: a.fmax,
        max_steps: a.max_steps,
        skin: a.skin,
        dtype: a.dtype.into(),
        even_counts: matches!(a.balance, BalanceArg::Atoms),
        cell: a.cell.then(|| CellRelax {
            pressure_gpa: a.pressure.unwrap_or(0.0),
        }),
        ..Default::default()
    };
    let cell = system.cell_or_zero();
    let bar = crate::progress::step_bar(config.max_steps, "relax");
    let config = RelaxConfig {
        on_step: bar.as_ref().map(|(_, observer)| observer.clone()),
        ..config
    };
    let clear = bar.map(|(bar, _)| super::md::ClearOnDrop(bar));
    // Through the op engine on a GPU: the CPU run's path, its ops there.
    let mut device = a.device;
    let mut config = config;
    let one_process = (a.backend == Backend::Mpi, a.gpus.is_some());
    if let Some((engine, _)) =
        crate::device::engine_device(a.device, a.engine_ops, &a.model, one_process)?
    {
        config.device = Some(engine);
        device = crate::device::Device::Cpu;
    }
    let s = match (device, a.backend) {
        (crate::device::Device::Cuda(index), backend) => {
            crate::device::gpu_ranks_only("relax", backend == Backend::Mpi, None)?;
            let ranks = a.ranks.unwrap_or(1);
            if ranks != 1 {
                let fields = crate::device::rank_force_fields(
                    &a.model,
                    a.modal.as_deref(),
                    a.dtype,
                    (index, a.gpus.as_ref()),
                    ranks,
                    topology.pbc,
                )?;
                ddmlip_md::relax_threads_with_fields(
                    model.as_ref(),
                    &topology,
                    cell,
                    &system.positions,
                    &config,
                    fields,
                )
                .map_err(md_error)?
            } else {
                let mut field =
                    crate::device::force_field(&a.model, a.modal.as_deref(), a.dtype, index)?;
                ddmlip_md::relax_with_force_field(
                    model.as_ref(),
                    &topology,
                    cell,
                    &system.positions,
                    &config,
                    field.as_mut(),
                )
                .map_err(md_error)?
            }
        }
        (_, Backend::Threads) => ddmlip_md::relax_threads(
            model.as_ref(),
            &topology,
            cell,
            &system.positions,
            &config,
            a.ranks.unwrap_or(1),
        )
        .map_err(md_error)?,
        (_, Backend::Mpi) => {
            match relax_mpi(model.as_ref(), &topology, cell, &system.positions, &config)? {
                Some(s) => s,
                // Ranks other than 0 report nothing.
                None => return Ok(0),
            }
        }
    };
    drop(clear);
    if let (Some(path), Some(last)) = (&a.output, &s.last) {
        let mut out = System::new(
            last.positions.clone(),
            system.numbers.clone(),
            system.cell.map(|_| last.cell),
            system.pbc,
        );
        out.properties = system.properties.clone();
        out.properties.arrays.remove("momenta");
        out.properties.arrays.remove("forces");
        out.set_energy(last.energy);
        out.set_forces(&last.forces);
        if let Some(st) = last.stress {
            out.set_stress_voigt(st);
        }
        ddmlip_atoms::extxyz::write_file(path, &[out]).map_err(CliError::failed)?;
    }
    report(&a, &s)?;
    Ok(if s.converged { 0 } else { EXIT_FAILED })
}

/// Relaxes as this process's rank of the MPI job; rank 0 gets the summary.
#[cfg(feature = "mpi")]
fn relax_mpi(
    model: &dyn ddmlip_engine::Model,
    topology: &Topology,
    cell: ddmlip_atoms::Cell,
    positions: &[[f64; 3]],
    config: &RelaxConfig,
) -> Result<Option<RelaxSummary>, CliError> {
    let comm = crate::mpi::SharedComm::init(ddmlip_comm::DEFAULT_TIMEOUT)?;
    ddmlip_md::relax_rank(
        model,
        topology,
        cell,
        positions,
        config,
        Box::new(comm.handle()),
    )
    .map_err(md_error)
}

#[cfg(not(feature = "mpi"))]
fn relax_mpi(
    _: &dyn ddmlip_engine::Model,
    _: &Topology,
    _: ddmlip_atoms::Cell,
    _: &[[f64; 3]],
    _: &RelaxConfig,
) -> Result<Option<RelaxSummary>, CliError> {
    Err(CliError::input(anyhow!(
        "this ddmlip was built without MPI support; rebuild it with `cargo build --release --features mpi`, then launch `mpirun -n N ddmlip relax --backend mpi ...`"
    )))
}

fn report(a: &RelaxArgs, s: &RelaxSummary) -> Result<(), CliError> {
    if a.json {
        println!("{}", serde_json::to_string(s).map_err(CliError::failed)?);
        return Ok(());
    }
    println!(
        "relax {} | model {} | {} atoms | {} rank(s) | FIRE{}, fmax {} eV/Å",
        if s.converged {
            "converged"
        } else {
            "NOT converged"
        },
        a.model,
        s.n_atoms,
        s.ranks,
        if a.cell {
            format!(
                " with the cell (UnitCellFilter, {} GPa)",
                a.pressure.unwrap_or(0.0)
            )
        } else {
            String::new()
        },
        a.fmax
    );
    println!(
        "{} steps: E {:.10} → {:.10} eV, max |F| = {:.3e} eV/Å | {} rebuilds | {:.3} s",
        s.steps, s.initial_energy, s.energy, s.fmax, s.rebuilds, s.wall_s
    );
    if let (true, Some(v), Some(p), Some(h)) = (a.cell, s.volume, s.pressure_gpa, s.cell) {
        let len = |r: [f64; 3]| (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
        println!(
            "cell: a b c = {:.6} {:.6} {:.6} Å | V = {v:.4} Å³ | P = {p:.6} GPa",
            len(h[0]),
            len(h[1]),
            len(h[2])
        );
    }
    if !s.converged {
        eprintln!(
            "error: max |F| = {:.3e} eV/Å is still above --fmax {} after --max-steps {}",
            s.fmax, a.fmax, a.max_steps
        );
    }
    Ok(())
}
