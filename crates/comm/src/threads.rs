//! Threads backend: every rank is a thread of this process.
//!
//! Each rank owns one mailbox (a queue guarded by a mutex plus a condition
//! variable). A send pushes an owned copy into the destination's mailbox and
//! never blocks, which is why exchange cannot deadlock. A receive scans its own
//! mailbox for the first message from the wanted source on the wanted channel
//! (so per-pair, per-tag order is preserved) and otherwise waits on the
//! condition variable with a deadline, re-checking the world's failure flag on
//! every wake-up. Collectives go through rank 0, which reduces contributions
//! in rank order and hands the single result to everyone; that makes results
//! deterministic and bitwise identical on all ranks.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::{fold_sum, Buffer, CommError, CommStats, Communicator, ElemKind, SendBuf};

/// Work a waiting rank may do for others: returns whether it did any.
pub type IdleWork = Arc<dyn Fn() -> bool + Send + Sync>;

/// How soon a rank with [`ThreadsConfig::idle`] work looks for more after
/// finding none; the interval doubles while it keeps finding none, up to
/// [`IDLE_POLL_MAX`], so that long waits cost little CPU.
const IDLE_POLL: Duration = Duration::from_micros(100);

/// The longest interval between looks for idle work: pieces of another
/// rank's op last a few hundred microseconds, so a rank that looked less
/// often would miss most of them.
const IDLE_POLL_MAX: Duration = Duration::from_micros(400);

/// Configuration of a threads world.
#[derive(Clone)]
pub struct ThreadsConfig {
    /// Deadline of every blocking call (receive, collective, barrier). It must
    /// exceed the longest time one rank may legitimately wait for another
    /// (load imbalance included).
    pub timeout: Duration,
    /// Called by a rank that waits for a message, until it returns `false`
    /// (then the rank waits, looking again after 100 µs, then at doubling
    /// intervals up to 400 µs): lets ranks that are ahead take over pieces of
    /// the work of ranks that are behind.
    pub idle: Option<IdleWork>,
}

impl Default for ThreadsConfig {
    fn default() -> Self {
        ThreadsConfig {
            timeout: crate::DEFAULT_TIMEOUT,
            idle: None,
        }
    }
}

impl fmt::Debug for ThreadsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadsConfig")
            .field("timeout", &self.timeout)
            .field("idle", &self.idle.is_some())
            .finish()
    }
}

/// The first failure of a world: which rank and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRank {
    /// The rank that failed first.
    pub rank: usize,
    /// Its error message (error `Display`, or `panic: <payload>`).
    pub message: String,
}

/// How a rank's function failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The function returned `Err`.
    Error,
    /// The function panicked.
    Panic,
    /// The rank's thread could not be started.
    Spawn,
}

/// Why one rank of [`run_threads`] produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    /// The rank this failure belongs to.
    pub rank: usize,
    /// How it failed.
    pub kind: FailureKind,
    /// Its own error message (for a rank that only saw a peer's failure this
    /// is that `PeerFailed` error's text).
    pub message: String,
    /// The root cause: the first rank of the world that failed and its
    /// message (equal to this rank and message when this rank failed first).
    pub first: FailedRank,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.kind {
            FailureKind::Error => "failed",
            FailureKind::Panic => "panicked",
            FailureKind::Spawn => "could not start",
        };
        write!(f, "rank {} {how}: {}", self.rank, self.message)?;
        if self.first.rank != self.rank {
            write!(
                f,
                " (first failure: rank {}: {})",
                self.first.rank, self.first.message
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for RankFailure {}

/// Which stream a message belongs to: user point-to-point traffic by tag, or
/// the n-th collective (all ranks count collectives identically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    User(u32),
    Collective(u64),
}

#[derive(Debug)]
enum Payload {
    /// One buffer (user message or a collective contribution).
    One(Buffer),
    /// The result of a collective, shared by all ranks without copying.
    Shared(Arc<Vec<Buffer>>),
    /// A collective that the root found inconsistent.
    Failed(CommError),
}

#[derive(Debug)]
struct Envelope {
    src: usize,
    channel: Channel,
    /// Collective name (for mismatch detection); `"p2p"` for user messages.
    op: &'static str,
    payload: Payload,
}

#[derive(Default)]
struct Mailbox {
    queue: Mutex<VecDeque<Envelope>>,
    arrived: Condvar,
}

struct World {
    size: usize,
    timeout: Duration,
    idle: Option<IdleWork>,
    /// Indexed by destination rank.
    mailboxes: Vec<Mailbox>,
    failed: AtomicBool,
    failure: Mutex<Option<FailedRank>>,
    /// Set when a rank's communicator is dropped.
    finished: Vec<AtomicBool>,
}

/// Locks ignoring poisoning: no code here panics while holding a lock, and a
/// poisoned queue is still structurally valid.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    fn failure(&self) -> Option<CommError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.failure)
            .as_ref()
            .map(|failed| CommError::PeerFailed {
                rank: failed.rank,
                message: failed.message.clone(),
            })
    }

    fn first_failure(&self) -> Option<FailedRank> {
        lock(&self.failure).clone()
    }

    /// Records `rank`'s failure unless an earlier one exists, then wakes every
    /// waiting rank. Each mailbox lock is taken before notifying so a waiter
    /// that has just checked the flag cannot miss the wake-up.
    fn fail(&self, rank: usize, message: &str) {
        {
            let mut failure = lock(&self.failure);
            if failure.is_none() {
                *failure = Some(FailedRank {
                    rank,
                    message: message.to_string(),
                });
            }
            self.failed.store(true, Ordering::Release);
        }
        self.wake_all();
    }

    fn finish(&self, rank: usize) {
        if let Some(flag) = self.finished.get(rank) {
            flag.store(true, Ordering::Release);
        }
        self.wake_all();
    }

    fn wake_all(&self) {
        for mailbox in &self.mailboxes {
            let _guard = lock(&mailbox.queue);
            mailbox.arrived.notify_all();
        }
    }

    fn post(&self, dst: usize, envelope: Envelope) {
        let mailbox = &self.mailboxes[dst];
        lock(&mailbox.queue).push_back(envelope);
        mailbox.arrived.notify_all();
    }

    /// Waits until `dst`'s mailbox holds a message from `src` on `channel`
    /// and removes the earliest such message.
    fn take(
        &self,
        dst: usize,
        src: usize,
        channel: Channel,
        op: &'static str,
    ) -> Result<Envelope, CommError> {
        let mailbox = &self.mailboxes[dst];
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut queue = lock(&mailbox.queue);
        let mut poll = IDLE_POLL;
        loop {
            if let Some(error) = self.failure() {
                return Err(error);
            }
            if let Some(pos) = queue
                .iter()
                .position(|e| e.src == src && e.channel == channel)
            {
                if let Some(envelope) = queue.remove(pos) {
                    return Ok(envelope);
                }
            }
            // Checked after the queue: a rank posts all its messages before it
            // is marked finished, so a finished peer with no queued message
            // will never send one.
            if self.finished[src].load(Ordering::Acquire) {
                return Err(CommError::PeerFinished { op, rank: src });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    op,
                    peer: Some(src),
                    waited: now - start,
                });
            }
            let mut wait = deadline - now;
            if let Some(idle) = &self.idle {
                // Help while there is help to give, then look again soon:
                // the work is posted without waking the mailboxes.
                drop(queue);
                let helped = idle();
                queue = lock(&mailbox.queue);
                if helped {
                    poll = IDLE_POLL;
                    continue;
                }
                wait = wait.min(poll);
                poll = (poll * 2).min(IDLE_POLL_MAX);
            }
            queue = mailbox
                .arrived
                .wait_timeout(queue, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[derive(Default)]
struct AtomicStats {
    bytes_sent: AtomicU64,
    messages_sent: AtomicU64,
    bytes_received: AtomicU64,
    messages_received: AtomicU64,
    self_bytes: AtomicU64,
    all_reduces: AtomicU64,
    all_gathers: AtomicU64,
    barriers: AtomicU64,
    collective_bytes: AtomicU64,
}

fn bump(counter: &AtomicU64, by: usize) {
    counter.fetch_add(by as u64, Ordering::Relaxed);
}

/// One rank's handle on a threads world. Dropping it marks the rank finished
/// (peers waiting for its messages then get [`CommError::PeerFinished`]);
/// dropping it while panicking aborts the world first.
pub struct ThreadCommunicator {
    world: Arc<World>,
    rank: usize,
    /// Number of collectives this rank has started; identical sequences on
    /// all ranks pair up the n-th collective everywhere.
    collective_seq: AtomicU64,
    stats: AtomicStats,
}

impl fmt::Debug for ThreadCommunicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.world.size)
            .finish()
    }
}

impl Drop for ThreadCommunicator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.world.fail(
                self.rank,
                "panic: rank dropped its communicator while panicking",
            );
        }
        self.world.finish(self.rank);
    }
}

/// Creates a threads world of `n_ranks` ranks and returns one communicator per
/// rank (index = rank), to be moved onto the ranks' threads. Use
/// [`run_threads`] unless you manage the threads yourself.
pub fn thread_world(
    n_ranks: usize,
    config: ThreadsConfig,
) -> Result<Vec<ThreadCommunicator>, CommError> {
    if n_ranks == 0 {
        return Err(CommError::InvalidPeer { peer: 0, size: 0 });
    }
    let world = Arc::new(World {
        size: n_ranks,
        timeout: config.timeout,
        idle: config.idle,
        mailboxes: (0..n_ranks).map(|_| Mailbox::default()).collect(),
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        finished: (0..n_ranks).map(|_| AtomicBool::new(false)).collect(),
    });
    Ok((0..n_ranks)
        .map(|rank| ThreadCommunicator {
            world: Arc::clone(&world),
            rank,
            collective_seq: AtomicU64::new(0),
            stats: AtomicStats::default(),
        })
        .collect())
}

impl ThreadCommunicator {
    /// The first failure recorded in this world, if any.
    pub fn first_failure(&self) -> Option<FailedRank> {
        self.world.first_failure()
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        if peer < self.world.size {
            Ok(())
        } else {
            Err(CommError::InvalidPeer {
                peer,
                size: self.world.size,
            })
        }
    }

    fn check_alive(&self) -> Result<(), CommError> {
        match self.world.failure() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn post_user(&self, peer: usize, tag: u32, data: SendBuf<'_>) {
        if peer == self.rank {
            bump(&self.stats.self_bytes, data.byte_len());
        } else {
            bump(&self.stats.bytes_sent, data.byte_len());
            bump(&self.stats.messages_sent, 1);
        }
        self.world.post(
            peer,
            Envelope {
                src: self.rank,
                channel: Channel::User(tag),
                op: "p2p",
                payload: Payload::One(data.to_buffer()),
            },
        );
    }

    fn take_user(
        &self,
        peer: usize,
        tag: u32,
        kind: ElemKind,
        op: &'static str,
    ) -> Result<Buffer, CommError> {
        let envelope = self.world.take(self.rank, peer, Channel::User(tag), op)?;
        let buffer = match envelope.payload {
            Payload::One(buffer) => buffer,
            // Only collectives carry other payloads, on their own channels.
            Payload::Shared(_) | Payload::Failed(_) => {
                return Err(CommError::CollectiveMismatch {
                    expected: op,
                    rank: peer,
                    got: envelope.op,
                })
            }
        };
        if buffer.kind() != kind {
            return Err(CommError::TypeMismatch {
                op,
                peer,
                expected: kind,
                got: buffer.kind(),
            });
        }
        if peer != self.rank {
            bump(&self.stats.bytes_received, buffer.byte_len());
            bump(&self.stats.messages_received, 1);
        }
        Ok(buffer)
    }

    /// Runs one collective through rank 0: every rank contributes `data`; rank
    /// 0 collects contributions in rank order, applies `combine` to them and
    /// hands the (shared) result to every rank.
    fn collective(
        &self,
        op: &'static str,
        data: SendBuf<'_>,
        combine: impl FnOnce(&[Buffer]) -> Result<Vec<Buffer>, CommError>,
    ) -> Result<Arc<Vec<Buffer>>, CommError> {
        self.check_alive()?;
        let seq = self.collective_seq.fetch_add(1, Ordering::Relaxed);
        let channel = Channel::Collective(seq);
        let world = &self.world;
        if self.rank != 0 {
            world.post(
                0,
                Envelope {
                    src: self.rank,
                    channel,
                    op,
                    payload: Payload::One(data.to_buffer()),
                },
            );
            let reply = world.take(self.rank, 0, channel, op)?;
            if reply.op != op {
                return Err(CommError::CollectiveMismatch {
                    expected: op,
                    rank: 0,
                    got: reply.op,
                });
            }
            return match reply.payload {
                Payload::Shared(result) => Ok(result),
                Payload::Failed(error) => Err(error),
                Payload::One(_) => Err(CommError::CollectiveMismatch {
                    expected: op,
                    rank: 0,
                    got: "p2p",
                }),
            };
        }

        // Root: receive every contribution before deciding the outcome, so each
        // rank's message is consumed and each rank gets a reply.
        let mut contributions = Vec::with_capacity(world.size);
        contributions.push(data.to_buffer());
        let mut mismatch: Option<CommError> = None;
        for src in 1..world.size {
            let envelope = world.take(0, src, channel, op)?;
            match envelope.payload {
                Payload::One(buffer) if envelope.op == op => contributions.push(buffer),
                _ => {
                    mismatch.get_or_insert(CommError::CollectiveMismatch {
                        expected: op,
                        rank: src,
                        got: envelope.op,
                    });
                }
            }
        }
        let outcome = match mismatch {
            Some(error) => Err(error),
            None => combine(&contributions).map(Arc::new),
        };
        for dst in 1..world.size {
            let payload = match &outcome {
                Ok(result) => Payload::Shared(Arc::clone(result)),
                Err(error) => Payload::Failed(error.clone()),
            };
            world.post(
                dst,
                Envelope {
                    src: 0,
                    channel,
                    op,
                    payload,
                },
            );
        }
        outcome
    }
}

/// Checks that every contribution has `kind` elements and the length of rank
/// 0's, as all-reduce requires.
fn check_uniform(
    op: &'static str,
    contributions: &[Buffer],
    kind: ElemKind,
) -> Result<(), CommError> {
    let expected = contributions.first().map_or(0, Buffer::len);
    for (rank, buffer) in contributions.iter().enumerate() {
        if buffer.kind() != kind {
            return Err(CommError::TypeMismatch {
                op,
                peer: rank,
                expected: kind,
                got: buffer.kind(),
            });
        }
        if buffer.len() != expected {
            return Err(CommError::LengthMismatch {
                op,
                rank,
                len: buffer.len(),
                expected,
            });
        }
    }
    Ok(())
}

macro_rules! all_reduce_impl {
    ($self:ident, $data:ident, $variant:ident, $op:literal) => {{
        bump(&$self.stats.all_reduces, 1);
        bump(
            &$self.stats.collective_bytes,
            SendBuf::$variant($data).byte_len(),
        );
        let len = $data.len();
        let result = $self.collective($op, SendBuf::$variant($data), |contributions| {
            check_uniform($op, contributions, ElemKind::$variant)?;
            let slices: Vec<&[_]> = contributions
                .iter()
                .filter_map(|buffer| match buffer {
                    Buffer::$variant(values) => Some(values.as_slice()),
                    _ => None,
                })
                .collect();
            let mut sum = vec![Default::default(); len];
            fold_sum(&mut sum, &slices);
            Ok(vec![Buffer::$variant(sum)])
        })?;
        match result.first() {
            Some(Buffer::$variant(sum)) if sum.len() == $data.len() => {
                $data.copy_from_slice(sum);
                Ok(())
            }
            Some(other) => Err(CommError::LengthMismatch {
                op: $op,
                rank: $self.rank,
                len: $data.len(),
                expected: other.len(),
            }),
            None => Err(CommError::Backend(concat!($op, ": empty result").into())),
        }
    }};
}

impl Communicator for ThreadCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world.size
    }

    fn send(&self, peer: usize, tag: u32, data: SendBuf<'_>) -> Result<(), CommError> {
        self.check_peer(peer)?;
        self.check_alive()?;
        self.post_user(peer, tag, data);
        Ok(())
    }

    fn recv(&self, peer: usize, tag: u32, kind: ElemKind) -> Result<Buffer, CommError> {
        self.check_peer(peer)?;
        self.take_user(peer, tag, kind, "recv")
    }

    fn exchange(
        &self,
        sends: &[(usize, SendBuf<'_>)],
        recv_from: &[usize],
        tag: u32,
        kind: ElemKind,
    ) -> Result<Vec<Buffer>, CommError> {
        // Validate everything before sending anything, so a bad argument does
        // not leave half an exchange in peers' mailboxes.
        for &(peer, _) in sends {
            self.check_peer(peer)?;
        }
        for &peer in recv_from {
            self.check_peer(peer)?;
        }
        self.check_alive()?;
        for &(peer, data) in sends {
            self.post_user(peer, tag, data);
        }
        recv_from
            .iter()
            .map(|&peer| self.take_user(peer, tag, kind, "exchange"))
            .collect()
    }

    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<(), CommError> {
        all_reduce_impl!(self, data, F64, "all_reduce_sum_f64")
    }

    fn all_reduce_sum_f32(&self, data: &mut [f32]) -> Result<(), CommError> {
        all_reduce_impl!(self, data, F32, "all_reduce_sum_f32")
    }

    fn all_gather(&self, data: SendBuf<'_>) -> Result<Vec<Buffer>, CommError> {
        bump(&self.stats.all_gathers, 1);
        bump(&self.stats.collective_bytes, data.byte_len());
        let kind = data.kind();
        let result = self.collective("all_gather", data, |contributions| {
            for (rank, buffer) in contributions.iter().enumerate() {
                if buffer.kind() != kind {
                    return Err(CommError::TypeMismatch {
                        op: "all_gather",
                        peer: rank,
                        expected: kind,
                        got: buffer.kind(),
                    });
                }
            }
            Ok(contributions.to_vec())
        })?;
        Ok(result.as_ref().clone())
    }

    fn barrier(&self) -> Result<(), CommError> {
        bump(&self.stats.barriers, 1);
        self.collective("barrier", SendBuf::Bytes(&[]), |_| Ok(Vec::new()))?;
        Ok(())
    }

    fn abort(&self, message: &str) {
        self.world.fail(self.rank, message);
    }

    fn stats(&self) -> CommStats {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CommStats {
            bytes_sent: get(&s.bytes_sent),
            messages_sent: get(&s.messages_sent),
            bytes_received: get(&s.bytes_received),
            messages_received: get(&s.messages_received),
            self_bytes: get(&s.self_bytes),
            all_reduces: get(&s.all_reduces),
            all_gathers: get(&s.all_gathers),
            barriers: get(&s.barriers),
            collective_bytes: get(&s.collective_bytes),
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f` on `n_ranks` threads, one per rank, each with its own
/// communicator, and returns the per-rank results (index = rank).
///
/// A rank whose `f` returns `Err` or panics aborts the world with its message
/// (`Display` of the error, or `panic: <payload>`), so every other rank's
/// pending and later calls return [`CommError::PeerFailed`] naming it; no rank
/// waits longer than `config.timeout`. `n_ranks == 0` returns an empty vector.
pub fn run_threads<F, R, E>(
    n_ranks: usize,
    config: ThreadsConfig,
    f: F,
) -> Vec<Result<R, RankFailure>>
where
    F: Fn(&dyn Communicator) -> Result<R, E> + Sync,
    R: Send,
    E: fmt::Display,
{
    let Ok(comms) = thread_world(n_ranks, config) else {
        return Vec::new();
    };
    let Some(world) = comms.first().map(|c| Arc::clone(&c.world)) else {
        return Vec::new();
    };
    let f = &f;
    // Each slot is (kind, message) on failure.
    let outcomes: Vec<Result<R, (FailureKind, String)>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n_ranks);
        for comm in comms {
            let rank = comm.rank;
            let world_for_spawn_failure = Arc::clone(&world);
            let spawned = std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn_scoped(scope, move || {
                    let outcome = catch_unwind(AssertUnwindSafe(|| f(&comm)));
                    let result = match outcome {
                        Ok(Ok(value)) => Ok(value),
                        Ok(Err(error)) => Err((FailureKind::Error, error.to_string())),
                        Err(payload) => Err((
                            FailureKind::Panic,
                            format!("panic: {}", panic_message(payload.as_ref())),
                        )),
                    };
                    // Abort before the communicator is dropped so peers see
                    // the failure rather than "finished".
                    if let Err((_, message)) = &result {
                        comm.abort(message);
                    }
                    drop(comm);
                    result
                });
            match spawned {
                Ok(handle) => handles.push(Ok(handle)),
                Err(error) => {
                    let message = format!("could not start thread: {error}");
                    world_for_spawn_failure.fail(rank, &message);
                    world_for_spawn_failure.finish(rank);
                    handles.push(Err((FailureKind::Spawn, message)));
                }
            }
        }
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => handle.join().unwrap_or_else(|payload| {
                    Err((
                        FailureKind::Panic,
                        format!("panic: {}", panic_message(payload.as_ref())),
                    ))
                }),
                Err(failure) => Err(failure),
            })
            .collect()
    });
    let first = world.first_failure();
    outcomes
        .into_iter()
        .enumerate()
        .map(|(rank, outcome)| {
            outcome.map_err(|(kind, message)| RankFailure {
                rank,
                kind,
                first: first.clone().unwrap_or_else(|| FailedRank {
                    rank,
                    message: message.clone(),
                }),
                message,
            })
        })
        .collect()
}
