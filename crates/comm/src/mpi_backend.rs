//! MPI backend over `MPI_COMM_WORLD`.
//!
//! - Point-to-point: every send copies the data into an owned typed buffer and
//!   starts a non-blocking `MPI_Isend`; the buffer lives in a pending list
//!   until the request completes (progressed on every call and on drop). Sends
//!   therefore never wait for the receiver, and an exchange cannot deadlock.
//!   Receives poll `MPI_Improbe` until the deadline, then `MPI_Mrecv`.
//! - The element type travels in the MPI tag (`user_tag * 8 + kind`), so a
//!   receive only ever matches a message of the requested type; a receive for
//!   the wrong type does not match and ends in [`CommError::Timeout`].
//! - Self-sends never touch MPI: they are queued locally and copied out.
//! - All-reduce is gather-to-root, a left fold in rank order on rank 0, then a
//!   broadcast: the result is deterministic and bitwise identical everywhere
//!   (independent of the MPI library's reduction algorithm).
//! - Collectives and barriers are plain blocking MPI collectives: they are
//!   bounded not by a deadline but by `MPI_Abort` from a failing rank, which
//!   terminates the whole job.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::AddAssign;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives as _, Root as _};
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::environment::{Threading, Universe};
use mpi::ffi;
use mpi::point_to_point::Source as _;
use mpi::raw::AsRaw as _;
use mpi::topology::{Communicator as _, SimpleCommunicator};

use crate::{fold_sum, Buffer, CommError, CommStats, Communicator, ElemKind, SendBuf};

/// Tags the MPI standard guarantees (`MPI_TAG_UB ≥ 32767`), divided among the
/// eight element-type slots.
const MAX_USER_TAG: u32 = 32767 / 8 - 1;

fn kind_code(kind: ElemKind) -> c_int {
    match kind {
        ElemKind::F64 => 0,
        ElemKind::F32 => 1,
        ElemKind::U64 => 2,
        ElemKind::U32 => 3,
        ElemKind::Bytes => 4,
    }
}

fn kind_from_code(code: u64) -> Option<ElemKind> {
    Some(match code {
        0 => ElemKind::F64,
        1 => ElemKind::F32,
        2 => ElemKind::U64,
        3 => ElemKind::U32,
        4 => ElemKind::Bytes,
        _ => return None,
    })
}

fn mpi_tag(tag: u32, kind: ElemKind) -> Result<c_int, CommError> {
    if tag > MAX_USER_TAG {
        return Err(CommError::InvalidTag {
            tag,
            max: MAX_USER_TAG,
        });
    }
    // Fits: tag * 8 + 7 ≤ 32767.
    Ok(tag as c_int * 8 + kind_code(kind))
}

/// An in-flight `MPI_Isend` and the buffer it reads from. The buffer's heap
/// storage does not move when the struct moves, so the pointer MPI holds stays
/// valid until the request completes.
struct PendingSend {
    request: ffi::MPI_Request,
    _data: Buffer,
}

/// Communicator over `MPI_COMM_WORLD`. Create one per process with
/// [`MpiCommunicator::init`]; MPI is finalised when it is dropped.
pub struct MpiCommunicator {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    pending: RefCell<Vec<PendingSend>>,
    /// Messages this rank sent to itself, in send order.
    self_queue: RefCell<VecDeque<(u32, Buffer)>>,
    stats: RefCell<CommStats>,
    // Declared last: finalises MPI after the fields above are dropped.
    _universe: Universe,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED or higher (checked in
// `init`), so MPI may be called from any thread as long as calls do not
// overlap. `MpiCommunicator` is `!Sync` (RefCell fields), hence all its MPI
// calls are made by whichever single thread owns it at the time.
unsafe impl Send for MpiCommunicator {}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MpiCommunicator {
    /// Initialises MPI (once per process) and returns the world communicator
    /// with the default deadline for receives. Fails if MPI was already
    /// initialised or cannot provide `MPI_THREAD_SERIALIZED`.
    pub fn init() -> Result<Self, CommError> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| CommError::Backend("MPI is already initialised".into()))?;
        if !matches!(provided, Threading::Serialized | Threading::Multiple) {
            return Err(CommError::Backend(format!(
                "MPI provides thread level {provided:?}; MPI_THREAD_SERIALIZED is required"
            )));
        }
        let world = universe.world();
        let rank = usize::try_from(world.rank())
            .map_err(|_| CommError::Backend("negative MPI rank".into()))?;
        let size = usize::try_from(world.size())
            .map_err(|_| CommError::Backend("negative MPI size".into()))?;
        Ok(MpiCommunicator {
            world,
            rank,
            size,
            timeout: crate::DEFAULT_TIMEOUT,
            pending: RefCell::new(Vec::new()),
            self_queue: RefCell::new(VecDeque::new()),
            stats: RefCell::new(CommStats::default()),
            _universe: universe,
        })
    }

    /// Sets the deadline of point-to-point receives (collectives are bounded
    /// by job abort instead).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn check_peer(&self, peer: usize) -> Result<c_int, CommError> {
        if peer < self.size {
            c_int::try_from(peer).map_err(|_| CommError::InvalidPeer {
                peer,
                size: self.size,
            })
        } else {
            Err(CommError::InvalidPeer {
                peer,
                size: self.size,
            })
        }
    }

    /// Tests every pending send once and drops the completed ones.
    fn progress(&self) {
        self.pending.borrow_mut().retain_mut(|send| {
            let mut done: c_int = 0;
            // SAFETY: `send.request` is a valid request started by MPI_Isend
            // (MPI_Test sets it to MPI_REQUEST_NULL once complete, after which
            // the entry is removed); the status is ignored.
            unsafe {
                ffi::MPI_Test(&mut send.request, &mut done, ffi::RSMPI_STATUS_IGNORE);
            }
            done == 0
        });
    }

    fn start_send(&self, dest: c_int, tag: c_int, data: Buffer) {
        let (pointer, count, datatype) = match &data {
            Buffer::F64(v) => (
                v.as_ptr() as *const c_void,
                v.len(),
                f64::equivalent_datatype().as_raw(),
            ),
            Buffer::F32(v) => (
                v.as_ptr() as *const c_void,
                v.len(),
                f32::equivalent_datatype().as_raw(),
            ),
            Buffer::U64(v) => (
                v.as_ptr() as *const c_void,
                v.len(),
                u64::equivalent_datatype().as_raw(),
            ),
            Buffer::U32(v) => (
                v.as_ptr() as *const c_void,
                v.len(),
                u32::equivalent_datatype().as_raw(),
            ),
            Buffer::Bytes(v) => (
                v.as_ptr() as *const c_void,
                v.len(),
                u8::equivalent_datatype().as_raw(),
            ),
        };
        // Counts beyond c_int are rejected by the caller; see `send_checked`.
        let count = count as c_int;
        // SAFETY: an uninitialised request is fine as an output argument.
        let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: `pointer` addresses `count` elements of `datatype` owned by
        // `data`, which is kept alive in `pending` until the request completes.
        unsafe {
            ffi::MPI_Isend(
                pointer,
                count,
                datatype,
                dest,
                tag,
                self.world.as_raw(),
                &mut request,
            );
        }
        self.pending.borrow_mut().push(PendingSend {
            request,
            _data: data,
        });
    }

    fn send_checked(&self, peer: usize, tag: u32, data: SendBuf<'_>) -> Result<(), CommError> {
        let dest = self.check_peer(peer)?;
        let tag_value = mpi_tag(tag, data.kind())?;
        if c_int::try_from(data.len()).is_err() {
            return Err(CommError::Backend(format!(
                "message of {} elements exceeds the MPI count limit",
                data.len()
            )));
        }
        let mut stats = self.stats.borrow_mut();
        if peer == self.rank {
            stats.self_bytes += data.byte_len() as u64;
            self.self_queue
                .borrow_mut()
                .push_back((tag, data.to_buffer()));
        } else {
            stats.bytes_sent += data.byte_len() as u64;
            stats.messages_sent += 1;
            drop(stats);
            self.start_send(dest, tag_value, data.to_buffer());
        }
        Ok(())
    }

    fn recv_checked(
        &self,
        peer: usize,
        tag: u32,
        kind: ElemKind,
        op: &'static str,
    ) -> Result<Buffer, CommError> {
        let source = self.check_peer(peer)?;
        let tag_value = mpi_tag(tag, kind)?;
        if peer == self.rank {
            let mut queue = self.self_queue.borrow_mut();
            let position = queue
                .iter()
                .position(|(t, b)| *t == tag && b.kind() == kind);
            // Only this rank can fill its own queue, so an empty match can
            // never be satisfied by waiting.
            return match position.and_then(|p| queue.remove(p)) {
                Some((_, buffer)) => Ok(buffer),
                None => Err(CommError::Timeout {
                    op,
                    peer: Some(peer),
                    waited: Duration::ZERO,
                }),
            };
        }
        let start = Instant::now();
        let process = self.world.process_at_rank(source);
        let mut polls: u32 = 0;
        let (message, status) = loop {
            if let Some(found) = process.immediate_matched_probe_with_tag(tag_value) {
                break found;
            }
            self.progress();
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(CommError::Timeout {
                    op,
                    peer: Some(peer),
                    waited,
                });
            }
            // Spin briefly for low latency, then back off so oversubscribed
            // ranks leave the cores to the ranks doing work.
            polls = polls.saturating_add(1);
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        };
        let buffer = match kind {
            ElemKind::F64 => Buffer::F64(receive_matched(message, &status)),
            ElemKind::F32 => Buffer::F32(receive_matched(message, &status)),
            ElemKind::U64 => Buffer::U64(receive_matched(message, &status)),
            ElemKind::U32 => Buffer::U32(receive_matched(message, &status)),
            ElemKind::Bytes => Buffer::Bytes(receive_matched(message, &status)),
        };
        let mut stats = self.stats.borrow_mut();
        stats.bytes_received += buffer.byte_len() as u64;
        stats.messages_received += 1;
        Ok(buffer)
    }

    /// All-gathers one `u64` pair per rank (metadata for the collectives).
    fn gather_meta(&self, meta: [u64; 2]) -> Vec<[u64; 2]> {
        let mut all = vec![0u64; 2 * self.size];
        self.world.all_gather_into(&meta[..], &mut all[..]);
        all.chunks_exact(2).map(|c| [c[0], c[1]]).collect()
    }

    fn all_reduce_typed<T>(&self, op: &'static str, data: &mut [T]) -> Result<(), CommError>
    where
        T: Equivalence + Copy + Default + AddAssign,
    {
        {
            let mut stats = self.stats.borrow_mut();
            stats.all_reduces += 1;
            stats.collective_bytes += std::mem::size_of_val(data) as u64;
        }
        // Every rank sees every length, so every rank reaches the same verdict
        // and nobody is left inside the data collective alone.
        let meta = self.gather_meta([data.len() as u64, 0]);
        let expected = meta.first().map_or(0, |m| m[0]);
        if let Some((rank, m)) = meta.iter().enumerate().find(|(_, m)| m[0] != expected) {
            return Err(CommError::LengthMismatch {
                op,
                rank,
                len: m[0] as usize,
                expected: expected as usize,
            });
        }
        if c_int::try_from(data.len().saturating_mul(self.size)).is_err() {
            return Err(CommError::Backend(format!(
                "{op}: {} elements × {} ranks exceed the MPI count limit",
                data.len(),
                self.size
            )));
        }
        let root = self.world.process_at_rank(0);
        if self.rank == 0 {
            let mut all = vec![T::default(); data.len() * self.size];
            root.gather_into_root(&data[..], &mut all[..]);
            let contributions: Vec<&[T]> = if data.is_empty() {
                Vec::new()
            } else {
                all.chunks_exact(data.len()).collect()
            };
            fold_sum(data, &contributions);
        } else {
            root.gather_into(&data[..]);
        }
        root.broadcast_into(data);
        Ok(())
    }

    fn all_gather_typed<T>(&self, data: &[T], counts: &[c_int]) -> Vec<Vec<T>>
    where
        T: Equivalence + Copy + Default,
    {
        let mut displs = Vec::with_capacity(counts.len());
        let mut total: c_int = 0;
        for &count in counts {
            displs.push(total);
            total += count;
        }
        let mut all = vec![T::default(); total as usize];
        {
            let mut partition = PartitionMut::new(&mut all[..], counts, &displs[..]);
            self.world.all_gather_varcount_into(data, &mut partition);
        }
        counts
            .iter()
            .zip(&displs)
            .map(|(&count, &displ)| all[displ as usize..(displ + count) as usize].to_vec())
            .collect()
    }
}

fn receive_matched<T: Equivalence + Copy + Default>(
    message: mpi::point_to_point::Message,
    status: &mpi::point_to_point::Status,
) -> Vec<T> {
    // The tag fixes the element type, so the count is exact.
    let count = usize::try_from(status.count(T::equivalent_datatype())).unwrap_or(0);
    let mut values = vec![T::default(); count];
    message.matched_receive_into(&mut values[..]);
    values
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        // Let in-flight sends finish before MPI is finalised; give up after
        // the deadline (their buffers are then leaked rather than freed under
        // MPI's feet).
        let start = Instant::now();
        while !self.pending.borrow().is_empty() && start.elapsed() < self.timeout {
            self.progress();
            std::thread::sleep(Duration::from_micros(50));
        }
        for send in self.pending.borrow_mut().drain(..) {
            std::mem::forget(send);
        }
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&self, peer: usize, tag: u32, data: SendBuf<'_>) -> Result<(), CommError> {
        self.send_checked(peer, tag, data)?;
        self.progress();
        Ok(())
    }

    fn recv(&self, peer: usize, tag: u32, kind: ElemKind) -> Result<Buffer, CommError> {
        self.recv_checked(peer, tag, kind, "recv")
    }

    fn exchange(
        &self,
        sends: &[(usize, SendBuf<'_>)],
        recv_from: &[usize],
        tag: u32,
        kind: ElemKind,
    ) -> Result<Vec<Buffer>, CommError> {
        mpi_tag(tag, kind)?;
        for &(peer, data) in sends {
            self.check_peer(peer)?;
            mpi_tag(tag, data.kind())?;
        }
        for &peer in recv_from {
            self.check_peer(peer)?;
        }
        for &(peer, data) in sends {
            self.send_checked(peer, tag, data)?;
        }
        let received = recv_from
            .iter()
            .map(|&peer| self.recv_checked(peer, tag, kind, "exchange"))
            .collect();
        self.progress();
        received
    }

    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<(), CommError> {
        self.all_reduce_typed("all_reduce_sum_f64", data)
    }

    fn all_reduce_sum_f32(&self, data: &mut [f32]) -> Result<(), CommError> {
        self.all_reduce_typed("all_reduce_sum_f32", data)
    }

    fn all_gather(&self, data: SendBuf<'_>) -> Result<Vec<Buffer>, CommError> {
        {
            let mut stats = self.stats.borrow_mut();
            stats.all_gathers += 1;
            stats.collective_bytes += data.byte_len() as u64;
        }
        let kind = data.kind();
        let meta = self.gather_meta([data.len() as u64, kind_code(kind) as u64]);
        // Identical metadata on every rank ⇒ identical verdicts.
        for (rank, m) in meta.iter().enumerate() {
            if kind_from_code(m[1]) != Some(kind) {
                return Err(CommError::TypeMismatch {
                    op: "all_gather",
                    peer: rank,
                    expected: kind,
                    got: kind_from_code(m[1]).unwrap_or(ElemKind::Bytes),
                });
            }
        }
        let total: u64 = meta.iter().map(|m| m[0]).sum();
        if c_int::try_from(total).is_err() {
            return Err(CommError::Backend(format!(
                "all_gather: {total} elements exceed the MPI count limit"
            )));
        }
        // Each count ≤ total, which fits c_int.
        let counts: Vec<c_int> = meta.iter().map(|m| m[0] as c_int).collect();
        Ok(match data {
            SendBuf::F64(d) => self
                .all_gather_typed(d, &counts)
                .into_iter()
                .map(Buffer::F64)
                .collect(),
            SendBuf::F32(d) => self
                .all_gather_typed(d, &counts)
                .into_iter()
                .map(Buffer::F32)
                .collect(),
            SendBuf::U64(d) => self
                .all_gather_typed(d, &counts)
                .into_iter()
                .map(Buffer::U64)
                .collect(),
            SendBuf::U32(d) => self
                .all_gather_typed(d, &counts)
                .into_iter()
                .map(Buffer::U32)
                .collect(),
            SendBuf::Bytes(d) => self
                .all_gather_typed(d, &counts)
                .into_iter()
                .map(Buffer::Bytes)
                .collect(),
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.stats.borrow_mut().barriers += 1;
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, message: &str) {
        eprintln!("rank {}: {message}", self.rank);
        self.world.abort(1)
    }

    fn stats(&self) -> CommStats {
        *self.stats.borrow()
    }
}
