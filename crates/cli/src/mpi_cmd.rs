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

use super::EvalArgs;
use crate::CliError;

/// Runs `eval` as this process's rank of an MPI job. Returns the exit status;
/// without the `mpi` cargo feature this is a usage error (status 2) saying how
/// to build with MPI.
pub fn eval_mpi(args: EvalArgs) -> Result<u8, CliError> {
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
pub(crate) mod with_mpi {
    use super::super::{
        eval_error, load_model, load_spec, read_structure, report_split_health, write_results,
    };
    use super::EvalArgs;
    use crate::{output, CliError, EXIT_BAD_INPUT};
    use anyhow::anyhow;
    use ddmlip_atoms::System;
    use ddmlip_comm::{Buffer, CommError, CommStats, Communicator, ElemKind, MpiCommunicator};
    use ddmlip_comm::{SendBuf, DEFAULT_TIMEOUT};
    use ddmlip_engine::Model;
    use ddmlip_runtime::{check_batch, evaluate_on_communicator, EvalOptions};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Instant;

    /// The process's MPI communicator, shared between the evaluation (which
    /// takes a `Box<dyn Communicator>` and keeps it until it returns) and this
    /// command, which still needs it afterwards to gather statistics. MPI is
    /// finalised when the last handle is dropped. `validate --backend mpi`
    /// reuses it for every attempt.
    pub(crate) struct SharedComm(Arc<Mutex<MpiCommunicator>>);

    impl SharedComm {
        /// Starts MPI with `timeout` as the deadline of every blocking
        /// point-to-point call.
        pub(crate) fn init(timeout: std::time::Duration) -> Result<Self, CliError> {
            let mpi = MpiCommunicator::init()
                .map_err(|e| CliError::failed(anyhow!("cannot start MPI: {e}")))?
                .with_timeout(timeout);
            Ok(Self(Arc::new(Mutex::new(mpi))))
        }

        /// Another handle on the same communicator (for a call that consumes
        /// a `Box<dyn Communicator>`).
        pub(crate) fn handle(&self) -> Self {
            Self(Arc::clone(&self.0))
        }

        fn lock(&self) -> MutexGuard<'_, MpiCommunicator> {
            // A poisoned lock only means a panic elsewhere on this rank; the
            // communicator itself holds no invariant a panic could break.
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl Communicator for SharedComm {
        fn rank(&self) -> usize {
            self.lock().rank()
        }
        fn size(&self) -> usize {
            self.lock().size()
        }
        fn send(&self, peer: usize, tag: u32, data: SendBuf<'_>) -> Result<(), CommError> {
            self.lock().send(peer, tag, data)
        }
        fn recv(&self, peer: usize, tag: u32, kind: ElemKind) -> Result<Buffer, CommError> {
            self.lock().recv(peer, tag, kind)
        }
        fn exchange(
            &self,
            sends: &[(usize, SendBuf<'_>)],
            recv_from: &[usize],
            tag: u32,
            kind: ElemKind,
        ) -> Result<Vec<Buffer>, CommError> {
            self.lock().exchange(sends, recv_from, tag, kind)
        }
        fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<(), CommError> {
            self.lock().all_reduce_sum_f64(data)
        }
        fn all_reduce_sum_f32(&self, data: &mut [f32]) -> Result<(), CommError> {
            self.lock().all_reduce_sum_f32(data)
        }
        fn all_gather(&self, data: SendBuf<'_>) -> Result<Vec<Buffer>, CommError> {
            self.lock().all_gather(data)
        }
        fn barrier(&self) -> Result<(), CommError> {
            self.lock().barrier()
        }
        fn abort(&self, message: &str) {
            self.lock().abort(message)
        }
        fn stats(&self) -> CommStats {
            self.lock().stats()
        }
    }

    /// What every rank needs before the run: read and checked locally.
    struct Prepared {
        frames: Vec<System>,
        model: Box<dyn Model>,
        opts: EvalOptions,
    }

    fn prepare(a: &EvalArgs, size: usize) -> Result<Prepared, CliError> {
        if let Some(out) = &a.output {
            crate::eval_batch::check_writable(out)?;
        }
        let frames = read_structure(&a.structure)?;
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

    /// Aborts the whole job with `message` (this call does not return under
    /// MPI); the error is returned only for the type checker's sake.
    pub(crate) fn abort(comm: &SharedComm, message: String) -> CliError {
        comm.abort(&message);
        CliError::failed(anyhow!(message))
    }

    /// Every rank learns every rank's verdict on its input. Reading is local
    /// and always terminates, so every rank reaches this collective. Returns
    /// `Err` on every rank if any rank failed; rank 0's error names them all,
    /// the other ranks' is silent (status only).
    pub(crate) fn agree_on_input<T>(
        comm: &SharedComm,
        verdict: &Result<T, CliError>,
    ) -> Result<(), u8> {
        // One byte of exit status, then the message (empty when fine).
        let mine: Vec<u8> = match verdict {
            Ok(_) => vec![0],
            Err(e) => {
                let mut v = vec![e.status];
                v.extend_from_slice(format!("{:#}", e.error).as_bytes());
                v
            }
        };
        let all = match comm.all_gather(SendBuf::Bytes(&mine)) {
            Ok(all) => all,
            Err(e) => return Err(abort_status(comm, e)),
        };
        let failures: Vec<(usize, u8, String)> = all
            .iter()
            .enumerate()
            .filter_map(|(rank, b)| match b {
                Buffer::Bytes(v) if v.first().is_some_and(|&s| s != 0) => {
                    Some((rank, v[0], String::from_utf8_lossy(&v[1..]).into_owned()))
                }
                _ => None,
            })
            .collect();
        if failures.is_empty() {
            return Ok(());
        }
        let status = failures.iter().map(|f| f.1).max().unwrap_or(EXIT_BAD_INPUT);
        if comm.rank() == 0 {
            if failures.len() == all.len() && failures.iter().all(|f| f.2 == failures[0].2) {
                // The usual case: the same bad input seen by every rank.
                eprintln!("error: {}", failures[0].2);
            } else {
                for (rank, _, message) in &failures {
                    eprintln!("error: rank {rank}: {message}");
                }
            }
        }
        Err(status)
    }

    fn abort_status(comm: &SharedComm, e: CommError) -> u8 {
        let _ = abort(comm, format!("MPI collective failed: {e}"));
        crate::EXIT_FAILED
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
            crate::eval_batch::warn_unvalidated_spec(
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
        result.bytes_sent = per_rank.iter().filter_map(|s| s.first()).sum();
        result.rank_sizes = per_rank
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
        let health = report_split_health(&a, &frames, &result);
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
