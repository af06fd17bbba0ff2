//! The process's MPI communicator as a shared handle, and the collectives
//! every MPI command uses before its run: agreeing on whether every rank
//! could read its input, and aborting the job.

use crate::error::{CliError, EXIT_BAD_INPUT, EXIT_FAILED};
use anyhow::anyhow;
use ddmlip_comm::{Buffer, CommError, CommStats, Communicator, ElemKind, MpiCommunicator, SendBuf};
use std::sync::{Arc, Mutex, MutexGuard};

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
    EXIT_FAILED
}
