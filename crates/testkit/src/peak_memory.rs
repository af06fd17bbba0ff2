//! Peak heap memory of a piece of code, for tests that bound what an
//! operation allocates: a counting global allocator over the system one.
//!
//! A test binary installs it with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;`
//! and measures with [`peak_of`]; measurements hold a lock, so tests running
//! in parallel threads of one binary do not mix.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGE: AtomicUsize = AtomicUsize::new(0);

/// Allocations of at least this many bytes are counted by
/// [`large_allocations`]: above glibc's initial mmap threshold (128 KiB) a
/// block can come fresh from the kernel and be faulted in page by page.
pub const LARGE_ALLOCATION: usize = 128 << 10;
static MEASURE: Mutex<()> = Mutex::new(());

/// The system allocator, counting the live bytes and their peak.
pub struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds `GlobalAlloc`'s contract; the counters are atomics touched after
// (alloc) or after (dealloc) the forwarded call and never affect the memory.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's `layout` obligations are passed on as they are.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
            if layout.size() >= LARGE_ALLOCATION {
                LARGE.fetch_add(1, Ordering::Relaxed);
            }
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`, with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Runs `f` and returns its result with the peak heap memory (bytes) it
/// added above what was live when it started. Meaningful only in a binary
/// whose global allocator is [`CountingAllocator`] (else 0).
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _guard = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

/// Heap bytes live now, all threads. Meaningful only in a binary whose
/// global allocator is [`CountingAllocator`] (else 0).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations of at least [`LARGE_ALLOCATION`] bytes so far, all threads
/// (a reallocation counts as one when its new size is that large).
/// Meaningful only in a binary whose global allocator is
/// [`CountingAllocator`] (else 0).
pub fn large_allocations() -> usize {
    LARGE.load(Ordering::Relaxed)
}
