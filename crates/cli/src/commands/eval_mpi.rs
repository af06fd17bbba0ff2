//! `ddmlip eval --backend mpi`: one rank of a decomposed evaluation per MPI
//! process (launched with `mpirun -n N` or `srun -n N`).
//!
//! Every process reads the same structure file and model and partitions them
//! itself: the partition is a pure function of the input and the rank count,
//! so no parsed batch is ever broadcast. The only extra communication is one
//! all-gather of per-rank verdicts after reading (so that a rank that cannot
//! read its input is reported by name and every rank stops together), and one
//! all-gather of per-rank statistics after the run. Only rank 0 prints or
//! writes anything on success.
use crate::args::EvalArgs;
use crate::error::CliError;

/// Runs `eval` as this process's rank of an MPI job. Returns the exit status;
/// without the `mpi` cargo feature this is a usage error (status 2) saying how
/// to build with MPI.
pub fn run(args: EvalArgs) -> Result<u8, CliError> {
    #[cfg(feature = "mpi")]
    {
        with_mpi::eval(args)
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = args;
        Err(CliError::input(anyhow::anyhow!(
            "this ddmlip was built without MPI support; rebuild it with \
             `cargo build --release --features mpi` (needs OpenMPI: libopenmpi-dev openmpi-bin, \
             and libclang-dev), then launch `mpirun -n N ddmlip eval --backend mpi ...`"
        )))
    }
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use crate::args::EvalArgs;
    use crate::error::CliError;
    use crate::input::{eval_error, load_model, load_spec, read_structure, write_results};
    use crate::mpi::{abort, agree_on_input, SharedComm};
    use crate::output;
    use ddmlip::runtime::{check_batch, evaluate_on_communicator};
    use ddmlip::{EvalOptions, Model, System};
    use ddmlip_comm::{Communicator, DEFAULT_TIMEOUT};
    use std::time::Instant;

    /// What every rank needs before the run: read and checked locally.
    struct Prepared {
        frames: Vec<System>,
        model: Box<dyn Model>,
        opts: EvalOptions,
    }

    fn prepare(a: &EvalArgs, size: usize) -> Result<Prepared, CliError> {
        if let Some(out) = &a.output {
            super::super::eval_batch::check_writable(out)?;
        }
        let frames = read_structure(&a.structure)?;
        if let Some(out) = &a.output {
            super::super::eval_batch::check_output_holds(out, &a.structure, frames.len())?;
        }
        let model = load_model(&a.model, a.modal.as_deref())?;
        let opts = EvalOptions {
            dtype: a.dtype.into(),
            ranks: size,
            spec: load_spec(&a.spec)?,
            balance: a.balance.into(),
            timeout: DEFAULT_TIMEOUT,
            ..Default::default()
        };
        // The same check runs again inside the evaluation, where a failure
        // aborts the job; doing it here first turns a bad input into a clean
        // exit with status 2 on every rank.
        check_batch(model.as_ref(), &frames).map_err(eval_error)?;
        Ok(Prepared {
            frames,
            model,
            opts,
        })
    }

    pub(super) fn eval(a: EvalArgs) -> Result<u8, CliError> {
        let comm = SharedComm::init(DEFAULT_TIMEOUT)?;
        let (rank, size) = (comm.rank(), comm.size());
        if rank == 0 {
            if let Some(n) = a.ranks.filter(|&n| n != size) {
                eprintln!(
                    "warning: --ranks {n} ignored: this MPI job has {size} process(es), one rank each \
                     (set the rank count with mpirun/srun -n)"
                );
            }
        }
        let verdict = prepare(&a, size);
        if let Err(status) = agree_on_input(&comm, &verdict) {
            return Ok(status);
        }
        let Ok(Prepared {
            frames,
            model,
            opts,
        }) = verdict
        else {
            // agree_on_input returned Ok only if this rank's verdict is Ok.
            return Err(abort(&comm, "inconsistent input verdict".into()));
        };
        if let (0, Some(spec), Some(path)) = (rank, &opts.spec, &a.spec) {
            super::super::eval_batch::warn_unvalidated_spec(
                spec,
                path,
                model.as_ref(),
                &a.model,
                &a.structure,
                size,
            );
        }

        let started = Instant::now();
        let handle = comm.handle();
        // On failure the evaluation aborts the job itself (MPI_Abort with the
        // failing rank's message), so an `Err` reaching here is unexpected;
        // abort anyway so no peer is left waiting.
        let ranked = evaluate_on_communicator(model.as_ref(), &frames, &opts, Box::new(handle))
            .map_err(|e| abort(&comm, e.to_string()))?;
        let seconds = started.elapsed().as_secs_f64();

        // Per-rank statistics for the summary: [bytes sent, owned, ghost, edges].
        let (owned, ghost, edges) = ranked.sizes;
        let stats = [ranked.bytes_sent, owned as u64, ghost as u64, edges as u64];
        let gathered = comm
            .all_gather_u64(&stats)
            .and_then(|s| Ok((s, comm.all_gather_f64(&[seconds])?)))
            .map_err(|e| abort(&comm, format!("gathering run statistics: {e}")))?;
        // Finalise MPI before rank 0 writes: the other ranks are done.
        drop(comm);
        let Some(mut result) = ranked.result else {
            return Ok(0);
        };
        let (per_rank, times) = gathered;
        result.diagnostics.bytes_sent = per_rank.iter().filter_map(|s| s.first()).sum();
        result.diagnostics.rank_sizes = per_rank
            .iter()
            .filter(|s| s.len() == 4)
            .map(|s| (s[1] as usize, s[2] as usize, s[3] as usize))
            .collect();
        let slowest = times
            .iter()
            .filter_map(|t| t.first().copied())
            .fold(seconds, f64::max);

        if let Some(out) = &a.output {
            write_results(out, &frames, &result)?;
        }
        let health = output::report_split_health(&a.structure, a.balance, &frames, &result);
        if a.json {
            println!("{}", output::eval_json(&result, &health));
        } else {
            print!(
                "{}",
                output::eval_text(model.as_ref(), &frames, &result, size, slowest)
            );
            println!("MPI: {size} process(es), one rank each");
            if let Some(out) = &a.output {
                println!("wrote {}", out.display());
            }
        }
        Ok(0)
    }
}
