//! Work sharing between the ranks of one process.
//!
//! A decomposed step lasts as long as its slowest rank, and on a shared
//! machine which rank is slow changes from step to step. An op may split
//! its work into pieces and post them on the [`HelpBoard`] of its rank's
//! world; ranks that wait for a message run posted pieces meanwhile
//! ([`HelpBoard::help`]). What a piece computes must not depend on which
//! thread runs it, so results stay bit-identical whoever helps.
//!
//! Why by hand and not rayon: each rank keeps its own pool (its data stays
//! on its own core, and its ops take their one-thread paths), and only a
//! rank that would otherwise sleep takes work from another.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Pieces of one op, posted by the rank that owns them.
struct PieceJob {
    pieces: usize,
    /// The next piece nobody has claimed.
    next: AtomicUsize,
    /// Pieces run to the end (or whose run panicked).
    done: AtomicUsize,
    panicked: AtomicBool,
    /// The owner's piece function. Its lifetime is erased: the owner does
    /// not return from [`run_pieces`] before `done == pieces`, and a piece is
    /// only run after a claim below `pieces` succeeded, so nobody calls it
    /// after the owner returned.
    run: &'static (dyn Fn(usize) + Sync),
}

impl PieceJob {
    /// Claims and runs one piece; false when none was left.
    fn run_one(&self) -> bool {
        let piece = self.next.fetch_add(1, Ordering::AcqRel);
        if piece >= self.pieces {
            return false;
        }
        if catch_unwind(AssertUnwindSafe(|| (self.run)(piece))).is_err() {
            self.panicked.store(true, Ordering::Release);
        }
        self.done.fetch_add(1, Ordering::AcqRel);
        true
    }
}

/// The pieces open for help in one world of ranks.
#[derive(Default)]
pub struct HelpBoard {
    jobs: Mutex<Vec<Arc<PieceJob>>>,
}

fn lock(jobs: &Mutex<Vec<Arc<PieceJob>>>) -> MutexGuard<'_, Vec<Arc<PieceJob>>> {
    jobs.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HelpBoard {
    /// A board for one world.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Runs one posted piece of another rank (the oldest job first); false
    /// when there was none.
    pub fn help(&self) -> bool {
        let job = {
            let jobs = lock(&self.jobs);
            jobs.iter()
                .find(|j| j.next.load(Ordering::Acquire) < j.pieces)
                .cloned()
        };
        job.is_some_and(|j| j.run_one())
    }
}

thread_local! {
    static BOARD: RefCell<Option<Arc<HelpBoard>>> = const { RefCell::new(None) };
}

/// Runs `f` with `board` as this thread's board: ops called inside post
/// their pieces there.
pub fn with_board<R>(board: Arc<HelpBoard>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<HelpBoard>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            BOARD.with(|b| *b.borrow_mut() = previous);
        }
    }
    let _restore = Restore(BOARD.with(|b| b.borrow_mut().replace(board)));
    f()
}

/// Whether this thread has a board (an op may then split its work into
/// pieces that other ranks can run).
pub fn has_board() -> bool {
    BOARD.with(|b| b.borrow().is_some())
}

/// Runs `f(0)`, …, `f(pieces − 1)`, each once, and returns when all have
/// run. With a board, the pieces are posted on it and other ranks may run
/// some; without, they run here in order.
///
/// Panics (after every piece has ended) if a piece panicked.
pub fn run_pieces(pieces: usize, f: &(dyn Fn(usize) + Sync)) {
    let board = BOARD.with(|b| b.borrow().clone());
    let Some(board) = board.filter(|_| pieces > 1) else {
        (0..pieces).for_each(f);
        return;
    };
    // SAFETY: the reference outlives every call through it: this function
    // returns only once `done == pieces` (below), and `run_one` calls `run`
    // only for a claimed piece below `pieces`, each of which is counted in
    // `done` after its call.
    let run: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let job = Arc::new(PieceJob {
        pieces,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        run,
    });
    lock(&board.jobs).push(Arc::clone(&job));
    while job.run_one() {}
    while job.done.load(Ordering::Acquire) < pieces {
        std::hint::spin_loop();
    }
    lock(&board.jobs).retain(|j| !Arc::ptr_eq(j, &job));
    if job.panicked.load(Ordering::Acquire) {
        panic!("a piece of this rank's work panicked");
    }
}

/// Whether this rank's work may go out in pieces: it runs on a one-thread
/// pool (with more threads, rayon already splits the work) and has a board.
fn can_share() -> bool {
    rayon::current_num_threads() == 1 && has_board()
}

/// Runs `f(0)`, …, `f(pieces − 1)`, each once: as [`run_pieces`] on a
/// one-thread pool with a board (ranks that wait may run some), otherwise
/// over the calling thread's rayon pool.
pub fn run_pieces_or_par(pieces: usize, f: &(dyn Fn(usize) + Sync)) {
    if can_share() {
        run_pieces(pieces, f);
    } else {
        use rayon::prelude::*;
        (0..pieces).into_par_iter().for_each(f);
    }
}

/// Elements of output (or of work, for scatters) per piece of a row-wise
/// op: a few hundred microseconds, long against the cost of posting and
/// claiming a piece, short against an op.
const PIECE_ELEMENTS: usize = 1 << 17;

/// At most this many pieces per op.
const MAX_PIECES: usize = 64;

/// How many pieces a row-wise op over `work` elements posts: more than one
/// only on a one-thread pool with a board (ranks that can help each
/// other), and then a function of `work` alone.
pub(crate) fn pieces_for(work: usize) -> usize {
    if can_share() {
        (work / PIECE_ELEMENTS).clamp(1, MAX_PIECES)
    } else {
        1
    }
}

/// Runs `f(start, part)` over `pieces` consecutive parts of `out` that
/// together cover it, `start` being the part's first element; every part
/// but the last holds a multiple of `align` elements (whole rows), and any
/// rank's thread may run it ([`run_pieces`]). `f` must compute each
/// element the same way whatever part holds it, so that the result does
/// not depend on the split.
pub(crate) fn run_parts<T: Send>(
    out: &mut [T],
    align: usize,
    pieces: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let align = align.max(1);
    let units = out.len() / align;
    let pieces = pieces.clamp(1, units.max(1));
    if pieces == 1 {
        f(0, out);
        return;
    }
    let mut parts = Vec::with_capacity(pieces);
    let (mut rest, mut start) = (out, 0);
    for p in 1..=pieces {
        let end = if p == pieces {
            start + rest.len()
        } else {
            p * units / pieces * align
        };
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(end - start);
        parts.push(Mutex::new(Some((start, part))));
        (rest, start) = (tail, end);
    }
    run_pieces(pieces, &|p| {
        let part = parts[p]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((start, part)) = part {
            f(start, part);
        }
    });
}

/// [`run_parts`] over whole rows of `cols` elements: `f(row, values)` for
/// every row of `out`, each computed the same way whatever part holds it.
pub(crate) fn run_row_parts<T: Send>(
    out: &mut [T],
    cols: usize,
    pieces: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if cols == 0 {
        return;
    }
    run_parts(out, cols, pieces, &|start, part| {
        let first = start / cols;
        for (r, row) in part.chunks_mut(cols).enumerate() {
            f(first + r, row);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_piece_runs_once_with_or_without_helpers() {
        let counts: Vec<AtomicU64> = (0..1000).map(|_| AtomicU64::new(0)).collect();
        let work = |p: usize| {
            counts[p].fetch_add(1, Ordering::Relaxed);
        };
        run_pieces(counts.len(), &work);
        assert!(counts.iter().all(|c| c.swap(0, Ordering::Relaxed) == 1));

        let board = HelpBoard::new();
        let stop = AtomicBool::new(false);
        let helped = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    while !stop.load(Ordering::Acquire) {
                        if board.help() {
                            helped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            let slow = |p: usize| {
                std::thread::sleep(std::time::Duration::from_micros(50));
                work(p);
            };
            with_board(Arc::clone(&board), || {
                assert!(has_board());
                run_pieces(counts.len(), &slow)
            });
            assert!(!has_board());
            stop.store(true, Ordering::Release);
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        assert!(helped.load(Ordering::Relaxed) > 0, "no helper ran a piece");
        assert!(lock(&board.jobs).is_empty());
    }
}
