//! `--device cpu|cuda[:N]`: where `eval` and `bench model` run. The CUDA
//! path (feature `cuda`) covers the models with GPU kernels, listed in
//! [`CUDA_MODELS`]; anything else is refused with exit status 2.

use crate::error::CliError;
use anyhow::anyhow;

/// Models with a CUDA path, for messages.
pub const CUDA_MODELS: &str = "lj (and Lennard-Jones model files, kind = \"lennard-jones\"), \
     the SevenNet checkpoints (sevennet-0, the other pretrained names, or a .pth file)";

/// The model `model_arg` names, when it has a CUDA path (`lj`, a
/// Lennard-Jones TOML file, a pretrained SevenNet name or a SevenNet
/// checkpoint file); exit 2 naming the models that have one otherwise.
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

/// Refuses `--device cuda` in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub fn no_cuda_build() -> CliError {
    CliError::input(anyhow!(
        "this ddmlip was built without CUDA support: rebuild with `cargo build --release -p \
         ddmlip-cli --features cuda`, or use --device cpu"
    ))
}

#[cfg(feature = "cuda")]
pub use gpu::{bench_model, eval, force_field};

/// Refuses `--device cuda` together with what runs on the CPU engine only:
/// `--ranks` > 1, `--backend mpi`, or `what_else` (a flag name) when set.
pub fn one_gpu_only(
    command: &str,
    ranks: Option<usize>,
    mpi: bool,
    what_else: Option<&str>,
) -> Result<(), CliError> {
    let refused = if ranks.is_some_and(|r| r > 1) {
        Some("--ranks > 1")
    } else if mpi {
        Some("--backend mpi")
    } else {
        what_else
    };
    match refused {
        Some(flag) => Err(CliError::input(anyhow!(
            "`{command} --device cuda` runs one rank on one GPU: {flag} is not supported with \
             it yet (use --device cpu)"
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
/// `eval --device cuda` in a build without CUDA: exit 2 (after the model check).
pub fn eval(a: &crate::args::EvalArgs, _index: usize) -> Result<u8, CliError> {
    cuda_model(&a.model)?;
    Err(no_cuda_build())
}

#[cfg(not(feature = "cuda"))]
/// `bench model --device cuda` in a build without CUDA: exit 2.
pub fn bench_model(
    model: &str,
    _system: impl FnOnce() -> Result<(ddmlip::System, String), CliError>,
    _dtype: crate::args::Precision,
    _repeats: usize,
    _json: bool,
    _index: usize,
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
    use ddmlip_cuda::{CudaDevice, CudaError, GpuModel, LjParameters, Precision};
    use ddmlip_models::ModelSource;
    use serde_json::json;

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

    /// `eval --device cuda:N`: every frame on the GPU, one after another.
    pub fn eval(a: &EvalArgs, index: usize) -> Result<u8, CliError> {
        if a.ranks.is_some_and(|r| r > 1) || a.spec.is_some() {
            return Err(CliError::input(anyhow!(
                "--device cuda runs one process on one GPU: --ranks > 1 and --spec are not \
                 supported with it yet"
            )));
        }
        let resolved = cuda_model(&a.model)?;
        let dev = open(index)?;
        let p = precision(a.dtype);
        let model = load(resolved, &dev, p, a.modal.as_deref())?;
        let mut frames = read_structure(&a.structure)?;
        let dtype = dtype_name(a.dtype);
        let mut results = Vec::with_capacity(frames.len());
        for (k, sys) in frames.iter().enumerate() {
            let r = model
                .evaluate(&dev, sys, p)
                .map_err(gpu_error)
                .map_err(|e| e.context_frame(k))?;
            results.push(r);
        }
        if let Some(out) = &a.output {
            for (sys, r) in frames.iter_mut().zip(&results) {
                sys.set_results(&ddmlip_atoms::Results {
                    energy: r.energy,
                    forces: &r.forces,
                    stress: r.stress,
                    energies: Some(&r.atomic_energies),
                });
            }
            ddmlip::write_structure(out, &frames)
                .map_err(|e| CliError::input(anyhow!("writing {}: {e}", out.display())))?;
        }
        let device = describe(&dev);
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
                "frames": results.iter().map(|r| json!({
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
            println!("model {} on {device}, {dtype}", a.model);
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
            if let Some(out) = &a.output {
                println!("wrote {}", out.display());
            }
        }
        Ok(0)
    }

    /// `bench model --device cuda:N`: median wall time of full GPU
    /// evaluations (neighbour list + model + copy back) after one warm-up,
    /// and (SevenNet) the device memory an evaluation holds.
    pub fn bench_model(
        model_arg: &str,
        system: impl FnOnce() -> Result<(ddmlip::System, String), CliError>,
        dtype: PrecisionArg,
        repeats: usize,
        json: bool,
        index: usize,
    ) -> Result<u8, CliError> {
        let resolved = cuda_model(model_arg)?;
        let dev = open(index)?;
        let p = precision(dtype);
        let model = load(resolved, &dev, p, None)?;
        let (sys, what) = system()?;
        let warm = model.evaluate(&dev, &sys, p).map_err(gpu_error)?;
        let mut runs = Vec::with_capacity(repeats);
        let mut peak = warm.peak_bytes;
        for _ in 0..repeats {
            let start = std::time::Instant::now();
            let r = model.evaluate(&dev, &sys, p).map_err(gpu_error)?;
            runs.push((start.elapsed().as_secs_f64(), r.timings));
            peak = peak.max(r.peak_bytes);
        }
        runs.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (median, timings) = runs[runs.len() / 2];
        let atoms = sys.positions.len();
        let us = median * 1e6 / atoms as f64;
        let device = describe(&dev);
        let dtype = dtype_name(dtype);
        if json {
            println!(
                "{}",
                json!({
                    "model": model_arg, "device": device, "dtype": dtype, "structure": what,
                    "atoms": atoms, "pairs": warm.n_pairs, "median_s": median,
                    "neighbors_s": timings.neighbors_s, "model_s": timings.model_s,
                    "us_per_atom_step": us, "warmup_s": warm.timings.neighbors_s + warm.timings.model_s,
                    "repeats": repeats, "peak_gpu_bytes": peak,
                })
            );
        } else {
            let memory = peak
                .map(|b| {
                    format!(
                        "\n  peak GPU memory {:.0} MiB ({:.1} KiB/atom)",
                        b as f64 / (1u64 << 20) as f64,
                        b as f64 / 1024.0 / atoms as f64
                    )
                })
                .unwrap_or_default();
            println!(
                "{model_arg} {dtype} on {device}: {what}, {atoms} atoms, {} pairs\n  median {:.3} ms per \
                 evaluation ({us:.4} µs/atom/step) of {}: neighbour list {:.3} ms, model + copy \
                 back {:.3} ms{memory}",
                warm.n_pairs,
                median * 1e3,
                repeats,
                timings.neighbors_s * 1e3,
                timings.model_s * 1e3
            );
        }
        Ok(0)
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
