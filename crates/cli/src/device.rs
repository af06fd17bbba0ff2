//! `--device cpu|cuda[:N]`: where `eval` and `bench model` run. The CUDA
//! path (feature `cuda`) covers the models with GPU kernels, listed in
//! [`CUDA_MODELS`]; anything else is refused with exit status 2.

use crate::error::CliError;
use anyhow::anyhow;

/// Models with a CUDA path, for messages.
pub const CUDA_MODELS: &str = "lj (and Lennard-Jones model files, kind = \"lennard-jones\"), \
     schnet-demo, the SevenNet checkpoints (sevennet-0, the other pretrained names, or a .pth file)";

/// The model `model_arg` names, when it has a CUDA path (`lj`, a
/// Lennard-Jones TOML file, `schnet-demo`, a pretrained SevenNet name or a
/// SevenNet checkpoint file); exit 2 naming the models that have one otherwise.
pub fn cuda_model(model_arg: &str) -> Result<ddmlip_models::ModelSource, CliError> {
    ddmlip_models::model_source(model_arg)
        .map_err(CliError::input)?
        .ok_or_else(|| {
            CliError::input(anyhow!(
                "model `{model_arg}` has no CUDA path yet; models with one: {CUDA_MODELS}. \
                 Use --device cpu for it"
            ))
        })
}

/// Where a command evaluates (`--device cpu|cuda[:N]`).
pub use ddmlip::Device;

/// The engine's device for `--device cuda:N`, when the model runs through
/// the op engine there: with `--engine-ops`, or for a model without CUDA
/// kernels of its own (`None`: the CPU, or the model's own CUDA path).
/// Returns the device and its description (`cuda:0 (NVIDIA H100, sm_90)`).
/// `(mpi, gpus)`: whether `--backend mpi` / `--gpus` were given, which the
/// op engine on a GPU does not support yet (exit 2 before opening it).
pub fn engine_device(
    device: Device,
    engine_ops: bool,
    model: &str,
    (mpi, gpus): (bool, bool),
) -> Result<Option<(ddmlip::EngineDevice, String)>, CliError> {
    match engine_gpu(device, engine_ops, model)? {
        Some(index) => {
            engine_one_process(mpi, gpus)?;
            open_engine_device(index).map(Some)
        }
        None => Ok(None),
    }
}

/// Refuses what the op engine on a GPU does not do yet: one MPI process
/// per rank (`mpi`) or ranks over several GPUs (`gpus`).
fn engine_one_process(mpi: bool, gpus: bool) -> Result<(), CliError> {
    if mpi || gpus {
        return Err(CliError::input(anyhow!(
            "the op engine on a GPU runs in one process, its ranks threads sharing the \
             `--device` GPU: --backend mpi and --gpus are not supported with it yet"
        )));
    }
    Ok(())
}

/// The GPU index when [`engine_device`] would open one, without opening it.
pub fn engine_gpu(
    device: Device,
    engine_ops: bool,
    model: &str,
) -> Result<Option<usize>, CliError> {
    let index = match device {
        Device::Cpu if engine_ops => {
            return Err(CliError::input(anyhow!(
                "--engine-ops puts the op engine's ops on a GPU: it needs --device cuda"
            )))
        }
        Device::Cpu => return Ok(None),
        Device::Cuda(index) => index,
    };
    let own_kernels = ddmlip_models::model_source(model)
        .map_err(CliError::input)?
        .is_some();
    Ok((engine_ops || !own_kernels).then_some(index))
}

/// Opens GPU `index` for the op engine (see [`engine_device`]).
#[cfg(feature = "cuda")]
fn open_engine_device(index: usize) -> Result<(ddmlip::EngineDevice, String), CliError> {
    let source = ddmlip_cuda::CudaEngineSource::open(index).map_err(|e| {
        if e.is_input() {
            CliError::input(e)
        } else {
            CliError::failed(e)
        }
    })?;
    let d = source.device();
    let described = format!(
        "cuda:{} ({}, {}, op engine: generic ops on the GPU)",
        d.index(),
        d.name(),
        d.arch()
    );
    Ok((ddmlip::EngineDevice(std::sync::Arc::new(source)), described))
}

/// `--device cuda` for the op engine in a build without CUDA: exit 2.
#[cfg(not(feature = "cuda"))]
fn open_engine_device(_index: usize) -> Result<(ddmlip::EngineDevice, String), CliError> {
    Err(no_cuda_build())
}

/// `--gpus`: the GPUs the ranks of a split GPU run go to, round-robin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuList {
    /// Every GPU of the machine, in index order.
    All,
    /// These device indices, in this order.
    Indices(Vec<usize>),
}

impl std::str::FromStr for GpuList {
    type Err = String;

    /// Parses `all` or a comma-separated list of device indices.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "all" {
            return Ok(Self::All);
        }
        let indices: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse()).collect();
        match indices {
            Ok(v) if !v.is_empty() => Ok(Self::Indices(v)),
            _ => Err(format!(
                "`{s}`: expected `all` or a comma-separated list of GPU indices (e.g. 0,1,2,3)"
            )),
        }
    }
}

/// The device indices of a GPU run: `--gpus` when given (`count` GPUs
/// for `all`), else the one `--device` GPU.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn gpu_indices(
    device_index: usize,
    gpus: Option<&GpuList>,
    count: impl FnOnce() -> usize,
) -> Vec<usize> {
    match gpus {
        None => vec![device_index],
        Some(GpuList::Indices(v)) => v.clone(),
        Some(GpuList::All) => (0..count().max(1)).collect(),
    }
}

/// Refuses `--gpus` without `--device cuda`.
pub fn gpus_need_cuda(device: Device, gpus: Option<&GpuList>) -> Result<(), CliError> {
    if gpus.is_some() && device == Device::Cpu {
        return Err(CliError::input(anyhow!(
            "--gpus places the ranks of a GPU run: it needs --device cuda"
        )));
    }
    Ok(())
}

/// Refuses `--device cuda` in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub fn no_cuda_build() -> CliError {
    CliError::input(anyhow!(
        "this ddmlip was built without CUDA support: rebuild with `cargo build --release -p \
         ddmlip-cli --features cuda`, or use --device cpu"
    ))
}

#[cfg(all(feature = "cuda", feature = "mpi"))]
pub use gpu::eval_mpi;
#[cfg(feature = "cuda")]
pub use gpu::{bench_model, eval, force_field, rank_force_fields, validate};

/// What `validate --device cuda` compares.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct GpuValidation<'a> {
    /// The model argument.
    pub model: &'a str,
    /// Fidelity of a multi-fidelity checkpoint.
    pub modal: Option<&'a str>,
    /// The structure file.
    pub structure: &'a std::path::Path,
    /// Ranks of the split run (at least 2).
    pub ranks: usize,
    /// Precision of both runs.
    pub dtype: crate::args::Precision,
    /// Absolute tolerance per output.
    pub atol: f64,
    /// Tolerance relative to the output's largest |reference| entry.
    pub rtol: f64,
    /// Print the report as JSON.
    pub json: bool,
    /// Deadline of every blocking exchange.
    pub timeout: std::time::Duration,
    /// The device index (the one-rank reference runs there).
    pub index: usize,
    /// `--gpus`: where the split run's ranks go.
    pub gpus: Option<&'a GpuList>,
}

#[cfg(not(feature = "cuda"))]
/// `validate --device cuda` in a build without CUDA: exit 2 (after the model check).
pub fn validate(v: &GpuValidation<'_>) -> Result<u8, CliError> {
    cuda_model(v.model)?;
    Err(no_cuda_build())
}

/// Refuses `--device cuda` together with what runs on the CPU engine only:
/// `--backend mpi`, or `what_else` (a flag name) when set. (`--ranks N`
/// puts N ranks on the one GPU.)
pub fn gpu_ranks_only(command: &str, mpi: bool, what_else: Option<&str>) -> Result<(), CliError> {
    let refused = if mpi {
        Some("--backend mpi")
    } else {
        what_else
    };
    match refused {
        Some(flag) => Err(CliError::input(anyhow!(
            "`{command} --device cuda` runs its ranks as threads sharing one GPU: {flag} is not \
             supported with it yet (use --device cpu)"
        ))),
        None => Ok(()),
    }
}

#[cfg(not(feature = "cuda"))]
/// `md|relax --device cuda` in a build without CUDA: exit 2 (after the
/// model check).
pub fn force_field(
    model: &str,
    _modal: Option<&str>,
    _dtype: crate::args::Precision,
    _index: usize,
) -> Result<Box<dyn ddmlip_md::SystemForceField>, CliError> {
    cuda_model(model)?;
    Err(no_cuda_build())
}

#[cfg(not(feature = "cuda"))]
/// `md|relax --device cuda --ranks N` in a build without CUDA: exit 2
/// (after the model check).
pub fn rank_force_fields(
    model: &str,
    _modal: Option<&str>,
    _dtype: crate::args::Precision,
    _gpus: (usize, Option<&GpuList>),
    _ranks: usize,
    _pbc: [bool; 3],
) -> Result<Vec<Box<dyn ddmlip_md::RankForceField>>, CliError> {
    cuda_model(model)?;
    Err(no_cuda_build())
}

#[cfg(not(feature = "cuda"))]
/// `eval --device cuda` in a build without CUDA: exit 2 (after the model check).
pub fn eval(a: &crate::args::EvalArgs, _index: usize) -> Result<u8, CliError> {
    cuda_model(&a.model)?;
    Err(no_cuda_build())
}

/// How `bench model --device cuda` times.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct GpuBench<'a> {
    /// Precision.
    pub dtype: crate::args::Precision,
    /// Timed evaluations per rank count (after one warm-up).
    pub repeats: usize,
    /// Rank counts to time (1: the whole system on one rank; more: ranks
    /// sharing the GPU).
    pub ranks: &'a [usize],
    /// One JSON object per rank count on stdout.
    pub json: bool,
    /// The device index.
    pub index: usize,
}

#[cfg(not(feature = "cuda"))]
/// `bench model --device cuda` in a build without CUDA: exit 2.
pub fn bench_model(
    model: &str,
    _system: impl FnOnce() -> Result<(ddmlip::System, String), CliError>,
    _bench: GpuBench<'_>,
) -> Result<u8, CliError> {
    cuda_model(model)?;
    Err(no_cuda_build())
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::cuda_model;
    use crate::args::{EvalArgs, Precision as PrecisionArg};
    use crate::error::CliError;
    use crate::input::read_structure;
    use anyhow::anyhow;
    use ddmlip_cuda::{
        evaluate_on_gpus, CudaDevice, CudaError, GpuModel, GpuOutput, GpuPlacement, GpuRankReport,
        LjParameters, Precision,
    };
    use ddmlip_models::ModelSource;
    use serde_json::json;

    /// How long a rank of a split GPU run waits for a peer before giving up.
    const RANK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

    fn precision(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F64 => Precision::F64,
            PrecisionArg::F32 => Precision::F32,
        }
    }

    fn dtype_name(p: PrecisionArg) -> &'static str {
        match p {
            PrecisionArg::F64 => "f64",
            PrecisionArg::F32 => "f32",
        }
    }

    fn open(index: usize) -> Result<CudaDevice, CliError> {
        CudaDevice::open(index).map_err(CliError::input)
    }

    /// `cuda:N (name, sm_XY, kernels compiled|cached)`.
    fn describe(dev: &CudaDevice) -> String {
        let kernels = match dev.kernel_source() {
            ddmlip_cuda::kernels::KernelSource::Cache => "kernels from the disk cache",
            ddmlip_cuda::kernels::KernelSource::Compiled => "kernels compiled by NVRTC",
        };
        format!(
            "cuda:{} ({}, {}, {kernels})",
            dev.index(),
            dev.name(),
            dev.arch()
        )
    }

    fn gpu_error(e: CudaError) -> CliError {
        if e.is_input() {
            CliError::input(e)
        } else {
            CliError::failed(e)
        }
    }

    /// Loads a resolved model on `dev`.
    fn load(
        model: ModelSource,
        dev: &CudaDevice,
        p: Precision,
        modal: Option<&str>,
    ) -> Result<GpuModel, CliError> {
        match model {
            ModelSource::LennardJones(lj) => {
                if let Some(m) = modal {
                    return Err(CliError::input(anyhow!(
                        "--modal {m} does not apply to a Lennard-Jones model (only multi-fidelity SevenNet checkpoints have modalities)"
                    )));
                }
                Ok(GpuModel::Lj(LjParameters {
                    epsilon: lj.epsilon,
                    sigma: lj.sigma,
                    cutoff: lj.cutoff,
                    shift: lj.shift,
                }))
            }
            ModelSource::SevenNetCheckpoint(path) => {
                GpuModel::sevennet(dev, &path, modal, p).map_err(gpu_error)
            }
            ModelSource::SchNet(weights) => {
                if let Some(m) = modal {
                    return Err(CliError::input(anyhow!(
                        "--modal {m} does not apply to schnet-demo (only multi-fidelity SevenNet checkpoints have modalities)"
                    )));
                }
                GpuModel::schnet(dev, &weights, p).map_err(gpu_error)
            }
        }
    }

    /// The GPUs of a run, each with the model loaded on it; the first is
    /// where one-rank evaluations run.
    struct Gpus {
        loaded: Vec<(CudaDevice, GpuModel)>,
    }

    impl Gpus {
        /// Opens the GPUs `--device`/`--gpus` name and loads the model on each.
        fn open(
            model: &str,
            modal: Option<&str>,
            p: Precision,
            index: usize,
            list: Option<&super::GpuList>,
        ) -> Result<Self, CliError> {
            let resolved = cuda_model(model)?;
            let count = || ddmlip_cuda::device_count().unwrap_or(1);
            let mut loaded = Vec::new();
            for i in super::gpu_indices(index, list, count) {
                let dev = open(i)?;
                let m = load(resolved.clone(), &dev, p, modal)?;
                // The weights were uploaded on this stream; ranks' streams read them.
                dev.synchronize().map_err(gpu_error)?;
                loaded.push((dev, m));
            }
            Ok(Self { loaded })
        }

        fn first(&self) -> (&CudaDevice, &GpuModel) {
            let (d, m) = &self.loaded[0];
            (d, m)
        }

        fn placements(&self) -> Vec<GpuPlacement<'_>> {
            self.loaded
                .iter()
                .map(|(device, model)| GpuPlacement { device, model })
                .collect()
        }

        /// `cuda:0 (…)`, or every GPU's description joined.
        fn describe(&self) -> String {
            let all: Vec<String> = self.loaded.iter().map(|(d, _)| describe(d)).collect();
            all.join(", ")
        }

        /// One evaluation of `sys`: the first GPU for one rank, else
        /// `ranks` ranks over the GPUs round-robin (with their reports).
        fn evaluate(
            &self,
            sys: &ddmlip::System,
            p: Precision,
            ranks: usize,
            timeout: std::time::Duration,
        ) -> Result<(GpuOutput, Option<Vec<GpuRankReport>>), CudaError> {
            if ranks > 1 || self.loaded.len() > 1 {
                evaluate_on_gpus(&self.placements(), sys, p, ranks, timeout)
                    .map(|d| (d.output, Some(d.ranks)))
            } else {
                let (dev, model) = self.first();
                model.evaluate(dev, sys, p).map(|o| (o, None))
            }
        }
    }

    /// A GPU model as the MD driver's whole-system force field.
    struct GpuForceField {
        dev: CudaDevice,
        model: GpuModel,
        precision: Precision,
        /// The system handed to the model, its memory reused every step.
        system: ddmlip::System,
    }

    impl ddmlip_md::SystemForceField for GpuForceField {
        fn evaluate(
            &mut self,
            positions: &[[f64; 3]],
            numbers: &[u32],
            cell: &ddmlip_atoms::Cell,
            pbc: [bool; 3],
            forces: &mut [[f64; 3]],
        ) -> Result<ddmlip_md::SystemEnergy, ddmlip_md::MdError> {
            use ddmlip_md::MdError;
            let sys = &mut self.system;
            sys.positions.clear();
            sys.positions.extend_from_slice(positions);
            sys.numbers.clear();
            sys.numbers.extend_from_slice(numbers);
            sys.cell = pbc.iter().any(|&p| p).then_some(*cell);
            sys.pbc = pbc;
            let out = self
                .model
                .evaluate(&self.dev, sys, self.precision)
                .map_err(|e| {
                    if e.is_input() {
                        MdError::Input(e.to_string())
                    } else {
                        MdError::ForceField(e.to_string())
                    }
                })?;
            if out.forces.len() != forces.len() {
                return Err(MdError::Internal(format!(
                    "the GPU returned {} forces for {} atoms",
                    out.forces.len(),
                    forces.len()
                )));
            }
            forces.copy_from_slice(&out.forces);
            let strain_gradient = match out.stress {
                Some(stress) => ddmlip_md::strain_gradient_of_stress(&stress, cell.volume()),
                None => [0.0; 9],
            };
            Ok(ddmlip_md::SystemEnergy {
                energy: out.energy,
                strain_gradient,
                pairs: out.n_pairs,
            })
        }
    }

    /// The GPU force field `md` and `relax` use with `--device cuda:N`.
    pub fn force_field(
        model: &str,
        modal: Option<&str>,
        dtype: PrecisionArg,
        index: usize,
    ) -> Result<Box<dyn ddmlip_md::SystemForceField>, CliError> {
        let resolved = cuda_model(model)?;
        let dev = open(index)?;
        let p = precision(dtype);
        let model = load(resolved, &dev, p, modal)?;
        eprintln!("forces from {}", describe(&dev));
        Ok(Box::new(GpuForceField {
            dev,
            model,
            precision: p,
            system: ddmlip::System::default(),
        }))
    }

    /// One rank's rows on a GPU that several ranks share: the rank's own
    /// stream, the model's weights shared.
    struct GpuRankField {
        dev: CudaDevice,
        model: std::sync::Arc<GpuModel>,
        precision: Precision,
        /// Whether the system has a periodic axis (∂E/∂ε is zero otherwise).
        periodic: bool,
        /// The rank's rows as a cluster, its memory reused every step.
        local: ddmlip::System,
    }

    fn md_error(e: CudaError) -> ddmlip_md::MdError {
        use ddmlip_md::MdError;
        match e {
            // A peer's failure only echoes the failing rank's own error.
            CudaError::Comm { .. } => MdError::Comm(e.to_string()),
            e if e.is_input() => MdError::Input(e.to_string()),
            e => MdError::ForceField(e.to_string()),
        }
    }

    impl ddmlip_md::RankForceField for GpuRankField {
        fn evaluate(
            &mut self,
            rows: &ddmlip_md::LocalRows<'_>,
            halo: &mut dyn ddmlip_engine::Distributor,
            forces: &mut [[f64; 3]],
        ) -> Result<ddmlip_md::SystemEnergy, ddmlip_md::MdError> {
            let local = &mut self.local;
            local.positions.clear();
            local.positions.extend_from_slice(rows.positions);
            local.numbers.clear();
            local.numbers.extend_from_slice(rows.numbers);
            let out = self
                .model
                .evaluate_rank(&self.dev, local, self.precision, rows.n_owned, halo)
                .map_err(md_error)?;
            if out.forces.len() != forces.len() {
                return Err(ddmlip_md::MdError::Internal(format!(
                    "the GPU returned {} forces for {} owned atoms",
                    out.forces.len(),
                    forces.len()
                )));
            }
            forces.copy_from_slice(&out.forces);
            let strain_gradient = if self.periodic {
                ddmlip_md::strain_gradient_of_stress(&out.virial, 1.0)
            } else {
                [0.0; 9]
            };
            Ok(ddmlip_md::SystemEnergy {
                energy: out.energy,
                strain_gradient,
                pairs: out.n_pairs,
            })
        }
    }

    /// The force fields of `ranks` ranks on the GPUs `--device`/`--gpus`
    /// name, round-robin (`md|relax --device cuda --ranks R`): the model
    /// loaded once per GPU, a stream per rank.
    pub fn rank_force_fields(
        model: &str,
        modal: Option<&str>,
        dtype: PrecisionArg,
        (index, gpus): (usize, Option<&super::GpuList>),
        ranks: usize,
        pbc: [bool; 3],
    ) -> Result<Vec<Box<dyn ddmlip_md::RankForceField>>, CliError> {
        let p = precision(dtype);
        let loaded = Gpus::open(model, modal, p, index, gpus)?;
        eprintln!("forces from {}, {ranks} ranks", loaded.describe());
        let shared: Vec<(CudaDevice, std::sync::Arc<GpuModel>)> = loaded
            .loaded
            .into_iter()
            .map(|(d, m)| (d, std::sync::Arc::new(m)))
            .collect();
        (0..ranks)
            .map(|r| {
                let (dev, model) = &shared[r % shared.len()];
                let field = GpuRankField {
                    dev: dev.fork().map_err(gpu_error)?,
                    model: std::sync::Arc::clone(model),
                    precision: p,
                    periodic: pbc.iter().any(|&x| x),
                    local: ddmlip::System::default(),
                };
                Ok(Box::new(field) as Box<dyn ddmlip_md::RankForceField>)
            })
            .collect()
    }

    /// `eval --device cuda:N [--ranks R]`: every frame on the GPU, one
    /// after another; with `--ranks R > 1` each frame split over R ranks
    /// sharing the GPU.
    pub fn eval(a: &EvalArgs, index: usize) -> Result<u8, CliError> {
        let ranks = a.ranks.unwrap_or(1);
        if ranks == 0 {
            return Err(CliError::input(anyhow!("--ranks must be at least 1")));
        }
        let p = precision(a.dtype);
        let gpus = Gpus::open(&a.model, a.modal.as_deref(), p, index, a.gpus.as_ref())?;
        let mut frames = read_structure(&a.structure)?;
        let mut results = Vec::with_capacity(frames.len());
        let mut rank_reports = Vec::with_capacity(frames.len());
        for (k, sys) in frames.iter().enumerate() {
            let (r, reports) = gpus
                .evaluate(sys, p, ranks, RANK_TIMEOUT)
                .map_err(gpu_error)
                .map_err(|e| e.context_frame(k))?;
            results.push(r);
            rank_reports.extend(reports);
        }
        report_eval(
            a,
            &gpus.describe(),
            ranks,
            &mut frames,
            &results,
            &rank_reports,
        )
    }

    /// `eval --backend mpi --device cuda`: this process's rank of an MPI
    /// job, one GPU per process, round-robin by rank over `--gpus`
    /// (default: every GPU of the machine). Every process reads the input
    /// and loads the model on its GPU; all agree that they could before
    /// the first exchange. Rank 0 prints and writes.
    #[cfg(feature = "mpi")]
    pub fn eval_mpi(a: &EvalArgs, index: usize) -> Result<u8, CliError> {
        use crate::mpi::{abort, agree_on_input, SharedComm};
        use ddmlip_comm::{Communicator, DEFAULT_TIMEOUT};
        let comm = SharedComm::init(DEFAULT_TIMEOUT)?;
        let (rank, size) = (comm.rank(), comm.size());
        let p = precision(a.dtype);
        let verdict = (|| {
            let frames = read_structure(&a.structure)?;
            let resolved = cuda_model(&a.model)?;
            let list = a.gpus.clone().unwrap_or(super::GpuList::All);
            let count = || ddmlip_cuda::device_count().unwrap_or(1);
            let indices = super::gpu_indices(index, Some(&list), count);
            let dev = open(indices[rank % indices.len()])?;
            let model = load(resolved, &dev, p, a.modal.as_deref())?;
            Ok::<_, CliError>((frames, dev, model))
        })();
        if let Err(status) = agree_on_input(&comm, &verdict) {
            return Ok(status);
        }
        let Ok((mut frames, dev, model)) = verdict else {
            return Err(abort(&comm, "inconsistent input verdict".into()));
        };
        let gpu = GpuPlacement {
            device: &dev,
            model: &model,
        };
        let (mut results, mut rank_reports) = (Vec::new(), Vec::new());
        for (k, sys) in frames.iter().enumerate() {
            match ddmlip_cuda::evaluate_on_communicator(gpu, sys, p, Box::new(comm.handle())) {
                Ok(Some(d)) => {
                    results.push(d.output);
                    rank_reports.push(d.ranks);
                }
                Ok(None) => {}
                Err(e) => return Err(abort(&comm, format!("frame {k}: {e}"))),
            }
        }
        let device = format!("{} (rank 0 of {size} MPI processes)", describe(&dev));
        // Finalise MPI before rank 0 writes: the other ranks are done.
        drop(comm);
        if rank != 0 {
            return Ok(0);
        }
        report_eval(a, &device, size, &mut frames, &results, &rank_reports)
    }

    /// Writes `--output` and prints what `eval` on the GPU found.
    fn report_eval(
        a: &EvalArgs,
        device: &str,
        ranks: usize,
        frames: &mut [ddmlip::System],
        results: &[GpuOutput],
        rank_reports: &[Vec<GpuRankReport>],
    ) -> Result<u8, CliError> {
        let dtype = dtype_name(a.dtype);
        if let Some(out) = &a.output {
            for (sys, r) in frames.iter_mut().zip(results) {
                sys.set_results(&ddmlip_atoms::Results {
                    energy: r.energy,
                    forces: &r.forces,
                    stress: r.stress,
                    energies: Some(&r.atomic_energies),
                });
            }
            ddmlip::write_structure(out, frames)
                .map_err(|e| CliError::input(anyhow!("writing {}: {e}", out.display())))?;
        }
        if a.json {
            let value = json!({
                "model": a.model,
                "device": device,
                "dtype": dtype,
                "units": {"energy": "eV", "forces": "eV/Å", "stress": "eV/Å³ (ASE sign, Voigt xx yy zz yz xz xy)", "atomic_energies": "eV"},
                "energy": results.iter().map(|r| r.energy).collect::<Vec<_>>(),
                "forces": results.iter().flat_map(|r| r.forces.iter().copied()).collect::<Vec<_>>(),
                "stress": results.iter().map(|r| r.stress).collect::<Vec<_>>(),
                "atomic_energies": results.iter().flat_map(|r| r.atomic_energies.iter().copied()).collect::<Vec<_>>(),
                "ranks": ranks,
                "frames": results.iter().enumerate().map(|(k, r)| json!({
                    "ranks": rank_reports.get(k).map(|rs| rank_json(rs)),
                    "atoms": r.forces.len(),
                    "pairs": r.n_pairs,
                    "energy": r.energy,
                    "stress": r.stress,
                    "neighbors_s": r.timings.neighbors_s,
                    "model_s": r.timings.model_s,
                    "peak_gpu_bytes": r.peak_bytes,
                })).collect::<Vec<_>>(),
            });
            println!("{value}");
        } else {
            let split = if ranks > 1 {
                format!(", {ranks} ranks sharing the GPU")
            } else {
                String::new()
            };
            println!("model {} on {device}, {dtype}{split}", a.model);
            for (k, r) in results.iter().enumerate() {
                let fmax = r
                    .forces
                    .iter()
                    .map(|f| (f[0] * f[0] + f[1] * f[1] + f[2] * f[2]).sqrt())
                    .fold(0.0, f64::max);
                println!(
                    "frame {k}: {} atoms, {} pairs, energy {:.10} eV, max |F| {:.6} eV/Å{}",
                    r.forces.len(),
                    r.n_pairs,
                    r.energy,
                    fmax,
                    r.stress
                        .map(|s| {
                            let parts: Vec<String> = s.iter().map(|x| format!("{x:.6e}")).collect();
                            format!(", stress [{}] eV/Å³", parts.join(", "))
                        })
                        .unwrap_or_default()
                );
            }
            for (k, rs) in rank_reports.iter().enumerate() {
                for x in rs {
                    println!(
                        "  frame {k} rank {} on cuda:{}: {} owned, {} ghosts, {} pairs, {:.3} s \
                         ({:.3} s exchanging)",
                        x.rank, x.device, x.owned, x.ghosts, x.pairs, x.seconds, x.comm_seconds
                    );
                }
            }
            if let Some(out) = &a.output {
                println!("wrote {}", out.display());
            }
        }
        Ok(0)
    }

    /// `bench model --device cuda:N [--ranks R,...]`: per rank count, the
    /// median wall time of full GPU evaluations (neighbour list + model +
    /// copy back; with R > 1 ranks sharing the GPU, exchanges included)
    /// after one warm-up, and (SevenNet, one rank) the device memory an
    /// evaluation holds.
    pub fn bench_model(
        model_arg: &str,
        system: impl FnOnce() -> Result<(ddmlip::System, String), CliError>,
        b: super::GpuBench<'_>,
    ) -> Result<u8, CliError> {
        let resolved = cuda_model(model_arg)?;
        let dev = open(b.index)?;
        let p = precision(b.dtype);
        let model = load(resolved, &dev, p, None)?;
        let (sys, what) = system()?;
        let device = describe(&dev);
        let dtype = dtype_name(b.dtype);
        let atoms = sys.positions.len();
        // The evaluation, and for a split its slowest rank's wall time and
        // that rank's time in exchanges (s).
        let once = |ranks: usize| {
            if ranks > 1 {
                let gpu = GpuPlacement {
                    device: &dev,
                    model: &model,
                };
                evaluate_on_gpus(&[gpu], &sys, p, ranks, RANK_TIMEOUT).map(|d| {
                    let slowest = d
                        .ranks
                        .iter()
                        .max_by(|x, y| x.seconds.total_cmp(&y.seconds))
                        .map(|x| (x.seconds, x.comm_seconds));
                    (d.output, slowest)
                })
            } else {
                model.evaluate(&dev, &sys, p).map(|r| (r, None))
            }
            .map_err(gpu_error)
        };
        for &ranks in b.ranks {
            let (warm, _) = once(ranks)?;
            let mut runs = Vec::with_capacity(b.repeats);
            let mut peak = warm.peak_bytes;
            for _ in 0..b.repeats {
                let start = std::time::Instant::now();
                let (r, slowest) = once(ranks)?;
                runs.push((start.elapsed().as_secs_f64(), r.timings, slowest));
                peak = peak.max(r.peak_bytes);
            }
            // Ranks measure the driver's free memory while others allocate.
            if ranks > 1 {
                peak = None;
            }
            runs.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (median, timings, slowest) = runs[runs.len() / 2];
            let us = median * 1e6 / atoms as f64;
            if b.json {
                println!(
                    "{}",
                    json!({
                        "model": model_arg, "device": device, "dtype": dtype, "structure": what,
                        "atoms": atoms, "pairs": warm.n_pairs, "ranks": ranks, "median_s": median,
                        "neighbors_s": timings.neighbors_s, "model_s": timings.model_s,
                        "us_per_atom_step": us,
                        "warmup_s": warm.timings.neighbors_s + warm.timings.model_s,
                        "repeats": b.repeats, "peak_gpu_bytes": peak,
                        "slowest_rank_s": slowest.map(|x| x.0),
                        "slowest_rank_exchange_s": slowest.map(|x| x.1),
                    })
                );
            } else {
                let memory = peak
                    .map(|bytes| {
                        format!(
                            "\n  peak GPU memory {:.0} MiB ({:.1} KiB/atom)",
                            bytes as f64 / (1u64 << 20) as f64,
                            bytes as f64 / 1024.0 / atoms as f64
                        )
                    })
                    .unwrap_or_default();
                let split = if ranks > 1 {
                    format!(", {ranks} ranks sharing the GPU")
                } else {
                    String::new()
                };
                // Where a split's time goes: the slowest rank (its exchanges
                // included) and what runs outside the ranks (partition,
                // ghost images, assembly).
                let ranks_line = slowest
                    .map(|(rank_s, exchange_s)| {
                        format!(
                            "\n  slowest rank {:.3} ms, of which exchanging {:.3} ms; outside \
                             the ranks {:.3} ms",
                            rank_s * 1e3,
                            exchange_s * 1e3,
                            (median - rank_s).max(0.0) * 1e3
                        )
                    })
                    .unwrap_or_default();
                println!(
                    "{model_arg} {dtype} on {device}{split}: {what}, {atoms} atoms, {} pairs\n  \
                     median {:.3} ms per evaluation ({us:.4} µs/atom/step) of {}: neighbour \
                     list {:.3} ms, model + copy back {:.3} ms{ranks_line}{memory}",
                    warm.n_pairs,
                    median * 1e3,
                    b.repeats,
                    timings.neighbors_s * 1e3,
                    timings.model_s * 1e3
                );
            }
        }
        Ok(0)
    }

    /// `validate --device cuda:N`: every frame on one GPU rank, then split
    /// over `ranks` ranks sharing the GPU; energy, forces, stress and
    /// per-atom energies compared per output. Exit 0 when all pass, 1 when
    /// one does not.
    pub fn validate(v: &super::GpuValidation<'_>) -> Result<u8, CliError> {
        use ddmlip_validate::{deviation, Deviation};
        let p = precision(v.dtype);
        let gpus = Gpus::open(v.model, v.modal, p, v.index, v.gpus)?;
        let (dev, model) = gpus.first();
        let frames = read_structure(v.structure)?;
        let mut reference = Vec::with_capacity(frames.len());
        let mut split = Vec::with_capacity(frames.len());
        for (k, sys) in frames.iter().enumerate() {
            let one = model
                .evaluate(dev, sys, p)
                .map_err(gpu_error)
                .map_err(|e| e.context_frame(k))?;
            let many = evaluate_on_gpus(&gpus.placements(), sys, p, v.ranks, v.timeout)
                .map_err(gpu_error)
                .map_err(|e| e.context_frame(k))?;
            reference.push(one);
            split.push(many);
        }
        let nan6 = [f64::NAN; 6];
        let outputs: Vec<(&str, &str, Deviation)> = {
            // One output of every frame, flattened, in both runs.
            let pick = |what: &dyn Fn(&ddmlip_cuda::GpuOutput) -> Vec<f64>| {
                let one: Vec<f64> = reference.iter().flat_map(what).collect();
                let many: Vec<f64> = split.iter().flat_map(|d| what(&d.output)).collect();
                deviation(&one, &many)
            };
            vec![
                ("energy", "eV", pick(&|r| vec![r.energy])),
                (
                    "forces",
                    "eV/Å",
                    pick(&|r| r.forces.iter().flatten().copied().collect()),
                ),
                (
                    "stress",
                    "eV/Å³",
                    pick(&|r| r.stress.unwrap_or(nan6).to_vec()),
                ),
                (
                    "atomic_energies",
                    "eV",
                    pick(&|r| r.atomic_energies.clone()),
                ),
            ]
        };
        let ok = outputs.iter().all(|(_, _, d)| d.within(v.atol, v.rtol));
        let device = gpus.describe();
        let dtype = dtype_name(v.dtype);
        if v.json {
            let value = json!({
                "model": v.model,
                "device": device,
                "dtype": dtype,
                "ranks": v.ranks,
                "atol": v.atol,
                "rtol": v.rtol,
                "ok": ok,
                "outputs": outputs.iter().map(|(name, _, d)| ((*name).to_string(), json!({
                    "max_abs": d.abs, "max_rel": d.rel, "ratio": d.ratio,
                    "passed": d.within(v.atol, v.rtol),
                }))).collect::<serde_json::Map<_, _>>(),
                "frames": split.iter().map(|d| json!({
                    "atoms": d.output.forces.len(),
                    "ranks": rank_json(&d.ranks),
                })).collect::<Vec<_>>(),
            });
            println!("{value}");
        } else {
            println!(
                "validate {} on {device}, {dtype}: {} frame(s), one GPU rank against {} ranks",
                v.model,
                frames.len(),
                v.ranks
            );
            for (k, d) in split.iter().enumerate() {
                let owned: Vec<String> = d.ranks.iter().map(|x| x.owned.to_string()).collect();
                let ghosts: Vec<String> = d.ranks.iter().map(|x| x.ghosts.to_string()).collect();
                println!(
                    "frame {k}: {} atoms; ranks own {} and hold {} ghosts",
                    d.output.forces.len(),
                    owned.join("/"),
                    ghosts.join("/")
                );
            }
            for (name, unit, d) in &outputs {
                println!(
                    "  {name:<16} max |Δ| {:.3e} {unit:<6} relative {:.3e}  {}",
                    d.abs,
                    d.rel,
                    if d.within(v.atol, v.rtol) {
                        "passed"
                    } else {
                        "FAILED"
                    }
                );
            }
            println!(
                "{}: the {}-rank split {} the one-rank answer (atol {:e}, rtol {:e})",
                if ok { "PASSED" } else { "FAILED" },
                v.ranks,
                if ok { "gives" } else { "does not give" },
                v.atol,
                v.rtol
            );
        }
        Ok(if ok { 0 } else { crate::error::EXIT_FAILED })
    }

    /// Per-rank reports as JSON.
    fn rank_json(ranks: &[GpuRankReport]) -> Vec<serde_json::Value> {
        ranks
            .iter()
            .map(|x| {
                json!({
                    "rank": x.rank, "device": x.device, "owned": x.owned, "ghosts": x.ghosts,
                    "pairs": x.pairs, "seconds": x.seconds, "comm_seconds": x.comm_seconds,
                })
            })
            .collect()
    }

    trait FrameContext {
        fn context_frame(self, k: usize) -> Self;
    }

    impl FrameContext for CliError {
        fn context_frame(self, k: usize) -> Self {
            CliError {
                status: self.status,
                error: self.error.context(format!("frame {k}")),
            }
        }
    }
}
