//! Communication layer for domain-decomposed runs.
//!
//! One [`Communicator`] abstraction shaped like MPI (rank, size,
//! point-to-point, halo exchange, all-reduce, all-gather, barrier, abort)
//! with two backends:
//!
//! - **threads** ([`run_threads`], [`thread_world`]): ranks are threads of one
//!   process; the embedded default.
//! - **MPI** (`MpiCommunicator`, cargo feature `mpi`): ranks are processes of
//!   an MPI job over `MPI_COMM_WORLD`.
//!
//! Contracts shared by every backend:
//!
//! - Messages between one (source, destination) pair with the same tag are
//!   received in the order they were sent (MPI's non-overtaking rule).
//! - All-reduce sums are a left fold in rank order,
//!   `((x_0 + x_1) + x_2) + … + x_{P-1}`, computed once and distributed, so
//!   the result is deterministic and bitwise identical on every rank.
//! - Collectives must be called by every rank in the same order.
//! - A rank that fails ([`Communicator::abort`]) makes every pending and later
//!   call on every peer return [`CommError::PeerFailed`] naming it (threads),
//!   or terminates the whole job (MPI).

#![warn(missing_docs)]

use std::time::Duration;

mod buffer;
mod threads;

#[cfg(feature = "mpi")]
mod mpi_backend;

pub use buffer::{Buffer, ElemKind, SendBuf};
pub use threads::{
    run_threads, thread_world, FailedRank, FailureKind, IdleWork, RankFailure, ThreadCommunicator,
    ThreadsConfig,
};

#[cfg(feature = "mpi")]
pub use mpi_backend::MpiCommunicator;

/// Deadline applied to every blocking call unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors returned by every fallible [`Communicator`] method.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A rank of the world failed (its function returned an error, panicked,
    /// or called [`Communicator::abort`]); `rank` is the first rank that
    /// failed and `message` its error text.
    #[error("rank {rank} failed: {message}")]
    PeerFailed {
        /// The rank that failed first.
        rank: usize,
        /// Its error message.
        message: String,
    },
    /// A blocking call passed its deadline; `peer` is the rank waited on when
    /// known.
    #[error("{op} timed out after {waited:?}{}", peer_suffix(.peer))]
    Timeout {
        /// The operation that timed out (e.g. `"recv"`, `"all_reduce_sum_f64"`).
        op: &'static str,
        /// The rank whose message never arrived, when there is a single one.
        peer: Option<usize>,
        /// How long the call waited.
        waited: Duration,
    },
    /// The peer finished (its communicator was dropped) without sending the
    /// message this call waits for.
    #[error("{op}: rank {rank} finished without sending the expected message")]
    PeerFinished {
        /// The operation that was waiting.
        op: &'static str,
        /// The rank that finished.
        rank: usize,
    },
    /// A peer rank outside `0..size`.
    #[error("invalid peer rank {peer} (world size {size})")]
    InvalidPeer {
        /// The requested peer.
        peer: usize,
        /// The world size.
        size: usize,
    },
    /// The received message holds a different element type than requested.
    #[error("{op}: rank {peer} sent {got:?} elements, expected {expected:?}")]
    TypeMismatch {
        /// The receiving operation.
        op: &'static str,
        /// The sending rank.
        peer: usize,
        /// The element type the receiver asked for.
        expected: ElemKind,
        /// The element type that arrived.
        got: ElemKind,
    },
    /// Buffers that must have equal lengths do not (all-reduce contributions,
    /// or a receive into a fixed-size buffer).
    #[error("{op}: rank {rank} has {len} elements, expected {expected}")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// The rank whose buffer has the wrong length.
        rank: usize,
        /// Its length in elements.
        len: usize,
        /// The length expected.
        expected: usize,
    },
    /// Ranks called different collectives at the same point of their
    /// collective sequence.
    #[error("collective mismatch: this rank expected {expected}, rank {rank} called {got}")]
    CollectiveMismatch {
        /// The collective the checking rank called.
        expected: &'static str,
        /// The rank that called something else.
        rank: usize,
        /// What that rank called.
        got: &'static str,
    },
    /// A message tag the backend cannot represent.
    #[error("tag {tag} is out of range for this backend (max {max})")]
    InvalidTag {
        /// The requested tag.
        tag: u32,
        /// The largest tag the backend accepts.
        max: u32,
    },
    /// The backend itself failed (e.g. MPI could not be initialised).
    #[error("communication backend error: {0}")]
    Backend(String),
}

fn peer_suffix(peer: &Option<usize>) -> String {
    match peer {
        Some(rank) => format!(" waiting on rank {rank}"),
        None => String::new(),
    }
}

/// Per-rank communication counters, cumulative since the communicator was
/// created. Byte counts are payload bytes (elements × element size).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Payload bytes sent point-to-point to other ranks (send + exchange).
    pub bytes_sent: u64,
    /// Point-to-point messages sent to other ranks.
    pub messages_sent: u64,
    /// Payload bytes received point-to-point from other ranks.
    pub bytes_received: u64,
    /// Point-to-point messages received from other ranks.
    pub messages_received: u64,
    /// Payload bytes a rank "sent" to itself (copied locally, no traffic).
    pub self_bytes: u64,
    /// Number of all-reduce calls.
    pub all_reduces: u64,
    /// Number of all-gather calls.
    pub all_gathers: u64,
    /// Number of barrier calls.
    pub barriers: u64,
    /// Payload bytes this rank contributed to all-reduce and all-gather calls.
    pub collective_bytes: u64,
}

impl CommStats {
    /// Counter-wise difference `self − earlier` (saturating), e.g. the traffic
    /// of one step from two snapshots.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        CommStats {
            bytes_sent: self.bytes_sent.saturating_sub(earlier.bytes_sent),
            messages_sent: self.messages_sent.saturating_sub(earlier.messages_sent),
            bytes_received: self.bytes_received.saturating_sub(earlier.bytes_received),
            messages_received: self
                .messages_received
                .saturating_sub(earlier.messages_received),
            self_bytes: self.self_bytes.saturating_sub(earlier.self_bytes),
            all_reduces: self.all_reduces.saturating_sub(earlier.all_reduces),
            all_gathers: self.all_gathers.saturating_sub(earlier.all_gathers),
            barriers: self.barriers.saturating_sub(earlier.barriers),
            collective_bytes: self
                .collective_bytes
                .saturating_sub(earlier.collective_bytes),
        }
    }
}

macro_rules! typed_methods {
    ($elem:ty, $variant:ident,
     $send:ident, $recv:ident, $recv_into:ident, $exchange:ident, $gather:ident) => {
        #[doc = concat!("Sends `data` (`", stringify!($elem), "` elements) to `peer` with `tag`; returns once the data is buffered (never waits for the receiver).")]
        fn $send(&self, peer: usize, tag: u32, data: &[$elem]) -> Result<(), CommError> {
            self.send(peer, tag, SendBuf::$variant(data))
        }

        #[doc = concat!("Receives the next `", stringify!($elem), "` message from `peer` with `tag`, waiting up to the deadline.")]
        fn $recv(&self, peer: usize, tag: u32) -> Result<Vec<$elem>, CommError> {
            match self.recv(peer, tag, ElemKind::$variant)? {
                Buffer::$variant(values) => Ok(values),
                other => Err(CommError::TypeMismatch {
                    op: stringify!($recv),
                    peer,
                    expected: ElemKind::$variant,
                    got: other.kind(),
                }),
            }
        }

        #[doc = concat!("Receives the next `", stringify!($elem), "` message from `peer` with `tag` into `out`; the message must hold exactly `out.len()` elements.")]
        fn $recv_into(&self, peer: usize, tag: u32, out: &mut [$elem]) -> Result<(), CommError> {
            let values = self.$recv(peer, tag)?;
            if values.len() != out.len() {
                return Err(CommError::LengthMismatch {
                    op: stringify!($recv_into),
                    rank: peer,
                    len: values.len(),
                    expected: out.len(),
                });
            }
            out.copy_from_slice(&values);
            Ok(())
        }

        #[doc = concat!("Deadlock-free halo exchange of `", stringify!($elem), "` buffers: sends every `(peer, data)` of `sends`, then receives one message from each rank of `recv_from` (in that order; a rank may appear several times and may be this rank itself). Result `i` is the message from `recv_from[i]`.")]
        fn $exchange(
            &self,
            sends: &[(usize, &[$elem])],
            recv_from: &[usize],
            tag: u32,
        ) -> Result<Vec<Vec<$elem>>, CommError> {
            let bufs: Vec<(usize, SendBuf<'_>)> = sends
                .iter()
                .map(|&(peer, data)| (peer, SendBuf::$variant(data)))
                .collect();
            let received = self.exchange(&bufs, recv_from, tag, ElemKind::$variant)?;
            received
                .into_iter()
                .zip(recv_from)
                .map(|(buffer, &peer)| match buffer {
                    Buffer::$variant(values) => Ok(values),
                    other => Err(CommError::TypeMismatch {
                        op: stringify!($exchange),
                        peer,
                        expected: ElemKind::$variant,
                        got: other.kind(),
                    }),
                })
                .collect()
        }

        #[doc = concat!("All-gather of variable-length `", stringify!($elem), "` buffers: result `r` is rank `r`'s `data`, identical on every rank.")]
        fn $gather(&self, data: &[$elem]) -> Result<Vec<Vec<$elem>>, CommError> {
            let gathered = self.all_gather(SendBuf::$variant(data))?;
            gathered
                .into_iter()
                .enumerate()
                .map(|(rank, buffer)| match buffer {
                    Buffer::$variant(values) => Ok(values),
                    other => Err(CommError::TypeMismatch {
                        op: stringify!($gather),
                        peer: rank,
                        expected: ElemKind::$variant,
                        got: other.kind(),
                    }),
                })
                .collect()
        }
    };
}

/// A communicator over `size()` ranks, shaped like MPI.
///
/// Object-safe and `Send`: each rank's worker thread owns (or borrows) one,
/// as `&dyn Communicator` or `Box<dyn Communicator>`. It is not required to
/// be `Sync`; one rank's calls are made from one thread at a time.
///
/// Every blocking call is bounded by the backend's deadline (threads) or by
/// job-wide abort (MPI); none waits forever.
pub trait Communicator: Send {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the world (≥ 1).
    fn size(&self) -> usize;

    /// Sends `data` to `peer` (which may be this rank) with `tag`. Returns once
    /// the data is buffered; never waits for a matching receive.
    fn send(&self, peer: usize, tag: u32, data: SendBuf<'_>) -> Result<(), CommError>;

    /// Receives the next message from `peer` with `tag`. `kind` is the element
    /// type expected (a mismatch is [`CommError::TypeMismatch`] where the
    /// backend can detect it).
    fn recv(&self, peer: usize, tag: u32, kind: ElemKind) -> Result<Buffer, CommError>;

    /// Halo exchange that cannot deadlock: sends every `(peer, data)` of
    /// `sends` without waiting, then receives one message with `tag` from each
    /// entry of `recv_from`, in order. Peers may repeat and may be this rank
    /// (served by a local copy). Result `i` is the message from
    /// `recv_from[i]`; repeated peers receive in send order.
    fn exchange(
        &self,
        sends: &[(usize, SendBuf<'_>)],
        recv_from: &[usize],
        tag: u32,
        kind: ElemKind,
    ) -> Result<Vec<Buffer>, CommError>;

    /// Element-wise sum over all ranks, in place. Every rank must pass the same
    /// length. The sum is a left fold in rank order and bitwise identical on
    /// every rank.
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<(), CommError>;

    /// `f32` variant of [`Communicator::all_reduce_sum_f64`] (summed in `f32`).
    fn all_reduce_sum_f32(&self, data: &mut [f32]) -> Result<(), CommError>;

    /// All-gather of variable-length buffers: result `r` is rank `r`'s `data`.
    /// Every rank must pass the same element type.
    fn all_gather(&self, data: SendBuf<'_>) -> Result<Vec<Buffer>, CommError>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&self) -> Result<(), CommError>;

    /// Marks this rank failed with `message`: every peer's pending and later
    /// calls return [`CommError::PeerFailed`] naming this rank (threads), or
    /// the whole job is terminated with a non-zero exit code after printing
    /// `rank R: message` to stderr (MPI; this call then does not return).
    /// The first failure of the world wins; later aborts are ignored.
    fn abort(&self, message: &str);

    /// A snapshot of this rank's cumulative counters.
    fn stats(&self) -> CommStats;

    typed_methods!(
        f64,
        F64,
        send_f64,
        recv_f64,
        recv_f64_into,
        exchange_f64,
        all_gather_f64
    );
    typed_methods!(
        f32,
        F32,
        send_f32,
        recv_f32,
        recv_f32_into,
        exchange_f32,
        all_gather_f32
    );
    typed_methods!(
        u64,
        U64,
        send_u64,
        recv_u64,
        recv_u64_into,
        exchange_u64,
        all_gather_u64
    );
    typed_methods!(
        u32,
        U32,
        send_u32,
        recv_u32,
        recv_u32_into,
        exchange_u32,
        all_gather_u32
    );
    typed_methods!(
        u8,
        Bytes,
        send_bytes,
        recv_bytes,
        recv_bytes_into,
        exchange_bytes,
        all_gather_bytes
    );
}

/// Sums `contributions` element-wise as a left fold in slice order — the
/// reduction order every backend uses. All slices must have `out.len()`
/// elements (checked by callers).
pub(crate) fn fold_sum<T: Copy + std::ops::AddAssign>(out: &mut [T], contributions: &[&[T]]) {
    if let Some((first, rest)) = contributions.split_first() {
        out.copy_from_slice(first);
        for contribution in rest {
            for (acc, &value) in out.iter_mut().zip(contribution.iter()) {
                *acc += value;
            }
        }
    }
}
