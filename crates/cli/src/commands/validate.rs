//! `ddmlip validate`: does the model give the single-process answer split
//! over ranks, and if not, which spec fixes it. Thin wrapper over
//! `ddmlip_validate::trace_and_validate` (threads backend) and
//! `ddmlip_validate::trace_and_validate_with` (one MPI process per rank).
use crate::args::Backend;
use crate::error::CliError;
use crate::input::{load_model, read_structure};
use anyhow::{anyhow, Context};
use clap::Args;
use ddmlip_atoms::System;
use ddmlip_engine::Model;
use ddmlip_validate::{trace_and_validate, TraceReport, ValidateError, ValidateOptions};
use std::path::PathBuf;
use std::time::Duration;

/// Ranks of the threads backend when `--ranks` is not given.
const DEFAULT_RANKS: usize = 4;

#[derive(Args)]
pub struct ValidateArgs {
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
    /// Ranks of the decomposed run (threads) [default: 4]. Under
    /// `--backend mpi` the rank count is the MPI job's size instead.
    #[arg(long)]
    ranks: Option<usize>,
    /// Communication backend of the decomposed runs: threads of this process,
    /// or one MPI process per rank (`mpirun -n N ddmlip validate --backend mpi ...`).
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    /// Prior spec (JSON), kept verbatim as the first candidate; default: the model's own.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Precision of both runs.
    #[arg(long, value_enum, default_value_t = crate::args::Precision::F64)]
    dtype: crate::args::Precision,
    /// Absolute tolerance per output [default: 1e-8 with f64, 1e-4 with f32].
    #[arg(long, allow_negative_numbers = true)]
    atol: Option<f64>,
    /// Relative tolerance per output, relative to the output's largest
    /// |reference| entry [default: 1e-10 with f64, 1e-5 with f32].
    #[arg(long, allow_negative_numbers = true)]
    rtol: Option<f64>,
    /// Report the first spec's verdict without trying fixes.
    #[arg(long)]
    no_autofix: bool,
    /// Most specs to try, the first included.
    #[arg(long, default_value_t = 8)]
    max_attempts: usize,
    /// Write the working (or best) spec to this file.
    #[arg(long)]
    spec_out: Option<PathBuf>,
    /// Print only the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Deadline (s) of every blocking communication call.
    #[arg(long, default_value_t = 120.0, allow_negative_numbers = true)]
    timeout: f64,
    /// Where both runs evaluate: cpu, or cuda[:N] (build with --features
    /// cuda). Models with CUDA kernels of their own (lj, schnet-demo,
    /// SevenNet): the reference is the one-rank GPU run and the split run
    /// puts `--ranks` ranks on the same GPU, split as those models always
    /// split (no spec to infer). Any other model (or any with
    /// --engine-ops): the CPU's validation with both runs' ops on the GPU.
    #[arg(long, default_value = "cpu")]
    device: crate::device::Device,
    /// GPUs of the ranks with `--device cuda` and `--ranks N`, round-robin:
    /// a list (`0,1,2,3`) or `all` (every GPU this machine has); default:
    /// every rank on the `--device` GPU.
    #[arg(long)]
    gpus: Option<crate::device::GpuList>,
    /// With `--device cuda`: run the model through the op engine, its
    /// generic ops on the GPU (any model; what models without CUDA kernels
    /// of their own always do): the trace, spec inference and auto-fix of
    /// the CPU, with both runs' ops on the GPU.
    #[arg(long)]
    engine_ops: bool,
}

/// Everything a validation needs, read and checked.
struct Prepared {
    model: Box<dyn Model>,
    frames: Vec<System>,
    options: ValidateOptions,
}

/// Reads the model, structure and prior spec; `ranks` is the decomposed
/// runs' rank count.
fn prepare(a: &ValidateArgs, ranks: usize) -> Result<Prepared, CliError> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(CliError::input(anyhow!(
            "--timeout must be a positive number of seconds, got {}",
            a.timeout
        )));
    }
    let prior = a
        .spec
        .as_ref()
        .map(|p| ddmlip_spec::MLIPSpec::load(p).map_err(CliError::input))
        .transpose()?;
    let model = load_model(&a.model, a.modal.as_deref())?;
    let frames = read_structure(&a.structure)?;
    let defaults = ValidateOptions::for_dtype(a.dtype.into());
    let options = ValidateOptions {
        ranks,
        atol: a.atol.unwrap_or(defaults.atol),
        rtol: a.rtol.unwrap_or(defaults.rtol),
        prior,
        autofix: !a.no_autofix,
        max_attempts: a.max_attempts,
        timeout: Duration::from_secs_f64(a.timeout),
        ..defaults
    };
    Ok(Prepared {
        model,
        frames,
        options,
    })
}

/// Every validate error is about the user's input or options (exit status 2).
fn validate_error(e: ValidateError) -> CliError {
    CliError::input(e)
}

/// Writes `--spec-out`, prints the report; returns the exit status.
fn finish(a: &ValidateArgs, report: &TraceReport) -> Result<u8, CliError> {
    if let Some(out) = &a.spec_out {
        std::fs::write(out, report.spec.to_json() + "\n")
            .with_context(|| format!("writing {}", out.display()))
            .map_err(CliError::input)?;
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
        match &a.spec_out {
            Some(out) => println!(
                "wrote {} (with what it was validated for: {}, {} rank(s), {})",
                out.display(),
                report.model,
                report.ranks,
                if report.ok { "passed" } else { "FAILED" }
            ),
            None => println!(
                "(--spec-out FILE saves report.spec with what it was validated for; `ddmlip \
                 eval --spec FILE` then knows it is validated)"
            ),
        }
    }
    Ok(if report.ok {
        0
    } else {
        crate::error::EXIT_FAILED
    })
}

/// Runs the validation; exit status 0 pass, 1 fail (2 comes back as an error).
pub fn run(a: ValidateArgs) -> Result<u8, CliError> {
    crate::device::gpus_need_cuda(a.device, a.gpus.as_ref())?;
    let one_process = (a.backend == Backend::Mpi, a.gpus.is_some());
    let engine = crate::device::engine_device(a.device, a.engine_ops, &a.model, one_process)?;
    if let (crate::device::Device::Cuda(index), None) = (a.device, &engine) {
        return validate_gpu(&a, index);
    }
    if a.backend == Backend::Mpi {
        return validate_mpi(a);
    }
    let mut p = prepare(&a, a.ranks.unwrap_or(DEFAULT_RANKS))?;
    if let Some((device, described)) = engine {
        p.options.device = Some(device);
        if !a.json {
            println!("device: {described}");
        }
    }
    let report = trace_and_validate(p.model.as_ref(), &p.frames, &p.options).map_err(|e| {
        let mut e = validate_error(e);
        e.error = e.error.context(a.structure.display().to_string());
        e
    })?;
    finish(&a, &report)
}

/// `validate --device cuda:N`: one GPU against `--ranks` ranks sharing it.
fn validate_gpu(a: &ValidateArgs, index: usize) -> Result<u8, CliError> {
    let refused = if a.backend == Backend::Mpi {
        Some("--backend mpi (the ranks are threads sharing the GPU)")
    } else if a.spec.is_some() {
        Some("--spec")
    } else if a.spec_out.is_some() {
        Some("--spec-out")
    } else {
        None
    };
    if let Some(flag) = refused {
        return Err(CliError::input(anyhow!(
            "`validate --device cuda` checks the GPU models' own split (ghost node features \
             refreshed after every interaction block), with no spec to infer: {flag} does not \
             apply to it"
        )));
    }
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(CliError::input(anyhow!(
            "--timeout must be a positive number of seconds, got {}",
            a.timeout
        )));
    }
    let ranks = a.ranks.unwrap_or(DEFAULT_RANKS);
    if ranks < 2 {
        return Err(CliError::input(anyhow!(
            "--ranks must be at least 2 to compare a split run with the one-rank run, got {ranks}"
        )));
    }
    let defaults = ValidateOptions::for_dtype(a.dtype.into());
    crate::device::validate(&crate::device::GpuValidation {
        model: &a.model,
        modal: a.modal.as_deref(),
        structure: &a.structure,
        ranks,
        dtype: a.dtype,
        atol: a.atol.unwrap_or(defaults.atol),
        rtol: a.rtol.unwrap_or(defaults.rtol),
        json: a.json,
        timeout: Duration::from_secs_f64(a.timeout),
        index,
        gpus: a.gpus.as_ref(),
    })
}

/// `validate --backend mpi`: this process's rank of an MPI job. Without the
/// `mpi` cargo feature this is a usage error (status 2).
fn validate_mpi(a: ValidateArgs) -> Result<u8, CliError> {
    #[cfg(feature = "mpi")]
    {
        with_mpi::validate(a)
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = a;
        Err(CliError::input(anyhow!(
            "this ddmlip was built without MPI support; rebuild it with \
             `cargo build --release --features mpi` (needs OpenMPI: libopenmpi-dev openmpi-bin, \
             and libclang-dev), then launch `mpirun -n N ddmlip validate --backend mpi ...`"
        )))
    }
}

/// The MPI protocol. Rank 0 runs the whole validation (reference, inference,
/// comparison, auto-fix, report); every decomposed attempt is one collective
/// step of all ranks:
///
/// 1. rank 0 all-gathers a command: `RUN` + the attempt's options as JSON
///    (the spec chosen by auto-fix exists only on rank 0), or `DONE` + the
///    final exit status;
/// 2. on `RUN` every rank runs its part with `evaluate_on_communicator`;
/// 3. every rank all-gathers its trace, handler firings and sizes as JSON, so
///    rank 0's diagnostics see every rank, as with the threads backend.
///
/// A rank failing inside an attempt aborts the job (MPI_Abort with its
/// message), as `eval --backend mpi` does: the other ranks would otherwise
/// wait for it.
#[cfg(feature = "mpi")]
mod with_mpi {
    use super::{finish, prepare, validate_error, ValidateArgs};
    use crate::error::CliError;
    use crate::mpi::{abort, agree_on_input, SharedComm};
    use anyhow::anyhow;
    use ddmlip_atoms::System;
    use ddmlip_comm::{Buffer, Communicator, SendBuf};
    use ddmlip_engine::{DType, Model, Trace};
    use ddmlip_runtime::{
        check_batch, evaluate_on_communicator, EvalError, EvalOptions, EvalResult, RankResult,
    };
    use ddmlip_spec::MLIPSpec;
    use ddmlip_validate::trace_and_validate_with;
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// Command byte: the job is over; the next byte is the exit status.
    const DONE: u8 = 0;
    /// Command byte: run the attempt whose options follow as JSON.
    const RUN: u8 = 1;

    /// The options of one attempt, as rank 0 sends them.
    #[derive(Serialize, Deserialize)]
    struct AttemptCommand {
        spec: Option<MLIPSpec>,
        f32: bool,
        trace: bool,
        check_finite: bool,
        /// Å.
        skin: f64,
        /// s.
        timeout: f64,
    }

    impl AttemptCommand {
        fn of(o: &EvalOptions) -> Self {
            Self {
                spec: o.spec.clone(),
                f32: o.dtype == DType::F32,
                trace: o.trace,
                check_finite: o.check_finite,
                skin: o.skin,
                timeout: o.timeout.as_secs_f64(),
            }
        }

        fn options(self, ranks: usize) -> EvalOptions {
            EvalOptions {
                dtype: if self.f32 { DType::F32 } else { DType::F64 },
                ranks,
                spec: self.spec,
                trace: self.trace,
                check_finite: self.check_finite,
                skin: self.skin,
                timeout: Duration::from_secs_f64(self.timeout),
                ..Default::default()
            }
        }
    }

    /// What one rank contributes to rank 0's view of an attempt.
    #[derive(Serialize, Deserialize)]
    struct RankReport {
        trace: Option<Trace>,
        handler_counts: BTreeMap<String, usize>,
        bytes_sent: u64,
        /// (owned rows, ghost rows, edges).
        sizes: (usize, usize, usize),
    }

    impl RankReport {
        fn of(r: &RankResult) -> Self {
            Self {
                trace: r.trace.clone(),
                handler_counts: r.handler_counts.clone(),
                bytes_sent: r.bytes_sent,
                sizes: r.sizes,
            }
        }
    }

    fn bytes(b: Option<&Buffer>) -> &[u8] {
        match b {
            Some(Buffer::Bytes(v)) => v,
            _ => &[],
        }
    }

    /// One attempt on this rank, then every rank's report (rank order).
    /// Any failure aborts the job: a peer is inside the same collective step.
    fn run_attempt(
        comm: &SharedComm,
        model: &dyn Model,
        frames: &[System],
        opts: &EvalOptions,
    ) -> Result<(RankResult, Vec<RankReport>), EvalError> {
        let ranked = evaluate_on_communicator(model, frames, opts, Box::new(comm.handle()))
            .inspect_err(|e| comm.abort(&e.to_string()))?;
        let mine = serde_json::to_vec(&RankReport::of(&ranked))
            .map_err(|e| fatal(comm, format!("encoding this rank's trace: {e}")))?;
        let all = comm
            .all_gather(SendBuf::Bytes(&mine))
            .map_err(|e| fatal(comm, format!("gathering traces: {e}")))?;
        let reports = all
            .iter()
            .enumerate()
            .map(|(rank, b)| {
                serde_json::from_slice(bytes(Some(b)))
                    .map_err(|e| fatal(comm, format!("decoding rank {rank}'s trace: {e}")))
            })
            .collect::<Result<Vec<RankReport>, _>>()?;
        Ok((ranked, reports))
    }

    /// Aborts the job; the error only satisfies the type checker.
    fn fatal(comm: &SharedComm, message: String) -> EvalError {
        comm.abort(&message);
        EvalError::Input(message)
    }

    /// Rank 0's decomposed runner: announce, run, collect every rank's part.
    fn lead_attempt(
        comm: &SharedComm,
        model: &dyn Model,
        frames: &[System],
        opts: &EvalOptions,
    ) -> Result<EvalResult, EvalError> {
        let mut command = vec![RUN];
        serde_json::to_writer(&mut command, &AttemptCommand::of(opts))
            .map_err(|e| fatal(comm, format!("encoding the attempt: {e}")))?;
        comm.all_gather(SendBuf::Bytes(&command))
            .map_err(|e| fatal(comm, format!("announcing the attempt: {e}")))?;
        let (ranked, reports) = run_attempt(comm, model, frames, opts)?;
        let mut result = ranked
            .result
            .ok_or_else(|| fatal(comm, "rank 0 produced no result".into()))?;
        result.diagnostics.traces = Vec::with_capacity(reports.len());
        result.diagnostics.handler_counts.clear();
        result.diagnostics.rank_sizes.clear();
        result.diagnostics.bytes_sent = 0;
        for r in reports {
            result.diagnostics.traces.extend(r.trace);
            for (k, v) in r.handler_counts {
                *result.diagnostics.handler_counts.entry(k).or_insert(0) += v;
            }
            result.diagnostics.bytes_sent += r.bytes_sent;
            result.diagnostics.rank_sizes.push(r.sizes);
        }
        Ok(result)
    }

    /// Ranks 1..N: follow rank 0's commands until `DONE`; returns its status.
    fn follow(comm: &SharedComm, model: &dyn Model, frames: &[System]) -> Result<u8, CliError> {
        let size = comm.size();
        loop {
            let all = comm
                .all_gather(SendBuf::Bytes(&[]))
                .map_err(|e| abort(comm, format!("waiting for rank 0: {e}")))?;
            let command = bytes(all.first());
            match command.split_first() {
                Some((&DONE, status)) => return Ok(status.first().copied().unwrap_or(1)),
                Some((&RUN, json)) => {
                    let cmd: AttemptCommand = serde_json::from_slice(json)
                        .map_err(|e| abort(comm, format!("decoding rank 0's attempt: {e}")))?;
                    run_attempt(comm, model, frames, &cmd.options(size))
                        .map_err(|e| abort(comm, e.to_string()))?;
                }
                _ => return Err(abort(comm, "unknown command from rank 0".into())),
            }
        }
    }

    pub(super) fn validate(a: ValidateArgs) -> Result<u8, CliError> {
        let timeout = if a.timeout.is_finite() && a.timeout > 0.0 {
            Duration::from_secs_f64(a.timeout)
        } else {
            // `prepare` rejects it below, on every rank.
            ddmlip_comm::DEFAULT_TIMEOUT
        };
        let comm = SharedComm::init(timeout)?;
        let (rank, size) = (comm.rank(), comm.size());
        if rank == 0 {
            if let Some(n) = a.ranks.filter(|&n| n != size) {
                eprintln!(
                    "warning: --ranks {n} ignored: this MPI job has {size} process(es), one rank each \
                     (set the rank count with mpirun/srun -n)"
                );
            }
        }
        // Every rank reads and checks its own input; the verdicts are shared
        // so that a bad input stops every rank with status 2.
        let verdict = prepare(&a, size).and_then(|p| {
            check_batch(p.model.as_ref(), &p.frames)
                .map_err(|e| CliError::input(anyhow!("{e}")))?;
            Ok(p)
        });
        if let Err(status) = agree_on_input(&comm, &verdict) {
            return Ok(status);
        }
        let Ok(p) = verdict else {
            return Err(abort(&comm, "inconsistent input verdict".into()));
        };
        if rank != 0 {
            return follow(&comm, p.model.as_ref(), &p.frames);
        }
        let outcome = trace_and_validate_with(p.model.as_ref(), &p.frames, &p.options, &mut |o| {
            lead_attempt(&comm, p.model.as_ref(), &p.frames, o)
        })
        .map_err(validate_error)
        .and_then(|report| finish(&a, &report));
        let status = match &outcome {
            Ok(s) => *s,
            Err(e) => e.status,
        };
        comm.all_gather(SendBuf::Bytes(&[DONE, status]))
            .map_err(|e| abort(&comm, format!("releasing the other ranks: {e}")))?;
        outcome
    }
}
