//! `ddmlip md`: molecular dynamics on a decomposed system (the numerics live
//! in `ddmlip-md`; this parses, checks, writes files and reports).

use crate::args::{Backend, BalanceArg, Precision};
use crate::error::{CliError, EXIT_BAD_INPUT, EXIT_FAILED};
use anyhow::anyhow;
use clap::{Args, ValueEnum};
use ddmlip_atoms::{elements, Column, System};
use ddmlip_md::{
    maxwell_boltzmann, CellDof, Checkpoint, Ensemble, Frame, MdConfig, MdError, MdSink, MdSummary,
    StartState, ThermoRow, Topology,
};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Exit status after SIGINT (128 + 2), as shells report it.
pub const EXIT_INTERRUPTED: u8 = 130;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum EnsembleArg {
    /// Velocity Verlet (constant energy).
    Nve,
    /// Langevin thermostat, BAOAB splitting (constant temperature).
    Langevin,
    /// Nosé–Hoover chain thermostat (constant temperature, deterministic).
    NoseHoover,
    /// Constant pressure: Langevin thermostat (BAOAB) with stochastic cell
    /// rescaling (Bernetti & Bussi 2020); see --cell-dof.
    Npt,
}

/// Which cell degrees of freedom `--ensemble npt` moves.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum CellDofArg {
    /// The volume only (the cell keeps its shape).
    Iso,
    /// All six strain components: lengths and angles (triclinic cells).
    Full,
}

#[derive(Args)]
pub struct MdArgs {
    /// Built-in model name (see `ddmlip models`) or a model file.
    #[arg(long)]
    model: String,
    /// Fidelity of a multi-fidelity SevenNet checkpoint (e.g. `PBE`,
    /// `R2SCAN` for sevennet-mf-0); required for those, refused for others.
    #[arg(long)]
    modal: Option<String>,
    /// Extended XYZ structure (the last frame is used, as `ase.io.read` does).
    /// Momenta come from its `momenta` column, masses from its `masses`
    /// column, else ASE's standard atomic masses.
    #[arg(long)]
    structure: PathBuf,
    #[arg(long, value_enum)]
    ensemble: EnsembleArg,
    /// Time step (fs).
    #[arg(long, allow_negative_numbers = true)]
    dt: f64,
    /// Steps to run (after a restart: steps to add).
    #[arg(long, allow_negative_numbers = true)]
    steps: i64,
    /// Target temperature (K) of the thermostat.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f64>,
    /// Langevin friction (1/ps).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    friction: f64,
    /// Nosé–Hoover time constant, or for npt the Langevin thermostat's
    /// (friction 1/tdamp) (fs) [default: 100 × --dt].
    #[arg(long, allow_negative_numbers = true)]
    tdamp: Option<f64>,
    /// Target pressure (GPa) of `--ensemble npt`.
    #[arg(long, allow_negative_numbers = true)]
    pressure: Option<f64>,
    /// Barostat time constant (fs) of `--ensemble npt` [default: 1000 × --dt].
    #[arg(long, allow_negative_numbers = true)]
    pdamp: Option<f64>,
    /// Isothermal compressibility (1/GPa) the barostat assumes: sets how fast
    /// the volume relaxes, not the ensemble.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true)]
    compressibility: f64,
    /// Cell degrees of freedom of `--ensemble npt`.
    #[arg(long, value_enum, default_value_t = CellDofArg::Iso)]
    cell_dof: CellDofArg,
    /// Thermostats in the Nosé–Hoover chain.
    #[arg(long, default_value_t = 3)]
    chain: usize,
    /// Draw initial momenta from Maxwell–Boltzmann at this temperature (K),
    /// with zero total momentum, when the structure has no `momenta`.
    #[arg(long, allow_negative_numbers = true)]
    init_temperature: Option<f64>,
    /// Seed of the initial momenta and of the random forces.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Verlet skin (Å): pairs are listed to cutoff + skin and the list is
    /// rebuilt once some atom moved more than skin/2.
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
    /// Rebuilds between full (collective) repartitions that re-place the
    /// domains for load balance (0: never scheduled); in between atoms
    /// migrate point to point. Only where domains can move (`--balance
    /// atoms`, or a non-periodic axis).
    #[arg(long, default_value_t = ddmlip_md::DEFAULT_REPARTITION_EVERY)]
    repartition_every: u64,
    /// Repartition at a rebuild whose most loaded rank owns more than this
    /// multiple of the mean atom count (≥ 1; only where domains can move).
    #[arg(long, default_value_t = ddmlip_md::DEFAULT_MAX_IMBALANCE, allow_negative_numbers = true)]
    max_imbalance: f64,
    /// How rebuilds between repartitions move atoms: point to point among
    /// neighbour ranks, or by gathering every position (the reference path).
    #[arg(long, value_enum, default_value_t = MigrationArg::PointToPoint)]
    migration: MigrationArg,
    /// Trajectory (extended XYZ, positions, momenta, energy, forces, stress).
    #[arg(long)]
    traj: Option<PathBuf>,
    /// Steps between trajectory frames.
    #[arg(long, default_value_t = 10)]
    traj_every: u64,
    /// Thermo log (CSV).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Steps between thermo rows.
    #[arg(long, default_value_t = 10)]
    log_every: u64,
    /// Checkpoint file (rewritten atomically; also written on SIGINT).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Continue from a checkpoint of a run of the same structure.
    #[arg(long)]
    restart: Option<PathBuf>,
    /// The final state (extended XYZ).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// Trajectory validation: run the job on 1 rank and on --ranks, compare
    /// positions and momenta per global atom id after every step, and report
    /// where they first departed (exit 1 if they did). Writes no files.
    #[arg(long)]
    validate: bool,
    /// Largest position difference (Å) and momentum difference (ASE units)
    /// --validate accepts.
    #[arg(long, default_value_t = 1e-8)]
    validate_atol: f64,
}

fn md_error(e: MdError) -> CliError {
    match e {
        MdError::Input(_) => CliError::input(e),
        _ => CliError::failed(e),
    }
}

/// Everything every rank prepares identically before the run.
struct Prepared {
    model: Box<dyn ddmlip_engine::Model>,
    /// The input system (for writing frames: numbers, pbc, masses column).
    system: System,
    topology: Topology,
    start: StartState,
    config: MdConfig,
    has_masses: bool,
}

fn float_column<'a>(
    sys: &'a System,
    name: &str,
    width: usize,
) -> Result<Option<&'a [f64]>, CliError> {
    match sys.properties.arrays.get(name) {
        None => Ok(None),
        Some(Column::Float(v, w)) if *w == width && v.len() == sys.len() * width => Ok(Some(v)),
        Some(_) => Err(CliError::input(anyhow!(
            "column `{name}` must hold {width} real number(s) per atom"
        ))),
    }
}

fn prepare(a: &MdArgs) -> Result<Prepared, CliError> {
    if a.validate {
        if a.traj.is_some() || a.log.is_some() || a.checkpoint.is_some() || a.output.is_some() {
            return Err(CliError::input(anyhow!(
                "--validate writes no files: drop --traj, --log, --checkpoint and --output"
            )));
        }
        if a.backend == Backend::Mpi {
            return Err(CliError::input(anyhow!(
                "--validate runs on thread ranks (--backend threads)"
            )));
        }
        if !(a.validate_atol.is_finite() && a.validate_atol > 0.0) {
            return Err(CliError::input(anyhow!(
                "--validate-atol must be positive, got {}",
                a.validate_atol
            )));
        }
    }
    if !(a.dt.is_finite() && a.dt > 0.0) {
        return Err(CliError::input(anyhow!(
            "--dt must be a positive time step in fs, got {}",
            a.dt
        )));
    }
    if a.steps <= 0 {
        return Err(CliError::input(anyhow!(
            "--steps must be at least 1, got {}",
            a.steps
        )));
    }
    for (flag, v) in [
        ("--temperature", a.temperature),
        ("--init-temperature", a.init_temperature),
    ] {
        if let Some(t) = v {
            if !(t.is_finite() && t >= 0.0) {
                return Err(CliError::input(anyhow!(
                    "{flag} must be a non-negative temperature in K, got {t}"
                )));
            }
        }
    }
    if !(a.friction.is_finite() && a.friction >= 0.0) {
        return Err(CliError::input(anyhow!(
            "--friction must be a non-negative rate in 1/ps, got {}",
            a.friction
        )));
    }
    if a.traj_every == 0 || a.log_every == 0 {
        return Err(CliError::input(anyhow!(
            "--traj-every and --log-every must be at least 1"
        )));
    }
    let ensemble = match a.ensemble {
        EnsembleArg::Nve => Ensemble::Nve,
        EnsembleArg::Langevin => Ensemble::Langevin {
            temperature: a.temperature.ok_or_else(|| {
                CliError::input(anyhow!("--ensemble langevin needs --temperature K"))
            })?,
            friction_per_ps: a.friction,
        },
        EnsembleArg::NoseHoover => Ensemble::NoseHoover {
            temperature: a.temperature.ok_or_else(|| {
                CliError::input(anyhow!("--ensemble nose-hoover needs --temperature K"))
            })?,
            tdamp_fs: a.tdamp.unwrap_or(100.0 * a.dt),
            chain: a.chain,
        },
        EnsembleArg::Npt => Ensemble::Npt {
            temperature: a
                .temperature
                .ok_or_else(|| CliError::input(anyhow!("--ensemble npt needs --temperature K")))?,
            tdamp_fs: a.tdamp.unwrap_or(100.0 * a.dt),
            pressure_gpa: a
                .pressure
                .ok_or_else(|| CliError::input(anyhow!("--ensemble npt needs --pressure GPA")))?,
            pdamp_fs: a.pdamp.unwrap_or(1000.0 * a.dt),
            compressibility_per_gpa: a.compressibility,
            cell_dof: match a.cell_dof {
                CellDofArg::Iso => CellDof::Iso,
                CellDofArg::Full => CellDof::Full,
            },
        },
    };
    let frames = crate::input::read_structure(&a.structure)?;
    let system = frames
        .into_iter()
        .last()
        .ok_or_else(|| CliError::input(anyhow!("{}: no frames", a.structure.display())))?;
    system
        .validate()
        .map_err(|e| CliError::input(anyhow!("{}: {e}", a.structure.display())))?;
    if system.is_empty() {
        return Err(CliError::input(anyhow!(
            "{}: the structure has no atoms",
            a.structure.display()
        )));
    }
    let model = crate::input::load_model(&a.model, a.modal.as_deref())?;
    ddmlip_runtime::check_batch(model.as_ref(), std::slice::from_ref(&system))
        .map_err(|e| CliError::input(anyhow!("{}: {e}", a.structure.display())))?;
    let masses_col = float_column(&system, "masses", 1)?;
    let masses: Vec<f64> = match masses_col {
        Some(m) => m.to_vec(),
        None => system
            .numbers
            .iter()
            .map(|&z| elements::mass(z).unwrap_or(0.0))
            .collect(),
    };
    if let Some((i, m)) = masses
        .iter()
        .enumerate()
        .find(|(_, m)| !(m.is_finite() && **m > 0.0))
    {
        return Err(CliError::input(anyhow!(
            "{}: atom {i} has mass {m}; masses must be positive",
            a.structure.display()
        )));
    }
    let topology = Topology {
        numbers: system.numbers.clone(),
        masses,
        pbc: system.pbc,
    };
    let cell = system.cell_or_zero();
    let start = match &a.restart {
        Some(path) => {
            let ck = Checkpoint::read(path).map_err(md_error)?;
            if ck.ensemble != ddmlip_md::Ensemble::name(&ensemble) {
                return Err(CliError::input(anyhow!(
                    "--restart {}: field `ensemble` is {}, but --ensemble is {}",
                    path.display(),
                    ck.ensemble,
                    ensemble.name()
                )));
            }
            StartState::from_checkpoint(&ck, &topology).map_err(md_error)?
        }
        None => {
            let momenta = match float_column(&system, "momenta", 3)? {
                Some(p) => p.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
                None => match a.init_temperature {
                    Some(t) => maxwell_boltzmann(&topology.masses, t, a.seed),
                    None => vec![[0.0; 3]; system.len()],
                },
            };
            StartState::fresh(cell, system.positions.clone(), momenta)
        }
    };
    let mut config = MdConfig::new(ensemble, a.dt, a.steps as u64);
    config.seed = a.seed;
    config.skin = a.skin;
    config.dtype = a.dtype.into();
    config.even_counts = matches!(a.balance, BalanceArg::Atoms);
    config.repartition_every = a.repartition_every;
    config.max_imbalance = a.max_imbalance;
    config.point_to_point = matches!(a.migration, MigrationArg::PointToPoint);
    config.frame_every = if a.traj.is_some() { a.traj_every } else { 0 };
    config.thermo_every = 1;
    config.checkpoint_every = if a.checkpoint.is_some() {
        a.checkpoint_every
    } else {
        0
    };
    config.final_frame = a.output.is_some();
    config.final_checkpoint = a.checkpoint.is_some();
    config.check().map_err(md_error)?;
    Ok(Prepared {
        model,
        has_masses: masses_col.is_some(),
        system,
        topology,
        start,
        config,
    })
}

/// Rank 0's files: trajectory, thermo log, checkpoints, final structure.
struct FileSink {
    template: System,
    has_masses: bool,
    traj: Option<(PathBuf, File)>,
    log: Option<(PathBuf, File)>,
    log_every: u64,
    last_step: u64,
    checkpoint: PathBuf,
    output: Option<PathBuf>,
    temperature_rows: Vec<f64>,
    dt_fs: f64,
    first_step: u64,
}

fn open(path: &Path, append: bool) -> Result<File, CliError> {
    let mut o = OpenOptions::new();
    if append {
        o.append(true).create(true);
    } else {
        o.write(true).create(true).truncate(true);
    }
    o.open(path)
        .map_err(|e| CliError::input(anyhow!("{}: {e}", path.display())))
}

const LOG_HEADER: &str = "step,time_ps,temperature_K,potential_eV,kinetic_eV,total_eV,conserved_eV,pressure_GPa,volume_A3,rebuilds,migrated,ns_per_day";

impl FileSink {
    fn new(a: &MdArgs, p: &Prepared) -> Result<Self, CliError> {
        let append = a.restart.is_some();
        let traj = match &a.traj {
            Some(path) => Some((path.clone(), open(path, append)?)),
            None => None,
        };
        let log = match &a.log {
            Some(path) => {
                let fresh = !append || std::fs::metadata(path).map_or(true, |m| m.len() == 0);
                let mut f = open(path, append)?;
                if fresh {
                    writeln!(f, "{LOG_HEADER}")
                        .map_err(|e| CliError::input(anyhow!("{}: {e}", path.display())))?;
                }
                Some((path.clone(), f))
            }
            None => None,
        };
        Ok(Self {
            template: p.system.clone(),
            has_masses: p.has_masses,
            traj,
            log,
            log_every: a.log_every,
            last_step: p.start.step + p.config.steps,
            checkpoint: a
                .checkpoint
                .clone()
                .unwrap_or_else(|| PathBuf::from("md.ckpt")),
            output: a.output.clone(),
            temperature_rows: Vec::new(),
            dt_fs: p.config.dt_fs,
            first_step: p.start.step,
        })
    }

    fn system(&self, frame: &Frame) -> System {
        frame.to_system(&self.template, self.has_masses, self.dt_fs)
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.10e}"))
}

impl MdSink for FileSink {
    fn thermo(&mut self, row: &ThermoRow) -> Result<(), MdError> {
        if row.step > self.first_step {
            self.temperature_rows.push(row.temperature);
        }
        let write_row = row.step.is_multiple_of(self.log_every) || row.step == self.last_step;
        if let (Some((path, f)), true) = (self.log.as_mut(), write_row) {
            writeln!(
                f,
                "{},{:.6},{:.6},{:.10e},{:.10e},{:.10e},{:.10e},{},{},{},{},{:.4}",
                row.step,
                row.time_ps,
                row.temperature,
                row.potential,
                row.kinetic,
                row.total,
                row.conserved,
                opt(row.pressure_gpa),
                opt(row.volume),
                row.rebuilds,
                row.migrated,
                row.ns_per_day
            )
            .and_then(|_| f.flush())
            .map_err(|e| MdError::Output(format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    fn frame(&mut self, frame: &Frame, is_final: bool) -> Result<(), MdError> {
        let sys = self.system(frame);
        if is_final {
            if let Some(path) = &self.output {
                ddmlip_atoms::extxyz::write_file(path, &[sys])
                    .map_err(|e| MdError::Output(e.to_string()))?;
            }
            return Ok(());
        }
        if let Some((path, f)) = self.traj.as_mut() {
            // One frame at a time, flushed: a later failure keeps every
            // frame written so far.
            ddmlip_atoms::extxyz::write_frames(&mut *f, &[sys])
                .map_err(|e| MdError::Output(format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), MdError> {
        checkpoint.write(&self.checkpoint)
    }
}

fn report(a: &MdArgs, s: &MdSummary, sink: &FileSink) -> Result<(), CliError> {
    if a.json {
        let mut v = serde_json::to_value(s).map_err(CliError::failed)?;
        v["mean_temperature_logged"] = serde_json::json!(if sink.temperature_rows.is_empty() {
            None
        } else {
            Some(sink.temperature_rows.iter().sum::<f64>() / sink.temperature_rows.len() as f64)
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "md {} | model {} | {} atoms | {} rank(s) | {} steps of {} fs (to step {})",
        s.ensemble, a.model, s.n_atoms, s.ranks, s.steps, a.dt, s.last_step
    );
    println!(
        "final: E_pot = {:.10} eV  E_kin = {:.10} eV  E_tot = {:.10} eV  conserved = {:.10} eV",
        s.potential_energy, s.kinetic_energy, s.total_energy, s.conserved
    );
    println!(
        "mean T = {:.2} K | {} rebuilds, {} migrated atoms | {:.3} s, {:.4} ns/day, {:.0} atom·steps/s",
        s.mean_temperature, s.rebuilds, s.migrated, s.wall_s, s.ns_per_day, s.atom_steps_per_s
    );
    Ok(())
}

/// Removes the progress bar from the terminal when the run ends, however
/// it ends (before the summary or an error is printed).
pub(crate) struct ClearOnDrop(pub(crate) indicatif::ProgressBar);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Runs `ddmlip md`.
pub fn md(a: MdArgs) -> Result<u8, CliError> {
    crate::device::gpus_need_cuda(a.device, a.gpus.as_ref())?;
    let prepared = prepare(&a)?;
    let stop = Arc::new(AtomicBool::new(false));
    // SIGINT sets the flag; the run stops after the current step with a
    // checkpoint (the handler only flips an atomic).
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))
        .map_err(|e| CliError::failed(anyhow!("cannot install the SIGINT handler: {e}")))?;
    let mut config = prepared.config.clone();
    config.stop = Some(stop);
    // Through the op engine on a GPU: the CPU run's path, its ops there.
    let mut device = a.device;
    let one_process = (a.backend == Backend::Mpi, a.gpus.is_some());
    if let Some((engine, _)) =
        crate::device::engine_device(a.device, a.engine_ops, &a.model, one_process)?
    {
        config.device = Some(engine);
        device = crate::device::Device::Cpu;
    }
    // The bar is for interactive runs; `--validate` reports its own way.
    let bar = (!a.validate)
        .then(|| crate::progress::step_bar(config.steps, "md"))
        .flatten();
    config.on_step = bar.as_ref().map(|(_, observer)| observer.clone());
    let clear = bar.map(|(bar, _)| ClearOnDrop(bar));
    if let crate::device::Device::Cuda(index) = device {
        crate::device::gpu_ranks_only("md", a.backend == Backend::Mpi, None)?;
        let ranks = a.ranks.unwrap_or(1);
        if a.validate {
            // One GPU rank against `ranks` ranks on the GPU(s).
            let p = &prepared;
            let mut run = |r: usize, config: &MdConfig, sink: &mut dyn MdSink| {
                let model = p.model.as_ref();
                let summary = if r == 1 {
                    let mut field =
                        crate::device::force_field(&a.model, a.modal.as_deref(), a.dtype, index)
                            .map_err(|e| MdError::Input(format!("{:#}", e.error)))?;
                    ddmlip_md::run_with_force_field(
                        model,
                        &p.topology,
                        &p.start,
                        config,
                        field.as_mut(),
                        sink,
                    )?
                } else {
                    let fields = crate::device::rank_force_fields(
                        &a.model,
                        a.modal.as_deref(),
                        a.dtype,
                        (index, a.gpus.as_ref()),
                        r,
                        p.topology.pbc,
                    )
                    .map_err(|e| MdError::Input(format!("{:#}", e.error)))?;
                    ddmlip_md::run_threads_with_fields(
                        model,
                        &p.topology,
                        &p.start,
                        config,
                        fields,
                        sink,
                    )?
                };
                drop(summary);
                Ok(())
            };
            return super::md_validate::validate_trajectory(
                &a.model,
                &mut run,
                &prepared.topology,
                &prepared.start,
                &config,
                ranks,
                a.validate_atol,
                a.json,
            );
        }
        let out = if ranks != 1 {
            let fields = crate::device::rank_force_fields(
                &a.model,
                a.modal.as_deref(),
                a.dtype,
                (index, a.gpus.as_ref()),
                ranks,
                prepared.topology.pbc,
            )?;
            let mut sink = FileSink::new(&a, &prepared)?;
            let out = ddmlip_md::run_threads_with_fields(
                prepared.model.as_ref(),
                &prepared.topology,
                &prepared.start,
                &config,
                fields,
                &mut sink,
            );
            (out, sink)
        } else {
            let mut field =
                crate::device::force_field(&a.model, a.modal.as_deref(), a.dtype, index)?;
            let mut sink = FileSink::new(&a, &prepared)?;
            let out = ddmlip_md::run_with_force_field(
                prepared.model.as_ref(),
                &prepared.topology,
                &prepared.start,
                &config,
                field.as_mut(),
                &mut sink,
            );
            (out, sink)
        };
        drop(clear);
        return finish(&a, out.0, &out.1);
    }
    if a.validate {
        let p = &prepared;
        let mut run = |ranks: usize, config: &MdConfig, sink: &mut dyn MdSink| {
            ddmlip_md::run_threads(p.model.as_ref(), &p.topology, &p.start, config, ranks, sink)
                .map(drop)
        };
        return super::md_validate::validate_trajectory(
            &a.model,
            &mut run,
            &prepared.topology,
            &prepared.start,
            &config,
            a.ranks.unwrap_or(1),
            a.validate_atol,
            a.json,
        );
    }
    match a.backend {
        Backend::Threads => {
            let ranks = a.ranks.unwrap_or(1);
            let mut sink = FileSink::new(&a, &prepared)?;
            let out = ddmlip_md::run_threads(
                prepared.model.as_ref(),
                &prepared.topology,
                &prepared.start,
                &config,
                ranks,
                &mut sink,
            );
            drop(clear);
            finish(&a, out, &sink)
        }
        Backend::Mpi => md_mpi(&a, &prepared, &config),
    }
}

fn finish(a: &MdArgs, out: Result<MdSummary, MdError>, sink: &FileSink) -> Result<u8, CliError> {
    match out {
        Ok(s) => {
            report(a, &s, sink)?;
            Ok(0)
        }
        Err(MdError::Interrupted { step }) => {
            eprintln!(
                "interrupted at step {step}: checkpoint written to {}",
                sink.checkpoint.display()
            );
            Ok(EXIT_INTERRUPTED)
        }
        Err(e @ MdError::Input(_)) => Err(CliError {
            status: EXIT_BAD_INPUT,
            error: e.into(),
        }),
        Err(e) => Err(CliError {
            status: EXIT_FAILED,
            error: e.into(),
        }),
    }
}

#[cfg(feature = "mpi")]
fn md_mpi(a: &MdArgs, p: &Prepared, config: &MdConfig) -> Result<u8, CliError> {
    use crate::mpi::SharedComm;
    use ddmlip_comm::{Communicator, DEFAULT_TIMEOUT};
    let comm = SharedComm::init(DEFAULT_TIMEOUT)?;
    let rank = comm.rank();
    let mut sink = if rank == 0 {
        Some(FileSink::new(a, p)?)
    } else {
        None
    };
    let out = ddmlip_md::run_rank(
        p.model.as_ref(),
        &p.topology,
        &p.start,
        config,
        Box::new(comm.handle()),
        sink.as_mut().map(|s| s as &mut dyn MdSink),
    );
    match (out, sink) {
        (Ok(Some(s)), Some(sink)) => finish(a, Ok(s), &sink),
        (Ok(_), _) => Ok(0),
        (Err(e), Some(sink)) => finish(a, Err(e), &sink),
        (Err(MdError::Interrupted { .. }), None) => Ok(EXIT_INTERRUPTED),
        (Err(e), None) => Err(md_error(e)),
    }
}

#[cfg(not(feature = "mpi"))]
fn md_mpi(_: &MdArgs, _: &Prepared, _: &MdConfig) -> Result<u8, CliError> {
    Err(CliError::input(anyhow!(
        "this ddmlip was built without MPI support; rebuild it with `cargo build --release --features mpi`, then launch `mpirun -n N ddmlip md --backend mpi ...`"
    )))
}

/// `--migration`: how rebuilds between repartitions move atoms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MigrationArg {
    /// Send atoms to their new owners and ghosts to neighbour ranks only.
    PointToPoint,
    /// Gather every position on every rank and partition with the same
    /// domains (the same bits, more traffic).
    Collective,
}
